"""Model YAML vs the HF config.json in its checkpoint folder: every stated field compared."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlpost.config.hf_check import check_hf_config, check_weights_config, derived_issues
from rlpost.config.hf_fields import compare
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


FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hf_configs"


def fixture(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / name / "config.json").read_text())
    return loaded


@pytest.mark.parametrize(
    "name", ["qwen3-0.6b", "qwen3-1.7b", "qwen3-8b", "qwen3-30b-a3b", "llama3.1-8b", "deepseek-v3"]
)
def test_shipped_models_agree_with_what_their_checkpoints_imply(name: str) -> None:
    hf = fixture(name)
    assert compare(model(name), hf, "ckpt/config.json", here) == []
    assert derived_issues(model(name), hf, "ckpt/config.json", here) == []


def _with(name: str, **fields: Any) -> ModelConfig:
    raw = model(name).model_dump()
    for dotted, value in fields.items():
        node = raw
        *parents, last = dotted.split("__")
        for part in parents:
            node = node[part]
        node[last] = value
    return ModelConfig.model_validate(raw)


@pytest.mark.parametrize(
    ("name", "fields", "key", "implied"),
    [
        # what the family's modelling code does, whatever config.json says
        ("qwen3-8b", {"qk_layernorm": False}, "model.qk_layernorm", "True"),
        ("llama3.1-8b", {"post_mlp_layernorm": True}, "model.post_mlp_layernorm", "False"),
        ("qwen3-8b", {"rotary_interleaved": True}, "model.rotary_interleaved", "False"),
        ("llama3.1-8b", {"add_bias_linear": True}, "model.add_bias_linear", "False"),
        ("qwen3-8b", {"family": "llama"}, "model.family", "'qwen3'"),
        # a key the file states and the comparison by key does not map
        ("llama3.1-8b", {"activation": "gelu"}, "model.activation", "'swiglu'"),
        ("qwen3-30b-a3b", {"moe__router_score": "sigmoid"}, "model.moe.router_score", "'softmax'"),
        ("deepseek-v3", {"moe__router_num_groups": 4}, "model.moe.router_num_groups", "8"),
        ("deepseek-v3", {"moe__router_group_topk": 2}, "model.moe.router_group_topk", "4"),
        ("deepseek-v3", {"moe__router_expert_bias": False}, "model.moe.router_expert_bias", "True"),
        ("qwen3-30b-a3b", {"moe__norm_topk_prob": False}, "model.moe.norm_topk_prob", "True"),
        # what a key's absence means: Qwen3 has no partial rotary, shared experts or MTP
        ("qwen3-8b", {"rotary_percent": 0.5}, "model.rotary_percent", "1.0"),
        ("qwen3-8b", {"mtp_num_layers": 1}, "model.mtp_num_layers", "0"),
        ("qwen3-30b-a3b", {"moe__num_shared_experts": 1}, "model.moe.num_shared_experts", "0"),
        (
            "qwen3-30b-a3b",
            {"moe__router_topk_scaling_factor": 2.5},
            "model.moe.router_topk_scaling_factor",
            "1.0",
        ),
    ],
)
def test_a_field_the_checkpoint_implies_otherwise_is_one_issue(
    name: str, fields: dict[str, Any], key: str, implied: str
) -> None:
    hf = fixture(name)
    issues = derived_issues(_with(name, **fields), hf, "ckpt/config.json", here)
    assert [i.key for i in issues] == [key]
    assert f"has {implied}" in issues[0].message and "ckpt/config.json" in issues[0].message
    assert issues[0].fix.startswith(f"set {key.removeprefix('model.')}: ")


def test_a_generic_model_is_compared_by_key_only() -> None:
    """transformers builds a generic model from config.json itself; its YAML's other fields
    are the plan's counts."""
    generic = _with("llama3.1-8b", family="generic", qk_layernorm=True)
    assert derived_issues(generic, fixture("llama3.1-8b"), "c.json", here) == []


def test_a_checkpoint_no_yaml_describes_is_refused_on_hf_checkpoint(tmp_path: Path) -> None:
    raw = yaml.safe_load((CONF / "model" / "qwen3-8b.yaml").read_text())
    raw["hf_checkpoint"] = str(tmp_path)
    windowed = {**fixture("qwen3-8b"), "use_sliding_window": True, "sliding_window": 4096}
    (tmp_path / "config.json").write_text(json.dumps(windowed))
    (issue,) = check_hf_config({"model": raw}, here)
    assert issue.key == "model.hf_checkpoint" and "sliding-window attention" in issue.message


def test_every_setting_no_yaml_describes_is_its_own_issue(tmp_path: Path) -> None:
    raw = yaml.safe_load((CONF / "model" / "qwen3-8b.yaml").read_text())
    raw["hf_checkpoint"] = str(tmp_path)
    hf = {**fixture("qwen3-8b"), "use_sliding_window": True, "attn_logit_softcapping": 50.0}
    (tmp_path / "config.json").write_text(json.dumps(hf | {"mlp_bias": True}))
    issues = check_hf_config({"model": raw}, here)
    assert {i.key for i in issues} == {"model.hf_checkpoint"}
    assert [i.message.rsplit("(config.json's ", 1)[1] for i in issues] == [
        "use_sliding_window)",
        "attn_logit_softcapping)",
        "mlp_bias)",
    ]


def test_a_stated_key_is_reported_once(tmp_path: Path) -> None:
    """num_nextn_predict_layers is compared by key and implied alike: one issue, the key's."""
    raw = yaml.safe_load((CONF / "model" / "deepseek-v3.yaml").read_text())
    raw["hf_checkpoint"] = str(tmp_path)
    raw["mtp_num_layers"] = 2
    (tmp_path / "config.json").write_text(json.dumps(fixture("deepseek-v3")))
    issues = check_hf_config({"model": raw}, here)
    assert [i.key for i in issues] == ["model.mtp_num_layers"]
    assert "num_nextn_predict_layers=1" in issues[0].message


def test_initial_weights_of_another_shape_are_one_issue_on_their_key(tmp_path: Path) -> None:
    """model.load and model.ref_load are compared with the model as hf_checkpoint is: one
    Issue on the key naming every field the folder's config.json says otherwise."""
    qwen = model("qwen3-4b")
    assert check_weights_config("model.load", str(tmp_path), qwen) == []  # no config.json
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_4B))
    assert check_weights_config("model.load", str(tmp_path), qwen) == []  # the same network
    smaller = {**QWEN3_4B, "num_hidden_layers": 28, "hidden_size": 2048}
    (tmp_path / "config.json").write_text(json.dumps(smaller))
    (issue,) = check_weights_config("model.load", str(tmp_path), qwen)
    assert issue.key == "model.load" and issue.value == str(tmp_path)
    assert issue.message == (
        "its config.json says num_hidden_layers=28, hidden_size=2048, where the model says "
        "num_layers=36, hidden_size=2560: the policy would start from the weights of another "
        "network"
    )
    assert issue.fix.startswith("point model.load at weights of this model's architecture")
    (issue,) = check_weights_config("model.ref_load", str(tmp_path), qwen)
    assert issue.key == "model.ref_load" and "the KL would be measured against" in issue.message


def test_a_reference_that_is_a_moe_model_names_its_experts(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**QWEN3_4B, "num_experts": 128}))
    (issue,) = check_weights_config("model.ref_load", str(tmp_path), model("qwen3-4b"))
    assert "says num_experts=128, where the model says moe=None" in issue.message
    (tmp_path / "config.json").write_text("[1, 2]")
    (issue,) = check_weights_config("model.ref_load", str(tmp_path), model("qwen3-4b"))
    assert "holds no JSON object" in issue.message and issue.fix.startswith("point model.ref_load")
