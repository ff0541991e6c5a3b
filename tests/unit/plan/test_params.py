"""Parameter counts from the architecture against the published model sizes."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rlpost.plan.params import (
    count_params,
    layer_params,
    mlp_params,
    params_per_stage,
    stage_layers,
)
from rlpost.schema import ModelConfig

Models = Callable[[str], ModelConfig]


@pytest.mark.parametrize(
    ("name", "published_total", "tolerance"),
    [
        ("qwen3-4b", 4.02e9, 0.01),  # HF model card: 4.0B (4,022,468,096 in the safetensors)
        ("glm4-9b", 9.40e9, 0.01),  # GLM-Z1-9B-0414: 9.4B
        ("glm4.5-355b-a32b", 355e9, 0.02),  # GLM-4.5: 355B total (MTP layer included here)
        ("glm4.7-flash", 30e9, 0.05),  # GLM-4.7-Flash: ~30B (30B-A3B)
    ],
)
def test_total_matches_published(
    model_config: Models, name: str, published_total: float, tolerance: float
) -> None:
    total = count_params(model_config(name)).total
    assert total == pytest.approx(published_total, rel=tolerance)


def test_glm45_active_parameters_near_32b(model_config: Models) -> None:
    counts = count_params(model_config("glm4.5-355b-a32b"))
    assert counts.active == pytest.approx(32e9, rel=0.06)
    assert counts.experts > 0.95 * counts.total  # 160 experts dominate


def test_qwen3_4b_exact_total(model_config: Models) -> None:
    # embedding (tied, counted once) + 36 layers + final norm, as the HF checkpoint holds
    assert count_params(model_config("qwen3-4b")).total == 4_022_468_096


def test_dense_model_has_no_experts(model_config: Models) -> None:
    counts = count_params(model_config("glm4-9b"))
    assert counts.experts == 0
    assert counts.active == counts.total
    assert counts.output == counts.embedding  # untied head


def test_swiglu_mlp_has_three_matrices(model_config: Models) -> None:
    model = model_config("qwen3-4b")
    assert mlp_params(model, 9728) == 3 * 2560 * 9728


def test_moe_layers_start_after_dense_prefix(model_config: Models) -> None:
    model = model_config("glm4.5-355b-a32b")
    dense, moe = layer_params(model, 2), layer_params(model, 3)
    assert dense.experts == 0 and dense.mlp == 3 * 5120 * 12288
    assert moe.mlp == 0
    assert moe.experts == 160 * 3 * 5120 * 1536
    assert moe.shared_experts == 3 * 5120 * 1536
    assert moe.router == 160 * 5120


def test_mla_attention_uses_latent_projections(model_config: Models) -> None:
    model = model_config("glm4.7-flash")
    h, heads = 2048, 20
    q = h * 768 + 768 + 768 * heads * (192 + 64)
    kv = h * (512 + 64) + 512 + 512 * heads * (192 + 256)
    out = heads * 256 * h
    assert layer_params(model, 0).attention == q + kv + out


def test_mtp_layer_counted_once_per_layer(model_config: Models) -> None:
    model = model_config("glm4.7-flash")
    with_mtp = count_params(model)
    without = count_params(model.model_copy(update={"mtp_num_layers": 0}))
    moe_layer = layer_params(model, 46).total
    assert with_mtp.total - without.total == with_mtp.mtp
    assert with_mtp.mtp == moe_layer + 3 * 2048 + 2 * 2048 * 2048


@pytest.mark.parametrize(
    ("layers", "pp", "first", "last", "expected"),
    [
        (92, 4, None, None, (23, 23, 23, 23)),
        (47, 2, None, None, None),
        (47, 2, None, 23, (24, 23)),
        (47, 4, 11, 12, (11, 12, 12, 12)),
        (40, 3, None, None, None),
        (36, 1, None, None, (36,)),
    ],
)
def test_stage_layers(
    layers: int, pp: int, first: int | None, last: int | None, expected: tuple[int, ...] | None
) -> None:
    assert stage_layers(layers, pp, first, last) == expected


def test_stages_hold_embedding_first_and_head_last(model_config: Models) -> None:
    model = model_config("glm4-9b")
    first, last = params_per_stage(model, (20, 20))
    twenty_layers = 20 * layer_params(model, 0).total
    vocab = model.vocab_size * model.hidden_size
    assert first.dense == twenty_layers + vocab
    assert last.dense == twenty_layers + vocab + model.hidden_size  # head and final norm
    assert first.dense + last.dense == count_params(model).total


def test_tied_head_is_a_second_copy_only_across_stages(model_config: Models) -> None:
    model = model_config("qwen3-4b")
    (single,) = params_per_stage(model, (36,))
    first, last = params_per_stage(model, (18, 18))
    vocab = model.vocab_size * model.hidden_size
    assert single.dense == count_params(model).total
    assert first.dense + last.dense == single.dense + vocab


GENERIC_SMALL = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=320,
    max_position_embeddings=256,
    bos_token_id=0,
    eos_token_id=2,
    pad_token_id=0,
)


@pytest.mark.parametrize(
    ("config_class", "extra"),
    [
        ("MistralConfig", {"sliding_window": None}),
        ("MistralConfig", {"sliding_window": None, "tie_word_embeddings": True}),
        ("Phi3Config", {}),  # fused QKV and gate-up projections
        ("GemmaConfig", {"head_dim": 32}),  # GeGLU, heads wider than hidden / heads
        ("Qwen2Config", {}),  # QKV biases its config.json does not state
        ("MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    ],
    ids=["mistral", "mistral-tied", "phi3", "gemma", "qwen2", "mixtral"],
)
@pytest.mark.parametrize("states_tying", [True, False], ids=["tying stated", "tying omitted"])
def test_a_generic_models_count_is_the_hf_models(
    config_class: str, extra: dict, states_tying: bool
) -> None:
    """The facts `new model --from-hf` draws from a config.json count exactly what the
    transformers model built from it holds, also from a config.json that leaves
    tie_word_embeddings to its class, as Gemma's published ones do (GemmaConfig ties them)."""
    import torch
    import transformers

    from rlpost.config.hf_model import HFConfig, architecture

    config = getattr(transformers, config_class)(**GENERIC_SMALL, **extra)
    torch.manual_seed(0)
    with torch.device("meta"):
        hf_model = transformers.AutoModelForCausalLM.from_config(config)
    data = config.to_dict() | {"architectures": [type(hf_model).__name__]}
    if not states_tying and "tie_word_embeddings" not in extra:
        del data["tie_word_embeddings"]
    facts = architecture(HFConfig(data, "config.json"))
    assert facts["family"] == "generic"
    model = ModelConfig(name="m", hf_checkpoint="/m", **facts)
    assert count_params(model).total == hf_model.num_parameters()
