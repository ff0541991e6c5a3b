"""FP8 block quantisation: the error bound of e4m3 per block, the tensors of a published FP8
checkpoint, and reading FP8 folders as the weights they stand for (never as bf16 casts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlpost.backends.fp8 import (
    FP8_DTYPE,
    SCALE_SUFFIX,
    Fp8Error,
    Fp8Format,
    dequantize,
    dequantize_state,
    quantize,
    quantize_named,
    quantized,
)
from rlpost.backends.fp8_format import folder_format

FIXTURE = Path(__file__).parents[2] / "fixtures" / "deepseek_v3_fp8_tensors.json"
SAFETENSORS_DTYPES = {torch.bfloat16: "BF16", torch.float32: "F32", FP8_DTYPE: "F8_E4M3"}


def e4m3_bound(weight: torch.Tensor, scale: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """Largest rounding error of each element: half a step of e4m3 at its magnitude (3
    mantissa bits: 2^-4 relative) or half the subnormal step (2^-10), times its block's
    scale."""
    rows, cols = fmt.blocks(tuple(weight.shape))
    s = scale.repeat_interleave(rows, 0)[: weight.shape[0]]
    s = s.repeat_interleave(cols, 1)[:, : weight.shape[1]]
    scaled = (weight / s).abs()
    return torch.maximum(scaled * 2.0**-4, torch.full_like(scaled, 2.0**-10)) * s


@pytest.mark.parametrize("fmt", [Fp8Format((128, 128)), Fp8Format((64, 32)), Fp8Format(None)])
def test_every_element_is_within_e4m3s_bound_of_its_block(fmt: Fp8Format) -> None:
    torch.manual_seed(0)
    # blocks of very different magnitudes, and shapes the blocks do not divide
    weight = torch.randn(300, 200) * torch.logspace(-4, 2, 300)[:, None]
    weight[:5, :7] = 0.0  # an all-zero corner
    q, scale = quantize(weight, fmt)
    assert q.dtype == FP8_DTYPE and q.shape == weight.shape
    assert scale.dtype == torch.float32 and tuple(scale.shape) == fmt.scale_shape((300, 200))
    back = dequantize(q, scale, fmt, torch.float32)
    assert ((back - weight).abs() <= e4m3_bound(weight, scale, fmt) * (1 + 1e-6)).all()
    # every block uses e4m3's range: its largest element maps to 448 exactly
    assert float(q.float().abs().max()) == 448.0


def test_a_scale_of_the_wrong_shape_is_refused_naming_the_block_size() -> None:
    q, scale = quantize(torch.randn(256, 256), Fp8Format((128, 128)))
    with pytest.raises(Fp8Error, match="weight_block_size does not match"):
        dequantize(q, scale, Fp8Format((64, 64)), torch.float32)


def test_the_tensors_match_the_published_deepseek_v3_fp8_checkpoint() -> None:
    published = json.loads(FIXTURE.read_text())
    fmt = Fp8Format.from_quantization_config(published["quantization_config"], str(FIXTURE))
    assert fmt == Fp8Format((128, 128))
    assert fmt.quantization_config() == published["quantization_config"]
    expected = published["tensors"]
    # the bf16 checkpoint the FP8 one was made from: every weight without its scales, with
    # the router's correction bias in float32 as published
    source = []
    for name, (dtype, shape) in expected.items():
        if name.endswith(SCALE_SUFFIX):
            continue
        source_dtype = torch.float32 if dtype == "F32" else torch.bfloat16
        source.append((name, torch.empty(shape, dtype=source_dtype, device="meta")))
    ours = {
        name: [SAFETENSORS_DTYPES[t.dtype], list(t.shape)]
        for name, t in quantize_named(source, fmt)
    }
    assert ours == expected


@pytest.mark.parametrize(
    ("name", "shape", "stored"),
    [
        ("model.layers.0.self_attn.q_proj.weight", (256, 256), True),
        ("model.layers.0.mlp.experts.3.down_proj.weight", (256, 64), True),
        ("model.layers.0.mlp.gate.weight", (8, 256), False),  # the router
        ("model.layers.0.mlp.shared_expert_gate.weight", (1, 256), False),
        ("model.layers.0.self_attn.q_norm.weight", (64,), False),
        ("model.embed_tokens.weight", (320, 256), False),
        ("lm_head.weight", (320, 256), False),
        ("model.layers.61.shared_head.head.weight", (320, 256), False),  # an MTP layer's head
        ("model.layers.61.eh_proj.weight", (256, 512), True),
        ("model.layers.0.self_attn.q_proj.bias", (256,), False),
    ],
)
def test_which_weights_are_stored_in_fp8(name: str, shape: tuple[int, ...], stored: bool) -> None:
    assert quantized(name, shape) is stored


def test_a_state_dict_dequantises_to_the_weights_it_stands_for() -> None:
    fmt = Fp8Format((32, 32))
    torch.manual_seed(1)
    state = {
        "model.layers.0.mlp.up_proj.weight": torch.randn(96, 64),
        "model.norm.weight": torch.randn(64),
    }
    stored = dict(quantize_named(state.items(), fmt))
    assert set(stored) == {*state, "model.layers.0.mlp.up_proj.weight" + SCALE_SUFFIX}
    back = dequantize_state(stored, fmt, torch.float32)
    assert set(back) == set(state)
    assert torch.equal(back["model.norm.weight"], state["model.norm.weight"])
    q, scale = quantize(state["model.layers.0.mlp.up_proj.weight"], fmt)
    assert torch.equal(
        back["model.layers.0.mlp.up_proj.weight"], dequantize(q, scale, fmt, torch.float32)
    )
    stored.pop("model.layers.0.mlp.up_proj.weight" + SCALE_SUFFIX)
    with pytest.raises(
        Fp8Error, match=r"has no 'model\.layers\.0\.mlp\.up_proj\.weight_scale_inv'"
    ):
        dequantize_state(stored, fmt, torch.float32)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"quant_method": "awq", "bits": 4}, "not e4m3 FP8"),
        ({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]}, "not e4m3"),
        ({"quant_method": "fp8", "activation_scheme": "static"}, "one scale per tensor"),
        ({"quant_method": "fp8", "weight_block_size": [128]}, "is not \\[rows, columns\\]"),
    ],
)
def test_quantisation_configs_rlpost_cannot_read_are_refused(
    tmp_path: Path, config: dict[str, object], message: str
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": config}))
    with pytest.raises(Fp8Error, match=message):
        folder_format(tmp_path)


def test_an_unquantised_or_absent_folder_has_no_fp8_format(tmp_path: Path) -> None:
    assert folder_format(tmp_path) is None
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    assert folder_format(tmp_path) is None
