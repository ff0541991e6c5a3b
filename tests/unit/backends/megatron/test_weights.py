"""HF <-> Megatron names and layouts: QKV interleaved per query group, gate/up per TP rank,
vocabulary padding, tied output layers, layer and expert offsets of a parallel rank."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rlpost.backends.megatron.weights import (
    LAYOUTS,
    Placement,
    Shapes,
    WeightMap,
    shard,
    unshard,
)
from rlpost.schema import ModelConfig

SHAPES = Shapes(
    num_attention_heads=4, num_query_groups=2, head_dim=3, vocab_size=10, padded_vocab_size=12
)


def model(**fields: Any) -> ModelConfig:
    base: dict[str, Any] = {
        "name": "m",
        "family": "qwen3",
        "hf_architecture": "Qwen3ForCausalLM",
        "num_layers": 4,
        "hidden_size": 8,
        "ffn_hidden_size": 16,
        "num_attention_heads": 4,
        "num_query_groups": 2,
        "vocab_size": 10,
        "max_position_embeddings": 32,
        "hf_checkpoint": "/nowhere",
    }
    return ModelConfig(**(base | fields))


def test_qkv_is_grouped_by_query_group() -> None:
    # rows labelled by (tensor, head) so the layout is visible
    q = torch.arange(12).float().unsqueeze(1)  # 4 heads x 3
    k = 100 + torch.arange(6).float().unsqueeze(1)  # 2 groups x 3
    v = 200 + torch.arange(6).float().unsqueeze(1)
    full = LAYOUTS["qkv"].to_full([q, k, v], SHAPES)
    group0 = [0, 1, 2, 3, 4, 5, 100, 101, 102, 200, 201, 202]
    assert full[:12, 0].tolist() == group0
    assert [t.tolist() for t in LAYOUTS["qkv"].from_full(full, SHAPES)] == [
        q.tolist(),
        k.tolist(),
        v.tolist(),
    ]
    # a TP rank of 2 holds exactly one whole query group
    assert shard(full, LAYOUTS["qkv"], 0, 2)[:, 0].tolist() == group0


def test_gate_up_rank_shards_hold_their_slice_of_each() -> None:
    gate, up = torch.arange(4).float().unsqueeze(1), 10 + torch.arange(4).float().unsqueeze(1)
    full = LAYOUTS["gate_up"].to_full([gate, up], SHAPES)
    parts = [shard(full, LAYOUTS["gate_up"], r, 2) for r in range(2)]
    assert parts[1][:, 0].tolist() == [2.0, 3.0, 12.0, 13.0]
    assert torch.equal(unshard(parts, LAYOUTS["gate_up"]), full)


@pytest.mark.parametrize("name", ["column", "row", "vocab", "qkv", "gate_up_fused", "replicated"])
def test_shards_reassemble(name: str) -> None:
    layout = LAYOUTS[name]
    full = torch.randn(12, 6)
    parts = [shard(full, layout, r, 2) for r in range(2)]
    assert torch.equal(unshard(parts, layout), full)


def test_vocab_is_padded_with_zero_rows_and_unpadded_back() -> None:
    embedding = torch.randn(10, 4)
    full = LAYOUTS["vocab"].to_full([embedding], SHAPES)
    assert full.shape == (12, 4) and not full[10:].any()
    assert torch.equal(LAYOUTS["vocab"].from_full(full, SHAPES)[0], embedding)


def test_names_per_family() -> None:
    qwen = WeightMap(model())
    assert qwen.rule("decoder.layers.2.mlp.linear_fc1.weight").hf_names == (
        "model.layers.2.mlp.gate_proj.weight",
        "model.layers.2.mlp.up_proj.weight",
    )
    glm = WeightMap(model(family="glm4", post_mlp_layernorm=True, post_self_attn_layernorm=True))
    assert glm.rule("decoder.layers.0.mlp.linear_fc1.weight").hf_names == (
        "model.layers.0.mlp.gate_up_proj.weight",
    )
    assert glm.rule("decoder.layers.0.mlp.linear_fc2.post_norm.weight").hf_names == (
        "model.layers.0.post_mlp_layernorm.weight",
    )
    assert glm.rule("decoder.layers.0.self_attention.linear_proj.post_norm.weight").hf_names == (
        "model.layers.0.post_self_attn_layernorm.weight",
    )


def test_moe_layers_after_the_dense_prefix() -> None:
    moe = {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 8, "first_k_dense_layers": 1}
    weights = WeightMap(model(family="glm4_moe", moe=moe))
    rule = weights.rule("decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.weight")
    assert rule.hf_names == ("model.layers.1.mlp.experts.3.down_proj.weight",) and rule.expert
    assert weights.rule("decoder.layers.1.mlp.router.expert_bias").hf_names == (
        "model.layers.1.mlp.gate.e_score_correction_bias",
    )
    with pytest.raises(KeyError):  # layer 0 is dense: no router
        weights.rule("decoder.layers.0.mlp.router.weight")


def test_tied_output_layer_reads_the_embedding_and_is_not_exported() -> None:
    tied, untied = WeightMap(model(tie_word_embeddings=True)), WeightMap(model())
    assert tied.rule("output_layer.weight").hf_names == ("model.embed_tokens.weight",)
    assert not tied.exported("output_layer.weight")
    assert untied.rule("output_layer.weight").hf_names == ("lm_head.weight",)
    assert untied.exported("output_layer.weight")
    assert not untied.exported("decoder.layers.0.self_attention.linear_qkv._extra_state")


def test_local_names_become_global() -> None:
    rank = Placement(layer_offset=2, expert_offset=4)
    assert rank.global_name("decoder.layers.1.mlp.experts.local_experts.1.linear_fc1.weight") == (
        "decoder.layers.3.mlp.experts.local_experts.5.linear_fc1.weight"
    )
    assert (
        rank.global_name("embedding.word_embeddings.weight") == "embedding.word_embeddings.weight"
    )
