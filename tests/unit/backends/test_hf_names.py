"""A model's tensors in its checkpoint's layout and back (rlpost.backends.hf_names), and the
CPU engine loading MoE checkpoints and bucketed MoE updates through it.

transformers 5 stacks an MoE layer's experts into one tensor per projection where the
checkpoint (and SGLang, and the megatron trainer's exports) has one tensor per expert: a
checkpoint assigned by name without the conversion was refused ("checkpoint has 24 tensor(s)
the model does not"), and the torch trainer sent the stacked names to the engines.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    Glm4MoeConfig,
    Glm4MoeForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    PreTrainedModel,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from rlpost.backends.cpu_engine.weights import ModelWeights, WeightLoadError, read_weights
from rlpost.backends.hf_load import build_causal_lm
from rlpost.backends.hf_names import merged_names, to_checkpoint, to_model

SMALL = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}
FAMILIES = {
    "qwen3_moe": (
        Qwen3MoeForCausalLM,
        Qwen3MoeConfig(**SMALL, head_dim=8, moe_intermediate_size=16, num_experts=4),
    ),
    "mixtral": (MixtralForCausalLM, MixtralConfig(**SMALL, num_local_experts=4)),
    # a router with a persistent buffer (its expert bias) in the checkpoint beside the weights
    "glm4_moe": (
        Glm4MoeForCausalLM,
        Glm4MoeConfig(
            **SMALL,
            head_dim=8,
            moe_intermediate_size=16,
            n_routed_experts=4,
            first_k_dense_replace=0,
            n_group=1,
            topk_group=1,
        ),
    ),
    "qwen3": (Qwen3ForCausalLM, Qwen3Config(**SMALL, head_dim=8)),  # stored as built
}
EXPERTS = 4


def save(family: str, folder: Path, seed: int) -> Path:
    model_class, config = FAMILIES[family]
    torch.manual_seed(seed)
    model = model_class(config)
    for name, buffer in model.named_buffers():
        if name.endswith("e_score_correction_bias"):  # zeros as built; a trained one is not
            buffer.normal_()
    model.save_pretrained(folder)
    return folder


def params(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """What a checkpoint of the model holds, under the model's names: its parameters and its
    persistent buffers (a router's expert bias; not a rotary embedding's `inv_freq`)."""
    saved = model.state_dict()
    tensors = {name: p.detach() for name, p in model.named_parameters()}
    tensors |= {name: b for name, b in model.named_buffers() if name in saved}
    return tensors


@pytest.fixture(params=list(FAMILIES))
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.parametrize("built", ["from_pretrained", "from_config"])
def test_both_ways_between_the_model_and_its_checkpoint(
    family: str, built: str, tmp_path: Path
) -> None:
    folder = save(family, tmp_path / "model", seed=1)
    stored = read_weights(folder, torch.float32)
    if built == "from_pretrained":
        model = AutoModelForCausalLM.from_pretrained(folder)
    else:  # no record of a load: the conversions transformers would have applied
        model = build_causal_lm(folder, torch.float32)
        model.load_state_dict(to_model(model, stored), strict=False)
        model.tie_weights()
    held = params(model)
    as_stored = to_checkpoint(model, held)
    assert sorted(as_stored) == sorted(stored)
    assert all(torch.equal(as_stored[n], stored[n]) for n in stored)
    assert all(t.is_contiguous() for t in as_stored.values())
    as_held = to_model(model, stored)
    assert sorted(as_held) == sorted(held)
    assert all(torch.equal(as_held[n], held[n]) for n in held)
    merged = merged_names(model, stored)
    if family == "qwen3":
        assert merged == set() and sorted(held) == sorted(stored)
    else:  # gate, up and down of every expert of both layers; nothing else
        assert len(merged) == 2 * EXPERTS * 3
        assert all(".experts." in name for name in merged)


def engine_model(folder: Path) -> PreTrainedModel:
    from rlpost.backends.hf_load import load_causal_lm

    model = load_causal_lm(folder, torch.float32)
    model.train(False)
    return model


def test_the_cpu_engine_loads_another_checkpoint_of_its_model(family: str, tmp_path: Path) -> None:
    served = engine_model(save(family, tmp_path / "served", seed=1))
    update = save(family, tmp_path / "update", seed=2)
    ModelWeights(served).assign(read_weights(update, torch.float32))
    expected = params(engine_model(update))
    assert all(torch.equal(p, expected[n]) for n, p in params(served).items())


def buckets(state: dict[str, torch.Tensor], count: int, seed: int) -> list[dict[str, Any]]:
    """The tensors in `count` buckets in a shuffled order: a layer's experts spread over
    several buckets, as a sender's bucket plan may spread them."""
    names = sorted(state)
    random.Random(seed).shuffle(names)
    return [{n: state[n] for n in names[i::count]} for i in range(count)]


def test_a_bucketed_update_merges_each_layers_experts_once_all_have_arrived(
    family: str, tmp_path: Path
) -> None:
    served = engine_model(save(family, tmp_path / "served", seed=1))
    before = {n: t.clone() for n, t in params(served).items()}
    update = read_weights(save(family, tmp_path / "update", seed=2), torch.float32)
    expected = params(engine_model(tmp_path / "update"))
    weights = ModelWeights(served)
    parts = buckets(update, 4, seed=3)
    for part in parts[:-1]:
        weights.assign_some(part)
    stacked = [n for n in before if ".experts." in n]
    # the stacked experts wait for the last bucket; what arrived whole is in place
    assert all(torch.equal(params(served)[n], before[n]) for n in stacked)
    weights.assign_some(parts[-1], last=True)
    assert all(torch.equal(p, expected[n]) for n, p in params(served).items())


def test_an_update_missing_one_expert_is_refused_at_its_end(tmp_path: Path) -> None:
    served = engine_model(save("qwen3_moe", tmp_path / "served", seed=1))
    update = read_weights(save("qwen3_moe", tmp_path / "update", seed=2), torch.float32)
    del update["model.layers.1.mlp.experts.3.up_proj.weight"]
    weights = ModelWeights(served)
    weights.assign_some(update)
    with pytest.raises(WeightLoadError, match=r"model\.layers\.1\.mlp\.experts\.gate_up_proj"):
        weights.finish_update()
