"""Model YAML vs the HF config.json in its checkpoint folder: every stated field compared."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlpost.config.hf_check import check_hf_config, compare
from rlpost.errors import Location
from rlpost.schema import ModelConfig

CONF = Path(__file__).resolve().parents[3] / "conf"

# As transformers 5 writes them (rope settings under rope_parameters).
QWEN3_4B = {
    "architectures": ["Qwen3ForCausalLM"],
    "num_hidden_layers": 36,
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": True,
    "attention_bias": False,
}
GLM47_FLASH = {
    "architectures": ["Glm4MoeLiteForCausalLM"],
    "num_hidden_layers": 47,
    "hidden_size": 2048,
    "intermediate_size": 10240,
    "num_attention_heads": 20,
    "num_key_value_heads": 20,
    "vocab_size": 154880,
    "max_position_embeddings": 202752,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-05,
    "n_routed_experts": 64,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 1536,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "routed_scaling_factor": 1.8,
    "q_lora_rank": 768,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 192,
    "qk_rope_head_dim": 64,
    "v_head_dim": 256,
    "num_nextn_predict_layers": 1,
    "tie_word_embeddings": False,
}


def model(name: str) -> ModelConfig:
    return ModelConfig.model_validate(yaml.safe_load((CONF / "model" / f"{name}.yaml").read_text()))


def here(key: str) -> Location:
    return Location(file=f"conf/model/x.yaml#{key}", line=3)


def test_shipped_models_agree_with_their_hf_configs() -> None:
    assert compare(model("qwen3-4b"), QWEN3_4B, "ckpt/config.json", here) == []
    assert compare(model("glm4.7-flash"), GLM47_FLASH, "ckpt/config.json", here) == []


@pytest.mark.parametrize(
    ("hf_key", "hf_value", "field", "stated"),
    [
        ("num_key_value_heads", 4, "num_query_groups", "num_key_value_heads=4"),
        ("head_dim", 64, "kv_channels", "head_dim=64"),
        ("vocab_size", 151669, "vocab_size", "vocab_size=151669"),
        ("rope_parameters", {"rope_theta": 10000}, "rotary_base", "rope_theta=10000"),
        ("tie_word_embeddings", False, "tie_word_embeddings", "tie_word_embeddings=False"),
        ("attention_bias", True, "add_qkv_bias", "attention_bias=True"),
        ("architectures", ["Qwen2ForCausalLM"], "hf_architecture", "'Qwen2ForCausalLM'"),
        ("rms_norm_eps", 1e-5, "norm_epsilon", "rms_norm_eps=1e-05"),
    ],
)
def test_each_disagreement_is_one_issue(
    hf_key: str, hf_value: Any, field: str, stated: str
) -> None:
    issues = compare(model("qwen3-4b"), {**QWEN3_4B, hf_key: hf_value}, "ckpt/config.json", here)
    assert [i.key for i in issues] == [f"model.{field}"]
    issue = issues[0]
    assert "ckpt/config.json says" in issue.message and stated in issue.message
    assert f"conf/model/x.yaml#model.{field} says {field}=" in issue.message
    assert issue.fix.startswith(f"set {field}: ")
    assert issue.location == here(f"model.{field}")


def test_moe_and_mla_fields_are_compared() -> None:
    hf = {**GLM47_FLASH, "num_experts_per_tok": 8, "qk_nope_head_dim": 128, "n_routed_experts": 128}
    issues = compare(model("glm4.7-flash"), hf, "ckpt/config.json", here)
    assert {i.key for i in issues} == {
        "model.moe.top_k",
        "model.mla.qk_head_dim",
        "model.moe.num_experts",
    }


def test_dense_yaml_for_a_moe_checkpoint_and_the_reverse() -> None:
    moe_hf = {**QWEN3_4B, "num_experts": 128, "num_experts_per_tok": 8}
    assert [i.key for i in compare(model("qwen3-4b"), moe_hf, "c.json", here)] == ["model.moe"]
    dense_hf = {k: v for k, v in GLM47_FLASH.items() if k != "n_routed_experts"}
    issues = compare(model("glm4.7-flash"), dense_hf, "c.json", here)
    assert "model.moe" in [i.key for i in issues]


def test_check_runs_only_when_the_folder_has_a_config(tmp_path: Path) -> None:
    raw = yaml.safe_load((CONF / "model" / "qwen3-4b.yaml").read_text())
    raw["hf_checkpoint"] = str(tmp_path)
    data = {"model": raw}
    assert check_hf_config(data, here) == []  # no config.json yet
    (tmp_path / "config.json").write_text(json.dumps({**QWEN3_4B, "hidden_size": 4096}))
    issues = check_hf_config(data, here)
    assert [i.key for i in issues] == ["model.hidden_size"]
    assert str(tmp_path / "config.json") in issues[0].message
    (tmp_path / "config.json").write_text("{not json")
    assert [i.key for i in check_hf_config(data, here)] == ["model.hf_checkpoint"]
