"""transformers' layers on rlpost's kernels, as the torch trainer runs them on CUDA: which
modules each architecture routes, outputs and gradients against transformers' own, the
rotary function left as it was for anything but a packed row on a kernel device, and the
trainer's steps unchanged. The kernels' CUDA paths are torch.compile's (test_compiled.py
checks their graphs); here the eager arithmetic runs, on CPU (`kernels_on_cpu`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import (
    GemmaConfig,
    GemmaForCausalLM,
    Glm4Config,
    Glm4ForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)
from transformers.models.qwen3 import modeling_qwen3

from rlpost.backends.torch_trainer import TorchTrainer, kernels
from rlpost.backends.torch_trainer.forward import forward_tokens, pack_samples
from rlpost.backends.torch_trainer.model_io import load_causal_lm
from rlpost.schema import AlgoConfig, OptimConfig, TrainConfig
from rlpost.types import TrainSample

from .test_activation_memory import kernels_on_cpu, rotary_put_back

SHAPE: dict[str, Any] = {
    "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
    "max_position_embeddings": 256,
}  # fmt: skip
# architecture: (model, config, MLPs routed, rotary function replaced, norms routed)
ARCHITECTURES: dict[str, tuple[Any, Any, int, int, int]] = {
    "qwen3": (Qwen3ForCausalLM, Qwen3Config, 2, 1, 2 * 4 + 1),  # QK-norm
    "mistral": (MistralForCausalLM, MistralConfig, 2, 1, 2 * 2 + 1),
    "phi3": (Phi3ForCausalLM, Phi3Config, 2, 1, 2 * 2 + 1),  # merged gate_up_proj
    "glm4": (Glm4ForCausalLM, Glm4Config, 2, 0, 2 * 4 + 1),  # merged; interleaved rotary
    "gemma": (GemmaForCausalLM, GemmaConfig, 0, 1, 0),  # GeGLU, 1 + weight norms
}


def build(arch: str, path: Path) -> Path:
    model_class, config_class, *_ = ARCHITECTURES[arch]
    config = config_class(**SHAPE, pad_token_id=0)
    torch.manual_seed(0)
    model_class(config).save_pretrained(path)
    return path


def samples(seed: int = 0) -> list[TrainSample]:
    rng = torch.Generator().manual_seed(seed)
    out = []
    for length, response in ((9, 4), (14, 6), (6, 2)):
        tokens = torch.randint(2, 64, (length,), generator=rng).tolist()
        out.append(TrainSample(tokens, response, 1.0))
    return out


def logp_and_grads(model: torch.nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    batch = pack_samples(samples()).to(next(model.parameters()).device)
    logp = forward_tokens(model, batch, 0.8).logp  # type: ignore[arg-type]
    (logp * torch.linspace(-1.0, 1.0, logp.numel())).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), grads


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_each_architecture_routes_its_standard_modules_and_computes_the_same(
    arch: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = build(arch, tmp_path / arch)
    model = load_causal_lm(path)
    keys = list(model.state_dict())
    want_logp, want_grads = logp_and_grads(model)
    kernels_on_cpu(monkeypatch)
    _, _, mlps, rotary, norms = ARCHITECTURES[arch]
    assert kernels.fuse_kernels(model, "cpu") == kernels.Fused(norms, mlps, rotary)
    assert list(model.state_dict()) == keys
    logp, grads = logp_and_grads(model)
    assert torch.allclose(logp, want_logp, rtol=1e-5, atol=1e-5)
    assert grads.keys() == want_grads.keys()
    for name, grad in grads.items():
        assert torch.allclose(grad, want_grads[name], rtol=1e-4, atol=1e-6), name


def test_nothing_is_routed_for_a_device_without_the_kernels(tmp_path: Path) -> None:
    model = load_causal_lm(build("qwen3", tmp_path / "qwen3"))
    assert kernels.fuse_kernels(model, "cpu") == kernels.Fused(0, 0, 0)
    assert not any("forward" in vars(m) for m in model.modules())
    assert not hasattr(modeling_qwen3.apply_rotary_pos_emb, kernels.ORIGINAL_ATTR)


def test_the_rotary_function_runs_transformers_own_outside_packed_rows_on_kernel_devices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = modeling_qwen3.apply_rotary_pos_emb
    kernels_on_cpu(monkeypatch)
    assert kernels.fuse_rotary(load_causal_lm(build("qwen3", tmp_path / "qwen3"))) == 1
    replaced = modeling_qwen3.apply_rotary_pos_emb
    assert getattr(replaced, kernels.ORIGINAL_ATTR) is original
    calls: list[str] = []
    monkeypatch.setattr(kernels.rope, "rope", lambda *a: calls.append("ours") or a[0])
    q, k = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8)
    cos, sin = torch.randn(1, 5, 8), torch.randn(1, 5, 8)
    replaced(q, k, cos, sin)
    assert calls == ["ours", "ours"]
    batched = (torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8), cos.expand(2, 5, 8), sin)
    other_dtype = (q, k, cos.double(), sin.double())
    for args in (batched, other_dtype):  # transformers' own function computes these
        calls.clear()
        assert not kernels.packed_rotary_applies(*args, 1)
        for got, want in zip(replaced(*args), original(*args), strict=True):
            assert torch.equal(got, want)
        assert calls == []
    assert not kernels.packed_rotary_applies(q, k, cos[..., :4], sin[..., :4], 1)  # partial
    monkeypatch.setattr(kernels, "KERNEL_DEVICES", frozenset({"cuda"}))
    assert not kernels.packed_rotary_applies(q, k, cos, sin, 1)  # a CPU tensor


Samples = Callable[..., list[TrainSample]]
Configs = Callable[..., tuple[AlgoConfig, OptimConfig, TrainConfig]]


def test_the_trainer_on_the_kernels_steps_as_it_does_without(
    tiny_model_dir: Path,
    make_samples: Samples,
    make_configs: Configs,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batch = make_samples(4, seed=3)
    plain = TorchTrainer(tiny_model_dir, *make_configs(4), num_threads=1)
    expected = [plain.train_step(batch) for _ in range(2)]
    kernels_on_cpu(monkeypatch)
    fused = TorchTrainer(tiny_model_dir, *make_configs(4), num_threads=1)  # the same group
    routed = [m for m in fused.model.modules() if "forward" in vars(m)]
    assert {type(m).__name__ for m in routed} == {"Qwen3RMSNorm", "Qwen3MLP"}
    assert hasattr(modeling_qwen3.apply_rotary_pos_emb, kernels.ORIGINAL_ATTR)
    got = [fused.train_step(batch) for _ in range(2)]
    for want, have in zip(expected, got, strict=True):
        for key in ("train/loss", "train/grad_norm", "train/entropy"):
            assert have[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch", ["qwen3", "glm4"])
def test_on_cuda_the_compiled_kernels_match_transformers_in_bf16(
    arch: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = load_causal_lm(build(arch, tmp_path / arch)).to("cuda", torch.bfloat16)
    want_logp, want_grads = logp_and_grads(model)
    rotary_put_back(monkeypatch)
    _, _, mlps, rotary, norms = ARCHITECTURES[arch]
    assert kernels.fuse_kernels(model, "cuda") == kernels.Fused(norms, mlps, rotary)
    logp, grads = logp_and_grads(model)
    assert torch.allclose(logp.float(), want_logp.float(), rtol=3e-2, atol=3e-2)
    for name, grad in grads.items():
        cosine = torch.nn.functional.cosine_similarity(
            grad.float().flatten(), want_grads[name].float().flatten(), dim=0
        )
        assert cosine > 0.99, (name, float(cosine))


def test_compiled_the_trainer_steps_as_eager_without_a_graph_per_token_count(
    tiny_model_dir: Path,
    make_samples: Samples,
    make_configs: Configs,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CUDA path's compiling, on CPU: every Compiled function traced by torch.compile with
    the aot_eager backend (Dynamo's graphs and guards as Inductor would get them), over
    micro-batches of changing token counts. The steps equal eager's, and the later steps, at
    new token counts, compile nothing new (the token dimension is dynamic)."""
    from torch._dynamo.utils import counters

    from rlpost.backends import compiled, logprobs, rope, swiglu

    batches = [make_samples(8, seed=s, min_len=5, max_len=40) for s in range(4)]
    kernels_on_cpu(monkeypatch)
    eager = TorchTrainer(tiny_model_dir, *make_configs(8), num_threads=1)
    expected = [eager.train_step(batch) for batch in batches]
    monkeypatch.setattr(compiled, "compile_devices", lambda: frozenset({"cpu"}))
    functions = [f for m in (rope, swiglu, logprobs) for f in compiled.compiled_functions(m)]
    for function in functions:
        monkeypatch.setattr(function, "backend", "aot_eager")
        monkeypatch.setattr(function, "_compiled", None)
    torch._dynamo.reset()
    counters.clear()
    fast = TorchTrainer(tiny_model_dir, *make_configs(8), num_threads=1)  # the same group
    got = [fast.train_step(batch) for batch in batches[:2]]
    graphs = counters["stats"]["unique_graphs"]
    got += [fast.train_step(batch) for batch in batches[2:]]
    assert graphs > 0 and counters["stats"]["unique_graphs"] == graphs
    assert all(f.failed is None for f in functions)
    for want, have in zip(expected, got, strict=True):
        for key in ("train/loss", "train/grad_norm", "train/entropy"):
            assert have[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
    torch._dynamo.reset()
