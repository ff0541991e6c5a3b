"""`rlpost new model --from-hf`: shipped models are its output, and its output validates.

tests/fixtures/hf_configs/<name>/config.json are the published config.json files of the
shipped models; each conf/model/<name>.yaml must be exactly what the command writes from it.
Tiny configs saved by transformers itself (the rope_parameters format of transformers 5)
round-trip through `rlpost validate`, which compares the YAML with the same config.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlpost.cli.main import main
from rlpost.config.hf_fields import compare
from rlpost.config.hf_model import HFConfig, architecture
from rlpost.errors import Location
from rlpost.schema import ModelConfig

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "hf_configs"
CONF_MODEL = REPO / "conf" / "model"

# name -> (checkpoint folder the shipped YAML points at, published facts to hold it to)
SHIPPED: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3-0.6b": (
        "/root/Qwen3-0.6B",
        {"hidden_size": 1024, "num_layers": 28, "kv_channels": 128, "tie_word_embeddings": True},
    ),
    "qwen3-1.7b": (
        "/root/Qwen3-1.7B",
        {"hidden_size": 2048, "ffn_hidden_size": 6144, "tie_word_embeddings": True},
    ),
    "qwen3-8b": (
        "/root/Qwen3-8B",
        {"num_layers": 36, "ffn_hidden_size": 12288, "tie_word_embeddings": False},
    ),
    "qwen3-30b-a3b": (
        "/root/Qwen3-30B-A3B",
        {
            "num_query_groups": 4,
            "moe.num_experts": 128,
            "moe.top_k": 8,
            "moe.expert_ffn_hidden_size": 768,
        },
    ),
    "llama3.1-8b": (
        "/root/Llama-3.1-8B",
        {
            "vocab_size": 128256,
            "rotary_base": 500000.0,
            "rope_scaling.factor": 8.0,
            "max_position_embeddings": 131072,
        },
    ),
    "deepseek-v3": (
        "/root/DeepSeek-V3",
        {
            "num_layers": 61,
            "moe.num_experts": 256,
            "moe.first_k_dense_layers": 3,
            "mla.kv_lora_rank": 512,
            "vocab_size": 129280,
            "rope_scaling.type": "yarn",
        },
    ),
}


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(argv)
        status = 0
    except SystemExit as exc:
        status = int(exc.code or 0)
    out, err = capsys.readouterr()
    return status, out, err


def field(model: ModelConfig, dotted: str) -> Any:
    node: Any = model
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_the_shipped_model_is_the_commands_output(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint, facts = SHIPPED[name]
    argv = [
        "new",
        "model",
        "--from-hf",
        str(FIXTURES / name),
        "--name",
        name,
        "--hf-checkpoint",
        checkpoint,
        "--ref-load",  # the torch_dist reference slime's scripts convert to and name
        f"{checkpoint}_torch_dist",
        "--out",
        "-",
    ]
    status, out, _ = run_main(argv, capsys)
    assert status == 0
    assert out == (CONF_MODEL / f"{name}.yaml").read_text()
    model = ModelConfig.model_validate(yaml.safe_load(out))
    hf = json.loads((FIXTURES / name / "config.json").read_text())
    assert compare(model, hf, "config.json", lambda key: Location()) == []
    assert {key: field(model, key) for key in facts} == facts


# The HF configs of the two hand-written shipped models (as the hf_check tests state them).
HAND_WRITTEN = {
    "qwen3-4b": {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "num_hidden_layers": 36,
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": True,
        "attention_bias": False,
    },
    "glm4.7-flash": {
        "model_type": "glm4_moe_lite",
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
        "n_group": 1,
        "topk_group": 1,
        "q_lora_rank": 768,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 192,
        "qk_rope_head_dim": 64,
        "v_head_dim": 256,
        "num_nextn_predict_layers": 1,
        "tie_word_embeddings": False,
    },
}


@pytest.mark.parametrize("name", sorted(HAND_WRITTEN))
def test_the_family_traits_reproduce_the_hand_written_models(name: str) -> None:
    shipped = ModelConfig.model_validate(yaml.safe_load((CONF_MODEL / f"{name}.yaml").read_text()))
    drawn = architecture(HFConfig(HAND_WRITTEN[name], "config.json"))
    for key, value in drawn.items():
        ours = getattr(shipped, key)
        ours = ours.model_dump() if hasattr(ours, "model_dump") else ours
        assert ours == (value if not isinstance(value, dict) else {**ours, **value}), key


def _tiny_configs() -> dict[str, Any]:
    from transformers import (
        DeepseekV3Config,
        GemmaConfig,
        Glm4Config,
        Glm4MoeConfig,
        LlamaConfig,
        MistralConfig,
        Phi3Config,
        Qwen3Config,
        Qwen3MoeConfig,
    )

    small = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        vocab_size=384,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    experts = dict(num_experts_per_tok=2, moe_intermediate_size=32)
    return {
        "qwen3": Qwen3Config(**small, head_dim=16, tie_word_embeddings=True),
        "qwen3moe": Qwen3MoeConfig(**small, num_experts=8, norm_topk_prob=True, **experts),
        "llama": LlamaConfig(
            **{**small, "max_position_embeddings": 1024},
            rope_parameters={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 256,
                "rope_theta": 500000.0,
            },
        ),
        "deepseek": DeepseekV3Config(
            **{**small, "num_key_value_heads": 4},
            n_routed_experts=8,
            n_shared_experts=1,
            first_k_dense_replace=1,
            q_lora_rank=32,
            kv_lora_rank=16,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=16,
            n_group=2,
            topk_group=1,
            **experts,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 4.0,
                "mscale": 1.0,
                "original_max_position_embeddings": 128,
                "mscale_all_dim": 1.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "rope_theta": 10000.0,
            },
        ),
        "glm4": Glm4Config(**small, head_dim=16, attention_bias=True),
        "glm4moe": Glm4MoeConfig(
            **small,
            n_routed_experts=8,
            n_shared_experts=1,
            first_k_dense_replace=1,
            use_qk_norm=True,
            **experts,
        ),
        # families megatron-core has no spec for: drawn as generic (saved from a model, a
        # config.json names its class; a bare config's is set here)
        "mistral": MistralConfig(**small, sliding_window=None, architectures=[MISTRAL]),
        "phi3": Phi3Config(**small, architectures=["Phi3ForCausalLM"]),
        "gemma": GemmaConfig(**small, head_dim=32, architectures=["GemmaForCausalLM"]),
    }


@pytest.fixture(scope="module")
def saved_tiny_configs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hf")
    for name, config in _tiny_configs().items():
        config.save_pretrained(root / name)  # config.json only, as transformers writes it
    return root


@pytest.mark.parametrize(
    "name",
    ["qwen3", "qwen3moe", "llama", "deepseek", "glm4", "glm4moe", "mistral", "phi3", "gemma"],
)
def test_a_saved_tiny_config_round_trips_through_validate(
    name: str, saved_tiny_configs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    user = tmp_path / "my_configs"
    argv = ["new", "model", "--from-hf", str(saved_tiny_configs / name), "--config-dir", str(user)]
    status, out, err = run_main(argv, capsys)
    assert status == 0, err
    written = user / "model" / f"{name}.yaml"
    assert out.startswith(f"wrote {written}")
    check = [
        "validate",
        "--no-local-checks",  # the folder holds config.json only: no weights to train
        "--config-dir",
        str(user),
        f"model={name}",
        "recipe=grpo_tiny_math",
        "hardware=cpu",
    ]
    status, out, err = run_main(check, capsys)
    assert status == 0, err  # validation compared the YAML with the same config.json
    data = yaml.safe_load(written.read_text())
    assert data["hf_checkpoint"] == str(saved_tiny_configs / name)
    if name == "qwen3moe":  # transformers 5 saves its experts as num_local_experts
        assert data["moe"]["num_experts"] == 8 and data["moe"]["expert_ffn_hidden_size"] == 32
    data["hidden_size"] = 96  # now the YAML and its checkpoint disagree
    written.write_text(yaml.safe_dump(data, sort_keys=False))
    status, _, err = run_main(check, capsys)
    assert status == 2
    assert f"{saved_tiny_configs / name / 'config.json'} says hidden_size=64" in err
    assert f"({written}:" in err


def test_rope_scaling_is_drawn_from_either_format(saved_tiny_configs: Path) -> None:
    llama = architecture(HFConfig.read(saved_tiny_configs / "llama"))
    assert llama["rope_scaling"] == {
        "type": "llama3",
        "factor": 8.0,
        "original_max_position_embeddings": 256,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
    }
    assert llama["hf_architecture"] == "LlamaForCausalLM"  # saved without `architectures`
    published = architecture(HFConfig.read(FIXTURES / "llama3.1-8b"))
    assert published["rope_scaling"]["original_max_position_embeddings"] == 8192


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (
            {"model_type": "qwen3_vl", "architectures": ["Qwen3VLForConditionalGeneration"]},
            "names Qwen3VLForConditionalGeneration",
        ),
        ({"use_sliding_window": True}, "sliding-window attention"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "RoPE scaling"),
        ({"mlp_only_layers": [3]}, "dense layers scattered"),
    ],
)
def test_what_the_schema_cannot_describe_is_refused(
    change: dict[str, Any], fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hf = {**json.loads((FIXTURES / "qwen3-8b" / "config.json").read_text()), **change}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    status, _, err = run_main(["new", "model", "--from-hf", str(tmp_path), "--out", "-"], capsys)
    assert status == 2 and fragment in err and "Traceback" not in err


def test_a_folder_without_config_json_is_a_user_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = run_main(["new", "model", "--from-hf", str(tmp_path)], capsys)
    assert status == 2 and "config.json does not exist" in err


MISTRAL = "MistralForCausalLM"


def mistral_config(**change: Any) -> dict[str, Any]:
    """A Mistral-7B-v0.3-shaped config.json (no sliding window), with `change` applied."""
    return {
        "architectures": [MISTRAL],
        "model_type": "mistral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 32768,
        **change,
    }


def test_a_family_megatron_does_not_express_is_drawn_as_generic(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(mistral_config()))
    status, out, err = run_main(["new", "model", "--from-hf", str(tmp_path), "--out", "-"], capsys)
    assert status == 0, err
    data = yaml.safe_load(out)
    assert data["family"] == "generic" and data["hf_architecture"] == MISTRAL
    assert data["num_query_groups"] == 8 and data["kv_channels"] == 128
    assert data["ffn_hidden_size"] == 14336 and data["rotary_base"] == 1000000.0
    assert data["activation"] == "swiglu" and data["params_dtype"] == "bf16"
    assert data["ref_load"] == data["hf_checkpoint"]  # no torch_dist: the torch trainer reads HF
    assert data["description"].endswith(
        "(MistralForCausalLM, generic dense; 32 layers, hidden 4096, GQA 32/8, untied embeddings)"
    )


def test_mixtral_style_experts_are_its_mlps() -> None:
    """Mixtral keys its experts num_local_experts, sized by intermediate_size (transformers 5
    saves Qwen3-MoE's experts under the same key, beside moe_intermediate_size)."""
    hf = mistral_config(
        architectures=["MixtralForCausalLM"], model_type="mixtral", num_local_experts=8
    )
    facts = architecture(HFConfig(hf | {"num_experts_per_tok": 2}, "config.json"))
    assert facts["family"] == "generic"
    assert facts["moe"]["num_experts"] == 8 and facts["moe"]["top_k"] == 2
    assert facts["moe"]["expert_ffn_hidden_size"] == 14336


def test_a_class_that_adds_what_its_config_omits_is_drawn_with_it() -> None:
    hf = {**json.loads((FIXTURES / "qwen3-8b" / "config.json").read_text())}
    hf |= {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}
    del hf["attention_bias"]
    facts = architecture(HFConfig(hf, "config.json"))
    assert facts["family"] == "generic" and facts["add_qkv_bias"] is True  # Qwen2's QKV bias
    gemma = hf | {"model_type": "gemma", "architectures": ["GemmaForCausalLM"]}
    facts = architecture(HFConfig(gemma | {"hidden_act": "gelu_pytorch_tanh"}, "config.json"))
    assert facts["activation"] == "geglu"  # Gemma gates its MLP with GELU


def test_rope_scaling_keeps_only_the_fields_its_type_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hf = json.loads((FIXTURES / "llama3.1-8b" / "config.json").read_text())
    hf["rope_scaling"] |= {"beta_fast": 16.0, "mscale": 0.5}  # yarn's: llama3 never reads them
    (tmp_path / "config.json").write_text(json.dumps(hf))
    status, out, err = run_main(["new", "model", "--from-hf", str(tmp_path), "--out", "-"], capsys)
    assert status == 0, err
    model = ModelConfig.model_validate(yaml.safe_load(out))
    assert set(yaml.safe_load(out)["rope_scaling"]) == {
        "type",
        "factor",
        "original_max_position_embeddings",
        "low_freq_factor",
        "high_freq_factor",
    }
    assert compare(model, hf, "config.json", lambda key: Location()) == []


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (
            {"sliding_window": 4096, "sliding_window_pattern": 6},  # Gemma 3
            "sets sliding_window_pattern=6: windowed and full attention layers mixed",
        ),
        ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
        ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0: softcapped attention"),
        ({"hidden_act": "gelu_pytorch_tanh"}, "hidden_act='gelu_pytorch_tanh'"),
        ({"architectures": ["MistralModel"]}, "names MistralModel"),
        ({"hidden_size": None}, "does not state hidden_size"),
    ],
)
def test_what_a_generic_model_cannot_describe_is_refused_by_name(
    change: dict[str, Any], fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(mistral_config(**change)))
    status, _, err = run_main(["new", "model", "--from-hf", str(tmp_path), "--out", "-"], capsys)
    assert status == 2 and fragment in err and "Traceback" not in err, err


def test_every_setting_no_model_yaml_can_describe_is_named_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Gemma-2-2B's config.json (as transformers saves it, with layer_types): its mixed
    attention layers, its attention softcap and its activation are refused together, so a
    user learns all three from one run."""
    gemma2 = mistral_config(
        architectures=["Gemma2ForCausalLM"],
        model_type="gemma2",
        hidden_act="gelu_pytorch_tanh",
        sliding_window=4096,
        max_position_embeddings=8192,
        layer_types=["sliding_attention", "full_attention"] * 13,
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
        query_pre_attn_scalar=256,
    )
    (tmp_path / "config.json").write_text(json.dumps(gemma2))
    status, _, err = run_main(["new", "model", "--from-hf", str(tmp_path), "--out", "-"], capsys)
    assert status == 2 and "Traceback" not in err, err
    assert "rlpost: 3 configuration errors" in err, err
    assert "sets layer_types=['sliding_attention']: attention other than full" in err
    assert "sets attn_logit_softcapping=50.0: softcapped attention" in err
    assert "sets hidden_act='gelu_pytorch_tanh': supported: silu, swish, gelu" in err


@pytest.mark.parametrize("backend", ["torch", "megatron"])
def test_the_written_reference_exists_and_a_kl_validates(
    backend: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny = REPO / "rlpost" / "assets" / "qwen3-tiny"
    argv = [
        "new",
        "model",
        "--from-hf",
        str(tiny),
        "--name",
        "tiny2",
        "--config-dir",
        str(tmp_path),
    ]
    status, _, err = run_main(argv, capsys)
    assert status == 0, err
    data = yaml.safe_load((tmp_path / "model" / "tiny2.yaml").read_text())
    assert Path(data["ref_load"]).is_dir()
    check = [
        "validate",
        "--config-dir",
        str(tmp_path),
        "model=tiny2",
        "recipe.algo.kl_loss_coef=0.01",
        f"trainer.backend={backend}",
    ]
    status, _, err = run_main(check, capsys)
    assert status == 0, err  # the local checks read the reference the KL needs


def test_a_file_named_like_a_shipped_one_is_refused_and_the_hint_names_the_written_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Hydra searches conf/ before a config dir: model/qwen3-tiny.yaml there would never be
    loaded and `model=qwen3-tiny` would check the shipped model, so nothing is written; the
    hint that follows a write names the file written (--out's stem, its config dir)."""
    tiny = str(REPO / "rlpost" / "assets" / "qwen3-tiny")
    user = tmp_path / "my_configs"
    status, _, err = run_main(
        ["new", "model", "--from-hf", tiny, "--config-dir", str(user)], capsys
    )
    assert status == 2 and "--name = 'qwen3-tiny'" in err and "--name my_qwen3-tiny" in err
    recipes = user / "recipe"
    recipes.mkdir(parents=True)
    argv = ["new", "recipe", "grpo_dapo", "--from", "grpo_tiny_math", "--config-dir", str(user)]
    status, _, err = run_main(argv, capsys)
    assert status == 2 and "conf/recipe/grpo_dapo.yaml under the same name" in err
    assert not (user / "model" / "qwen3-tiny.yaml").exists()
    assert not (recipes / "grpo_dapo.yaml").exists()
    out = user / "model" / "tiny_copy.yaml"
    status, text, err = run_main(["new", "model", "--from-hf", tiny, "--out", str(out)], capsys)
    assert status == 0, err
    assert f"rlpost validate --config-dir {user} model=tiny_copy recipe=" in text
    check = ["validate", "--config-dir", str(user), "model=tiny_copy", "recipe=grpo_tiny_math"]
    status, _, err = run_main(check, capsys)
    assert status == 0, err


def test_a_window_narrower_than_the_context_bounds_the_samples(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mistral 7B v0.1 and Phi-3-mini-4k attend within a window (4096, 2047) narrower than
    their context: drawn as model.sliding_window, held to config.json by validate, and a
    recipe whose samples could pass the window is refused naming its length; within the
    window, windowed attention is full attention, as the trainers compute it."""
    ckpt = tmp_path / "mistral-7b-v0.1"
    ckpt.mkdir()
    small = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, head_dim=64)
    small |= dict(num_attention_heads=4, num_key_value_heads=2, vocab_size=1024)
    hf = mistral_config(sliding_window=4096, **small)
    (ckpt / "config.json").write_text(json.dumps(hf))
    user = tmp_path / "my_configs"
    status, _, err = run_main(
        ["new", "model", "--from-hf", str(ckpt), "--config-dir", str(user)], capsys
    )
    assert status == 0, err
    written = user / "model" / "mistral-7b-v0.1.yaml"
    assert yaml.safe_load(written.read_text())["sliding_window"] == 4096
    check = ["validate", "--no-local-checks", "--config-dir", str(user), "model=mistral-7b-v0.1"]
    status, _, err = run_main([*check, "recipe=grpo_tiny_math", "hardware=cpu"], capsys)
    assert status == 0, err  # samples of at most 16 tokens
    status, _, err = run_main([*check, "recipe=grpo_dapo", "hardware=h100x8"], capsys)
    assert status == 2 and "Traceback" not in err
    assert "recipe.rollout.max_response_len = 8192" in err, err
    assert "beyond model.sliding_window=4096" in err and "<= 4096" in err, err
    data = yaml.safe_load(written.read_text()) | {"sliding_window": None}
    written.write_text(yaml.safe_dump(data, sort_keys=False))
    status, _, err = run_main([*check, "recipe=grpo_tiny_math", "hardware=cpu"], capsys)
    assert status == 2 and "model.sliding_window" in err and "window of 4096" in err, err


def test_a_named_family_with_a_window_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """megatron-core's specs have no window: a llama config.json with one is refused."""
    hf = json.loads((FIXTURES / "llama3.1-8b" / "config.json").read_text()) | {
        "sliding_window": 4096
    }
    (tmp_path / "config.json").write_text(json.dumps(hf))
    status, _, err = run_main(["new", "model", "--from-hf", str(tmp_path), "--out", "-"], capsys)
    assert status == 2 and "megatron-core's llama spec does not build" in err, err
