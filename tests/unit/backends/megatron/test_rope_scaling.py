"""RoPE context extension (model.rope_scaling) as the megatron trainer's rotary table computes
it, against transformers' own rotary initialisation for the same config: the frequencies of
every rotary dim and the factor on cos and sin."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from rlpost.backends.megatron.kernels import inverse_frequencies, rope_table
from rlpost.backends.rope import scaled_frequencies
from rlpost.schema.model import RopeScalingConfig

CASES: dict[str, tuple[int, float, dict[str, Any]]] = {
    # head dim, rope_theta, the HF rope_scaling
    "llama3.1": (
        128,
        500000.0,
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    "llama3.2-small-context": (
        64,
        10000.0,
        {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 2.0,
            "high_freq_factor": 8.0,
            "original_max_position_embeddings": 64,
        },
    ),
    "qwen3-yarn": (
        128,
        1000000.0,
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    ),
    "deepseek-v3-yarn": (
        64,
        10000.0,
        {
            "rope_type": "yarn",
            "factor": 40.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
    ),
    "yarn-mscales-differ": (
        32,
        10000.0,
        {
            "rope_type": "yarn",
            "factor": 16.0,
            "original_max_position_embeddings": 128,
            "beta_fast": 16.0,
            "beta_slow": 2.0,
            "mscale": 0.707,
            "mscale_all_dim": 1.0,
        },
    ),
    "yarn-mscale-alone": (  # without mscale_all_dim, transformers ignores mscale
        32,
        10000.0,
        {
            "rope_type": "yarn",
            "factor": 16.0,
            "original_max_position_embeddings": 128,
            "mscale": 0.707,
        },
    ),
}


def _ours(hf_scaling: dict[str, Any], head_dim: int, base: float) -> tuple[torch.Tensor, float]:
    fields = {k: v for k, v in hf_scaling.items() if k != "rope_type"}
    scaling = RopeScalingConfig(type=hf_scaling["rope_type"], **fields)
    return scaled_frequencies(inverse_frequencies(head_dim, 1.0, base), scaling, base)


@pytest.mark.parametrize("case", CASES)
def test_scaled_frequencies_are_transformers_own(case: str) -> None:
    head_dim, base, hf_scaling = CASES[case]
    config = LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=hf_scaling["original_max_position_embeddings"] * 4,
        rope_parameters={"rope_theta": base, **hf_scaling},
    )
    theirs, their_factor = ROPE_INIT_FUNCTIONS[hf_scaling["rope_type"]](config, "cpu")
    ours, our_factor = _ours(hf_scaling, head_dim, base)
    plain = inverse_frequencies(head_dim, 1.0, base)
    assert not torch.allclose(ours, plain)  # the case scales something
    torch.testing.assert_close(ours, theirs.float(), rtol=1e-6, atol=0.0)
    assert our_factor == pytest.approx(their_factor, rel=1e-12)


def test_unscaled_rope_is_left_alone() -> None:
    plain = inverse_frequencies(16, 1.0, 10000.0)
    inv_freq, factor = scaled_frequencies(plain, None, 10000.0)
    assert inv_freq is plain and factor == 1.0


def test_the_table_carries_the_attention_factor() -> None:
    positions = torch.arange(7)
    inv_freq, factor = _ours(CASES["qwen3-yarn"][2], 16, 10000.0)
    assert factor > 1.0
    plain = rope_table(positions, inv_freq, False, torch.float64)
    scaled = rope_table(positions, inv_freq, False, torch.float64, factor)
    torch.testing.assert_close(scaled.cos, plain.cos * factor)
    torch.testing.assert_close(scaled.sin, plain.sin * factor)
