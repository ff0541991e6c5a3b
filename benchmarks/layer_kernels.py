"""The megatron trainer's elementwise kernels, one by one, at a model's shapes: forward and
backward of each, eagerly and through torch.compile (rlpost.backends.compiled), beside the
layer's matmuls and attention: the varlen kernel (CUDA; else the padded path), the padded path
(gather, SDPA, scatter; cuDNN's attention first on Hopper) and SDPA alone on contiguous
[samples, heads, 4096, d] tensors, in SDPA's own order and with cuDNN first. The torch
trainer's transformers layers run the same RoPE and SwiGLU arithmetic on CUDA
(rlpost.backends.torch_trainer.kernels); indented rows time what transformers computes for
them itself, and the two-projection SwiGLU those layers call.

    python benchmarks/layer_kernels.py --size 0.6b          # on a CUDA GPU
    python benchmarks/layer_kernels.py --size tiny          # anywhere (CPU: eager only)

RMSNorm runs torch's fused ops where this torch has them; its first two rows are the path
without them (RLPOST_FUSED_RMS_NORM=0), eager and compiled, the indented rows the fused ops.
Per kernel: milliseconds per call (--inner calls back to back between synchronisations, as
the host runs ahead of the GPU in a step; the median of --repeats, after a warm-up), calls per
optimizer step (per layer x layers x micro-batches, for the shapes of
benchmarks/megatron_train.py: 32 samples x 4096 tokens in micro-batches of --tokens), and
milliseconds per step, for the eager function and the compiled one. Calls counted per step are
one forward and one backward (no recompute). The total counts the varlen kernel's attention,
not the padded path or SDPA alone.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformers.models.qwen3 import modeling_qwen3

from rlpost.backends import compiled, rope, sdpa, swiglu
from rlpost.backends import logprobs as logprobs_module
from rlpost.backends import rms_norm as rms_norm_module
from rlpost.backends.logprobs import linear_logprobs
from rlpost.backends.megatron import kernels
from rlpost.backends.megatron.packed import attention_index
from rlpost.backends.rms_norm import rms_norm
from rlpost.config.loader import compose_run_config

MODELS = {"tiny": "qwen3-tiny", "0.6b": "qwen3-0.6b", "1.7b": "qwen3-1.7b", "4b": "qwen3-4b"}


@dataclass(frozen=True)
class Shape:
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    vocab: int
    rotary_base: float
    eps: float

    @classmethod
    def of(cls, size: str) -> Shape:
        """The shape of conf/model/<MODELS[size]>.yaml."""
        m = compose_run_config([f"model={MODELS[size]}"])[0].model
        heads, groups = m.num_attention_heads, m.num_query_groups
        return cls(m.hidden_size, m.ffn_hidden_size, heads, groups, m.head_dim, m.num_layers,
                   m.vocab_size, m.rotary_base, m.norm_epsilon)  # fmt: skip


STEP_TOKENS = 32 * 4096


def timed(run: Callable[[], object], repeats: int, on_gpu: bool, inner: int) -> float:
    """Milliseconds per run(): the median over `repeats` of `inner` calls back to back between
    two synchronisations (the host runs ahead of the GPU, as in a train step), after two
    warm-up calls (the first compiles)."""
    for _ in range(2):
        run()
    times = []
    for _ in range(repeats):
        if on_gpu:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(inner):
            run()
        if on_gpu:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3 / inner)
    return statistics.median(times)


@contextlib.contextmanager
def unfused_rms_norm() -> Iterator[None]:
    """rms_norm without torch's fused ops (what RLPOST_FUSED_RMS_NORM=0 runs)."""
    before = rms_norm_module.FUSED_RMS_NORM_DEVICES
    rms_norm_module.FUSED_RMS_NORM_DEVICES = frozenset()
    try:
        yield
    finally:
        rms_norm_module.FUSED_RMS_NORM_DEVICES = before


def forward_backward(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> Callable[[], None]:
    """A closure running fn forward and backward with a fixed upstream gradient."""
    leaves = [x.detach().requires_grad_(x.is_floating_point()) for x in inputs]
    upstream: list[torch.Tensor] = []

    def run() -> None:
        out = fn(*leaves)
        if not upstream:
            upstream.append(torch.randn_like(out))
        torch.autograd.backward(out, upstream[0])
        for leaf in leaves:
            leaf.grad = None

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="0.6b", choices=sorted(MODELS))
    parser.add_argument("--tokens", type=int, default=16384, help="tokens per micro-batch")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--inner", type=int, default=10, help="calls between synchronisations")
    args = parser.parse_args()
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda" if on_gpu else "cpu")
    dtype = torch.bfloat16 if on_gpu else torch.float32
    s, t = Shape.of(args.size), args.tokens if on_gpu or args.size != "tiny" else 512
    micro_batches = max(1, STEP_TOKENS // t)
    per_layer_step = s.layers * micro_batches

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=dtype)

    positions = torch.arange(t, device=device) % 4096
    table = kernels.rope_table(
        positions, kernels.inverse_frequencies(s.head_dim, 1.0, s.rotary_base), False, dtype
    )
    weight = 1 + 0.1 * rand(s.hidden)
    head_weight = 1 + 0.1 * rand(s.head_dim)
    out_weight = rand(s.vocab, s.hidden) * 0.02
    targets = torch.randint(0, s.vocab, (t,), device=device)
    q_width, kv_width = s.heads * s.head_dim, s.kv_heads * s.head_dim

    seq = min(t, 4096)  # samples of the benchmark's length, as many as fill the micro-batch
    lengths = [seq] * (t // seq)
    index = attention_index(lengths, [[list(range(n)) for n in lengths]], 0).to(device)
    scale = s.head_dim**-0.5

    def packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, varlen: bool) -> torch.Tensor:
        """The step's attention over the packed samples: the varlen kernel where it applies
        (CUDA, bf16), else, or with varlen=False, the padded path (gather, SDPA, scatter)."""
        if varlen and kernels.varlen_applies(q, k, v, index, 0.0):
            return kernels.varlen_attention(q, k, v, index, scale=scale)
        return kernels.padded_attention(q, k, v, index, scale=scale)

    def sdpa_cudnn_first(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """SDPA alone with cuDNN's attention tried first (what the padded path asks for on
        Hopper, sdpa.CUDNN_FIRST_CAPABILITIES; SDPA's own order elsewhere)."""
        from torch.nn.attention import sdpa_kernel

        preference = sdpa.sdpa_preference()
        with sdpa_kernel(preference, set_priority=True) if preference else contextlib.nullcontext():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    hf_table = (table.cos.transpose(0, 1), table.sin.transpose(0, 1))  # [1, t, d]

    def hf_rope(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """transformers' own rotary function (Qwen3's) on [1, heads, t, d], q and k."""
        q2, k2 = modeling_qwen3.apply_rotary_pos_emb(q, k, *hf_table)
        return torch.cat((q2, k2), dim=1)

    def norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        with unfused_rms_norm():
            return rms_norm(x, w, s.eps)

    # name, calls per step, run, compiled (else the same run twice); the "torch fused ops" rows
    # are the alternative to the two rms_norm rows above them, not counted in the totals
    rows: list[tuple[str, int, Callable[[], None], bool]] = [
        ("rms_norm [t, h]", 2 * per_layer_step,
         forward_backward(norm, rand(t, s.hidden), weight), True),
        ("rms_norm q+k heads", 2 * per_layer_step,
         forward_backward(norm, rand(t, s.heads, s.head_dim), head_weight), True),
        ("  [t, h], torch fused ops", 2 * per_layer_step,
         forward_backward(lambda x, w: rms_norm(x, w, s.eps), rand(t, s.hidden), weight), False),
        ("  heads, torch fused ops", 2 * per_layer_step,
         forward_backward(lambda x, w: rms_norm(x, w, s.eps), rand(t, s.heads, s.head_dim),
                          head_weight), False),
        ("rope q", per_layer_step,
         forward_backward(lambda x: kernels.apply_rope(x, table, False),
                          rand(t, s.heads, s.head_dim)), True),
        ("rope k", per_layer_step,
         forward_backward(lambda x: kernels.apply_rope(x, table, False),
                          rand(t, s.kv_heads, s.head_dim)), True),
        ("  rope q+k, transformers' eager", per_layer_step,
         forward_backward(hf_rope, rand(1, s.heads, t, s.head_dim),
                          rand(1, s.kv_heads, t, s.head_dim)), False),
        ("swiglu", per_layer_step, forward_backward(kernels.swiglu, rand(t, 2 * s.ffn)), True),
        ("  swiglu, two projections", per_layer_step,
         forward_backward(swiglu.swiglu_pair, rand(t, s.ffn), rand(t, s.ffn)), True),
        ("  swiglu, transformers' eager", per_layer_step,
         forward_backward(lambda g, u: F.silu(g) * u, rand(t, s.ffn), rand(t, s.ffn)), False),
        ("logprobs (output layer)", micro_batches,
         forward_backward(lambda h, w: linear_logprobs(h, w, targets, s.vocab).logp,
                          rand(t, s.hidden), out_weight), True),
        ("matmuls qkv, o, fc1, fc2", per_layer_step,
         forward_backward(
             lambda x, wqkv, wo, w1, w2: F.linear(
                 F.linear(F.linear(x, wqkv)[:, :q_width], wo) + x, w1
             )[:, : s.ffn] @ w2.t(),
             rand(t, s.hidden), rand(q_width + 2 * kv_width, s.hidden),
             rand(s.hidden, q_width), rand(2 * s.ffn, s.hidden), rand(s.hidden, s.ffn)), False),
        ("attention varlen kernel", per_layer_step,
         forward_backward(lambda q, k, v: packed(q, k, v, True), rand(t, s.heads, s.head_dim),
                          rand(t, s.kv_heads, s.head_dim), rand(t, s.kv_heads, s.head_dim)),
         False),
        ("attention padded path", per_layer_step,
         forward_backward(lambda q, k, v: packed(q, k, v, False), rand(t, s.heads, s.head_dim),
                          rand(t, s.kv_heads, s.head_dim), rand(t, s.kv_heads, s.head_dim)),
         False),
        ("attention (SDPA, causal, 4096)", per_layer_step,
         forward_backward(
             lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                            enable_gqa=True),
             rand(t // 4096 or 1, s.heads, min(t, 4096), s.head_dim),
             rand(t // 4096 or 1, s.kv_heads, min(t, 4096), s.head_dim),
             rand(t // 4096 or 1, s.kv_heads, min(t, 4096), s.head_dim)), False),
        ("  SDPA alone, cuDNN first", per_layer_step,
         forward_backward(
             sdpa_cudnn_first,
             rand(t // 4096 or 1, s.heads, min(t, 4096), s.head_dim),
             rand(t // 4096 or 1, s.kv_heads, min(t, 4096), s.head_dim),
             rand(t // 4096 or 1, s.kv_heads, min(t, 4096), s.head_dim)), False),
    ]  # fmt: skip
    print(f"{args.size}: {t} tokens a micro-batch, {micro_batches} a step of {STEP_TOKENS} "
          f"tokens, {s.layers} layers, {dtype} on {device.type}; compile on "
          f"{sorted(compiled.compile_devices()) or 'no device'}")  # fmt: skip
    print(f"{'kernel (forward + backward)':32} {'calls/step':>10} {'eager ms':>9} "
          f"{'compiled':>9} {'eager ms/step':>14} {'compiled':>9}")  # fmt: skip
    totals = [0.0, 0.0]
    for name, calls, run, compilable in rows:
        with compiled.eager():
            eager_ms = timed(run, args.repeats, on_gpu, args.inner)
        fast_ms = timed(run, args.repeats, on_gpu, args.inner) if compilable else eager_ms
        if not name.startswith(" ") and not name.startswith("attention ("):
            totals[0] += eager_ms * calls
            totals[1] += fast_ms * calls
        print(f"{name:32} {calls:>10} {eager_ms:>9.3f} {fast_ms:>9.3f} "
              f"{eager_ms * calls:>14.1f} {fast_ms * calls:>9.1f}")  # fmt: skip
    modules = (rope, swiglu, rms_norm_module, logprobs_module)
    failed = [f.fn.__qualname__ for m in modules for f in compiled.compiled_functions(m)
              if f.failed is not None]  # fmt: skip
    print(f"{'total (rms_norm unfused)':32} {'':>10} {'':>9} {'':>9} {totals[0]:>14.1f} "
          f"{totals[1]:>9.1f}")  # fmt: skip
    fused = "yes" if "cuda" in rms_norm_module.FUSED_RMS_NORM_DEVICES else "no"
    print(f"torch's fused RMSNorm ops on this device (the trainers' default where present): "
          f"{fused if on_gpu else 'no'}")  # fmt: skip
    print(f"compile failures: {', '.join(failed) or 'none'}")


if __name__ == "__main__":
    main()
