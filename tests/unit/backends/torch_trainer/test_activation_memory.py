"""The plan's per-layer activation memory for the torch trainer against what a transformers
decoder layer really keeps for backward under its packed attention.

A forward of the trainer's token path (forward.forward_tokens, the chunked log-prob kernel
included) under a saved-tensors hook: every tensor autograd keeps, counted once per storage,
parameters left out. A model of two layers minus the same model of one is one layer's share,
measured in float32 (the CPU trainer) and in bf16 (what a GPU computes in: FSDP2's mixed
precision hands the layers bf16 parameters and inputs, as a bf16 model here does), for a
Qwen3 layer (QK-norm) and a Mistral-shaped one (a `generic` model), each at two token
counts, so that a constant fitted to one count would not pass, and on samples of different
lengths, which the attention pads to the longest of each group (at most PADDED_ROWS_LIMIT
rows a token; the plan is asked at the micro-batch's own padded rows); with transformers' RMSNorm
modules as they are (CPU) and on rlpost's kernels (CUDA: fused RMSNorm, SwiGLU and RoPE,
rlpost.backends.torch_trainer.kernels; here torch's reference decompositions of the fused
RMSNorm ops stand in for their CUDA kernels, and keep what they keep). The plan's term
(rlpost.plan.fsdp.torch_layer_activation_bytes) must be within 5%.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM, Qwen3Config, Qwen3ForCausalLM

from rlpost.algo.packing import padded_rows
from rlpost.backends import rms_norm
from rlpost.backends.torch_trainer import kernels
from rlpost.backends.torch_trainer.forward import forward_tokens, pack_samples
from rlpost.backends.torch_trainer.model_io import load_causal_lm
from rlpost.config.hf_model import HFConfig, model_fields
from rlpost.plan.fsdp import torch_layer_activation_bytes
from rlpost.plan.layout import PADDED_ROWS_LIMIT, ParallelLayout
from rlpost.schema import ModelConfig
from rlpost.types import TrainSample

VOCAB = 64
SAMPLES = 4
LENGTHS = {  # per micro-batch, the samples' lengths
    "equal32": (32,) * SAMPLES,
    "equal96": (96,) * SAMPLES,
    "ragged": (40, 32, 32, 24),  # one padded group of 4 x 40 rows for 128 tokens: 1.25 a token
}
SHAPE: dict[str, Any] = {  # attention twice the hidden size wide, as Qwen3-0.6B's is
    "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 96,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "max_position_embeddings": 512, "tie_word_embeddings": True,
}  # fmt: skip
ARCHITECTURES = {
    "qwen3": (Qwen3ForCausalLM, Qwen3Config),
    "mistral": (MistralForCausalLM, MistralConfig),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def save_model(path: Path, arch: str, layers: int, dtype: str) -> ModelConfig:
    """A random HF model of `arch` with `layers` layers, and its model YAML as
    `rlpost new model --from-hf` draws it from config.json."""
    hf_class, config_class = ARCHITECTURES[arch]
    torch.manual_seed(0)
    hf_class(config_class(**SHAPE, num_hidden_layers=layers)).save_pretrained(path)
    fields = model_fields(HFConfig.read(path), arch, str(path))
    return ModelConfig(**(fields | {"params_dtype": dtype}))


def fused_on_cpu(patch: pytest.MonkeyPatch) -> None:
    """The fused RMSNorm path on CPU: the ops' reference decompositions as its kernels."""
    from torch._decomp import decompositions

    fused = (decompositions._fused_rms_norm, decompositions._fused_rms_norm_backward)
    patch.setattr(rms_norm, "FUSED_RMS_NORM", fused)
    patch.setattr(rms_norm, "FUSED_RMS_NORM_DEVICES", frozenset({"cpu"}))


def kernels_on_cpu(patch: pytest.MonkeyPatch) -> None:
    """rlpost's kernels for CPU tensors, as the trainer runs them on CUDA (the fused RMSNorm
    ops by their decompositions), every rotary function replaced put back afterwards."""
    fused_on_cpu(patch)
    patch.setattr(kernels, "KERNEL_DEVICES", frozenset({"cpu"}))
    rotary_put_back(patch)


def rotary_put_back(patch: pytest.MonkeyPatch) -> None:
    """Every rotary function kernels.fuse_rotary replaces from now on is put back after the
    test (the replacement is for the process)."""
    fuse_rotary = kernels.fuse_rotary

    def restoring(model: torch.nn.Module) -> int:
        for layer in model.modules():
            module = kernels._rotary_module(layer)
            if module is not None:
                patch.setattr(module, kernels.ROTARY_FUNCTION, module.apply_rotary_pos_emb)
        return fuse_rotary(model)

    patch.setattr(kernels, "fuse_rotary", restoring)


def kept_for_backward(path: Path, dtype: str, lengths: tuple[int, ...], fused: bool = False) -> int:
    model = load_causal_lm(path).to(DTYPES[dtype])
    if fused:
        routed = kernels.fuse_kernels(model, "cpu")
        assert routed.norms > 0 and routed.mlps > 0 and routed.rotary == 1
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    rng = random.Random(sum(lengths))
    samples = [
        TrainSample([rng.randrange(2, VOCAB) for _ in range(length)], length // 2, 1.0)
        for length in lengths
    ]
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in parameters:
            seen.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward_tokens(model, pack_samples(samples), 1.0)
    assert out.logp.requires_grad
    return sum(seen.values())


@pytest.mark.parametrize("fused", [False, True], ids=["transformers-layers", "rlpost-kernels"])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_plan_counts_what_a_transformers_layer_keeps(
    arch: str, dtype: str, fused: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if fused:
        kernels_on_cpu(monkeypatch)
    models = {n: save_model(tmp_path / f"layers{n}", arch, n, dtype) for n in (1, 2)}
    assert models[2].qk_layernorm == (arch == "qwen3")
    for case, lengths in LENGTHS.items():
        two, one = (
            kept_for_backward(tmp_path / f"layers{n}", dtype, lengths, fused) for n in (2, 1)
        )
        par = ParallelLayout.single_process(recompute="none")
        rows = padded_rows(lengths) / sum(lengths)
        assert rows == (PADDED_ROWS_LIMIT if case == "ragged" else 1.0)
        planned = torch_layer_activation_bytes(
            models[2], 1, sum(lengths), par, fused=fused, padded_rows=rows
        )
        assert two - one == pytest.approx(planned, rel=0.05), (arch, dtype, case)
