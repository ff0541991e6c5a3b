"""The plan's per-layer activation memory against the bytes a layer really keeps for backward.

One train step on CPU with a saved-tensors hook: every tensor autograd keeps during the forward
pass (up to the loss, so before backward starts), counted once per storage and leaving out the
parameters. A model of one layer more minus the model without it is one layer's share; each
family and recompute mode is measured at two token counts, so a constant that happened to fit
one count would not pass. The plan's term (rlpost.plan.memory) must be within 10%.

On GPUs the attention runs torch's varlen flash kernel where it applies, which keeps other
tensors (kernels.varlen_applies, plan.memory.varlen_attention). That kernel has no CPU
implementation, so for its test the op gets one here (each sample's causal attention, forward
and backward, in a forked rank only): what is kept for backward is decided by torch's own
autograd registration of the op, which runs unchanged inside the real layer.

Not covered here: multi-latent attention, whose query and value head sizes differ, so torch's
CPU SDPA falls back to its math kernel and keeps the attention matrix, which the flash and
memory-efficient kernels on a GPU do not.
"""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import Qwen3ForCausalLM

from rlpost import switches
from rlpost.algo.packing import padded_rows
from rlpost.backends.megatron import kernels
from rlpost.backends.megatron.batches import build_micro_batch
from rlpost.backends.megatron.trainer import MegatronTrainer
from rlpost.plan.layout import PADDED_ROWS_LIMIT
from rlpost.plan.memory import layer_activation_bytes, layer_input_bytes
from rlpost.schema import ModelConfig
from rlpost.types import TrainSample

from . import tiny_checkpoints as tiny
from .conftest import Setup, configs, layout, run_world

SAMPLES = 4


def wide_qwen3(path: Path, *, layers: int) -> ModelConfig:
    """Qwen3 whose attention is twice the hidden size wide (as Qwen3-0.6B's is)."""
    hf = {"num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 96,
          "rope_theta": 1000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True}  # fmt: skip
    return tiny._build(path, Qwen3ForCausalLM, layers, 0, hf, family="qwen3",
                       num_query_groups=2, kv_channels=32, ffn_hidden_size=96,
                       rotary_base=1000.0, norm_epsilon=1e-6, qk_layernorm=True,
                       tie_word_embeddings=True)  # fmt: skip


FAMILIES: dict[str, tuple[Callable[..., ModelConfig], int]] = {
    # builder, layers of the smaller model (its extra layer is the one measured)
    "qwen3": (wide_qwen3, 1),
    "glm4": (tiny.glm4, 1),
    "glm4_moe": (tiny.glm4_moe, 1),  # the first layer is dense, the measured one MoE
}


def kept_for_backward(trainer: MegatronTrainer, samples: list[TrainSample]) -> int:
    parameters = {p.untyped_storage().data_ptr() for p in trainer.model.parameters()}
    seen: dict[int, int] = {}
    forward = {"done": False}
    loss = trainer._train_loss

    def loss_marks_the_end(*args: Any, **kwargs: Any) -> Any:
        forward["done"] = True
        return loss(*args, **kwargs)

    trainer._train_loss = loss_marks_the_end  # type: ignore[method-assign]

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if not forward["done"] and storage.data_ptr() not in parameters:
            seen.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        metrics = trainer.train_step(samples)
    assert metrics["train/micro_batches"] == 1
    return sum(seen.values())


EQUAL = ((32,) * SAMPLES, (96,) * SAMPLES)  # two token counts, samples of one length
RAGGED = (40, 32, 32, 24)  # one padded group of 4 x 40 rows for 128 tokens: 1.25 a token


def samples_of(lengths: tuple[int, ...]) -> list[TrainSample]:
    rng = random.Random(sum(lengths))
    return [TrainSample([rng.randrange(2, tiny.VOCAB) for _ in range(length)], length // 2,
                        rng.choice([-1.0, 1.0])) for length in lengths]  # fmt: skip


def one_layer_kept(
    family: str,
    recompute: str,
    tmp_path: Path,
    measure: Callable[..., int],
    micro_batches: tuple[tuple[int, ...], ...] = EQUAL,
) -> Iterator[tuple[int, int, Any, Any]]:
    """Per micro-batch (its samples' lengths): the tokens, one layer's bytes kept for
    backward as `measure` counts them (a model of one layer more minus the model without it),
    and the larger model and the layout the plan is asked about."""
    build, base = FAMILIES[family]
    models = {n: build(tmp_path / f"layers{n}", layers=n) for n in (base, base + 1)}
    for lengths in micro_batches:
        tokens = sum(lengths)
        kept = {}
        for n, model in models.items():
            setup = Setup(model, configs(len(lengths), train={"max_tokens_per_gpu": tokens}),
                          layout(recompute=recompute))  # fmt: skip
            kept[n] = setup.run(measure, samples_of(lengths))
        yield tokens, kept[base + 1] - kept[base], models[base + 1], layout(recompute=recompute)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_plan_counts_what_a_layer_keeps_for_backward(
    family: str, recompute: str, tmp_path: Path
) -> None:
    base = FAMILIES[family][1]
    for tokens, measured, model, par in one_layer_kept(
        family, recompute, tmp_path, kept_for_backward
    ):
        if recompute == "full":
            planned = layer_input_bytes(model, tokens, par)
        else:  # samples of one length: no padding
            planned = layer_activation_bytes(model, base, tokens, par, recompute, padded_rows=1.0)
        assert 0.9 <= measured / planned <= 1.1, (family, recompute, tokens, measured, planned)


@pytest.mark.parametrize("family", ["qwen3", "glm4"])
def test_plan_counts_the_padded_attention_of_samples_of_different_lengths(
    family: str, tmp_path: Path
) -> None:
    """The padded attention pads each group of samples to its longest: the plan's term at the
    micro-batch's padded rows, which its default (PADDED_ROWS_LIMIT) bounds."""
    base = FAMILIES[family][1]
    rows = padded_rows(RAGGED) / sum(RAGGED)
    assert rows == PADDED_ROWS_LIMIT
    [(tokens, measured, model, par)] = one_layer_kept(
        family, "none", tmp_path, kept_for_backward, (RAGGED,)
    )
    planned = layer_activation_bytes(model, base, tokens, par, "none", padded_rows=rows)
    unpadded = layer_activation_bytes(model, base, tokens, par, "none", padded_rows=1.0)
    assert 0.97 <= measured / planned <= 1.03, (family, measured, planned)
    assert measured / unpadded > 1.03, (family, measured, unpadded)  # the padding is counted


def _causal_per_sample(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, scale: float
) -> list[tuple[slice, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per sample: its rows, q and the GQA-expanded k and v as [h, n, d], and the scaled
    scores with the future masked, [h, n, n]."""
    group = q.shape[1] // k.shape[1]
    out = []
    for start, end in itertools.pairwise(cu.tolist()):
        rows = slice(start, end)
        qs, ks, vs = (t[rows].transpose(0, 1) for t in (q, k, v))
        ks, vs = ks.repeat_interleave(group, 0), vs.repeat_interleave(group, 0)
        scores = (qs @ ks.transpose(-1, -2)) * scale
        future = torch.ones(end - start, end - start, dtype=torch.bool).triu(1)
        out.append((rows, qs, ks, vs, scores.masked_fill(future, float("-inf"))))
    return out


def _varlen_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    is_causal: bool = False,
    scale: float | None = None,
    *rest: Any,
) -> tuple[torch.Tensor, ...]:
    """torch_attn::_varlen_attn: (output, float32 log-sum-exp [heads, t], RNG state)."""
    assert is_causal and scale is not None
    out, lse = torch.empty_like(q), torch.empty(q.shape[1], q.shape[0])
    for rows, _, _, vs, scores in _causal_per_sample(q, k, v, cu_q, scale):
        lse[:, rows] = torch.logsumexp(scores.float(), -1)
        out[rows] = (scores.softmax(-1) @ vs).transpose(0, 1)
    return out, lse, torch.zeros(2, dtype=torch.uint64)


def _varlen_backward(
    grad: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    is_causal: bool,
    rng: torch.Tensor,
    scale: float | None = None,
    *rest: Any,
) -> tuple[torch.Tensor, ...]:
    """torch_attn::_varlen_attn_backward: the q, k, v gradients (GQA: k and v summed over each
    group's query heads)."""
    assert scale is not None
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    group = q.shape[1] // k.shape[1]
    for rows, qs, ks, vs, scores in _causal_per_sample(q, k, v, cu_q, scale):
        p, g = scores.softmax(-1), grad[rows].transpose(0, 1)
        dp = g @ vs.transpose(-1, -2)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True)) * scale
        dq[rows] = (ds @ ks).transpose(0, 1)
        heads = (-1, group, *ks.shape[1:])
        dk[rows] = (ds.transpose(-1, -2) @ qs).view(heads).sum(1).transpose(0, 1)
        dv[rows] = (p.transpose(-1, -2) @ g).view(heads).sum(1).transpose(0, 1)
    return dq, dk, dv


def use_cpu_varlen() -> None:
    """Give torch's varlen op the CPU kernel above and send PackedAttention to it, in this
    process only: a forked rank (the pytest process is left as it was)."""
    torch.library.register_kernel("torch_attn::_varlen_attn", "cpu", _varlen_forward)
    torch.library.register_kernel("torch_attn::_varlen_attn_backward", "cpu", _varlen_backward)
    kernels.varlen_applies = lambda q, k, v, index, dropout_p: index.cu_seqlens is not None
    # the varlen kernel itself, not the padded path where it measures faster (this slow CPU
    # kernel loses to it)
    os.environ[switches.PACKED_ATTENTION.name] = "varlen"


def kept_with_varlen(trainer: MegatronTrainer, samples: list[TrainSample]) -> int:
    use_cpu_varlen()
    return kept_for_backward(trainer, samples)


def varlen_against_padded(rank: int, world: int, port: int) -> float:
    """The largest difference between the varlen op (CPU kernel) and the padded path, in the
    output and the q, k, v gradients, for ragged samples with GQA."""
    use_cpu_varlen()
    samples = samples_of((9, 3, 17))
    index = build_micro_batch(samples, [0, 1, 2]).packed.attention
    assert index is not None and index.cu_seqlens is not None
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(29, h, 8, generator=gen, dtype=torch.float64) for h in (4, 2, 2)]
    results = []
    for attention in (kernels.varlen_attention, kernels.padded_attention):
        leaves = [t.clone().requires_grad_() for t in inputs]
        out = attention(*leaves, index, scale=0.3)
        out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out))
        results.append([out.detach(), *(t.grad for t in leaves)])
    return max(float((x - y).abs().max()) for x, y in zip(*results, strict=True))


def test_cpu_varlen_op_is_causal_attention_per_sample() -> None:
    """The CPU kernel the varlen test gives torch's op computes what the padded path does."""
    assert run_world(varlen_against_padded, 1)[0] < 1e-10


@pytest.mark.parametrize("recompute", ["none", "selective"])
@pytest.mark.parametrize("family", ["qwen3", "glm4"])
def test_plan_counts_what_a_layer_keeps_with_the_varlen_kernel(
    family: str, recompute: str, tmp_path: Path
) -> None:
    """With QK-norm (Qwen3) the varlen kernel keeps a + g elements per token fewer than the
    padded path, without it (GLM-4) g more; selective recompute keeps the same either way."""
    base = FAMILIES[family][1]
    for tokens, measured, model, par in one_layer_kept(
        family, recompute, tmp_path, kept_with_varlen
    ):
        planned = layer_activation_bytes(model, base, tokens, par, recompute, varlen=True)
        assert 0.99 <= measured / planned <= 1.01, (family, recompute, tokens, measured, planned)
