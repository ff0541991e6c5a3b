"""A model YAML from a Hugging Face config.json, with every architecture fact filled in.

The HF keys are read by `rlpost.config.hf_fields`' own map, so a generated file agrees with its
config.json by construction; facts a config.json does not state (GLM-4's sandwich norms,
Qwen3's QK-norm, a family's router) come from the family's traits, keyed by `model_type`.
A `model_type` outside the seven families is drawn as the `generic` family (trained by the
torch trainer through transformers), from what its config.json states; what the schema cannot
describe (windowed and full layers mixed, attention softcapping, ...) is refused, naming
the key.
Published configs (rope_theta, rope_scaling) and transformers 5 ones (rope_parameters) both
read. Reads JSON only: transformers is not imported.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlpost.config.hf_fields import (
    EXPERT_KEYS,
    MISSING,
    ROPE_KEYS,
    ROPE_SCOPES,
    compare,
    hf_value,
)
from rlpost.errors import Issue, Location, UserError, did_you_mean
from rlpost.schema import GENERIC_FAMILY, ModelConfig, rope_fields_unread


@dataclass(frozen=True)
class FamilyTraits:
    """What a family's modelling code does that its config.json does not say."""

    family: str
    architecture: str  # the CausalLM class, for a config.json saved without `architectures`
    qk_layernorm: bool = False
    qk_norm_key: str | None = None  # an HF key that states it, when the family has one
    sandwich_norms: bool = False  # GLM-4: norms after attention and after the MLP too
    rotary_interleaved: bool = False
    router_score: str = "softmax"
    router_expert_bias: bool = False
    norm_topk_prob: bool = True  # the family's default when config.json omits it
    qkv_bias: bool = False  # the class adds QKV biases without an `attention_bias` key
    gated_gelu: bool = False  # the class gates its MLP with GELU (GeGLU)
    tied_embeddings: bool = False  # the class ties them when config.json omits the key


FAMILIES: dict[str, FamilyTraits] = {
    "qwen3": FamilyTraits("qwen3", "Qwen3ForCausalLM", qk_layernorm=True),
    "qwen3_moe": FamilyTraits(
        "qwen3_moe", "Qwen3MoeForCausalLM", qk_layernorm=True, norm_topk_prob=False
    ),
    "glm4": FamilyTraits("glm4", "Glm4ForCausalLM", sandwich_norms=True, rotary_interleaved=True),
    "glm4_moe": FamilyTraits(
        "glm4_moe",
        "Glm4MoeForCausalLM",
        qk_norm_key="use_qk_norm",
        router_score="sigmoid",
        router_expert_bias=True,
    ),
    # multi-latent attention normalises its q and kv latents (megatron-core: qk_layernorm)
    "glm4_moe_lite": FamilyTraits(
        "glm4_moe_lite",
        "Glm4MoeLiteForCausalLM",
        qk_layernorm=True,
        router_score="sigmoid",
        router_expert_bias=True,
    ),
    "llama": FamilyTraits("llama", "LlamaForCausalLM"),
    "deepseek_v3": FamilyTraits(
        "deepseek_v3",
        "DeepseekV3ForCausalLM",
        qk_layernorm=True,
        router_score="sigmoid",
        router_expert_bias=True,
    ),
}
# model types outside the seven whose modelling code has facts their config.json omits
GENERIC_TRAITS: dict[str, FamilyTraits] = {
    "qwen2": FamilyTraits(GENERIC_FAMILY, "Qwen2ForCausalLM", qkv_bias=True),
    # Gemma's published config.json states no tie_word_embeddings: GemmaConfig ties them
    "gemma": FamilyTraits(
        GENERIC_FAMILY, "GemmaForCausalLM", gated_gelu=True, tied_embeddings=True
    ),
}
DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
ACTIVATIONS = {"silu": "swiglu", "swish": "swiglu", "gelu": "gelu"}  # gated MLPs: SwiGLU
GELUS = ("gelu", "gelu_pytorch_tanh", "gelu_new")  # a gated-GELU class may name any of them
SUPPORTED_ROPE_SCALING = ("llama3", "yarn")


class HFConfig:
    """A parsed config.json and the file it came from, with typed lookups."""

    def __init__(self, data: Mapping[str, Any], path: str) -> None:
        self.data, self.path = data, path

    @classmethod
    def read(cls, folder: Path) -> HFConfig:
        path = folder / "config.json" if folder.is_dir() else folder
        if not path.is_file():
            raise _error("--from-hf", str(folder), f"{path} does not exist", _FOLDER_FIX)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise _error(
                "--from-hf", str(path), f"cannot read it as JSON: {exc}", _FOLDER_FIX
            ) from None
        if not isinstance(data, dict):
            raise _error("--from-hf", str(path), "config.json is not a JSON object", _FOLDER_FIX)
        return cls(data, str(path))

    def get(self, *keys: str, default: Any = MISSING) -> Any:
        """The first of `keys` the config states (dotted keys look inside nested objects)."""
        for key in keys:
            value = hf_value(self.data, key)
            if value is not MISSING and value is not None:
                return value
        return default

    def require(self, *keys: str) -> Any:
        value = self.get(*keys)
        if value is MISSING:
            raise _error(
                keys[0],
                None,
                f"{self.path} does not state {' or '.join(keys)}, which every model YAML needs",
                "use the config.json of a complete HF checkpoint",
            )
        return value


_FOLDER_FIX = "point --from-hf at a Hugging Face checkpoint folder (one with a config.json)"


def _error(key: str, value: Any, message: str, fix: str) -> UserError:
    return UserError([Issue(key=key, value=value, message=message, fix=fix)])


def _traits(hf: HFConfig) -> FamilyTraits:
    """The named family's traits; any other causal LM is `generic`, named by its class."""
    model_type = hf.get("model_type", "text_config.model_type", default=None)
    traits = FAMILIES.get(str(model_type)) or GENERIC_TRAITS.get(str(model_type))
    if traits is not None:
        return traits
    architectures = hf.get("architectures", default=None)
    causal = isinstance(architectures, list) and architectures
    if not causal or not str(architectures[0]).endswith("ForCausalLM"):
        named = f"names {architectures[0]}" if causal else "states no architectures"
        raise _error(
            "architectures",
            architectures,
            f"{hf.path} is a {model_type!r} model, outside the families rlpost has a "
            f"megatron-core spec for, and {named}: a model of another architecture is "
            "trained as the causal LM class (...ForCausalLM) its config.json names."
            f"{did_you_mean(str(model_type), FAMILIES)}",
            f"point --from-hf at a causal LM checkpoint (families with a megatron-core spec: "
            f"{', '.join(FAMILIES)}; any other ...ForCausalLM is drawn as {GENERIC_FAMILY})",
        )
    return FamilyTraits(GENERIC_FAMILY, str(architectures[0]))


def _unsupported(hf: HFConfig, key: str, value: Any, why: str) -> Issue:
    return Issue(
        key=key,
        value=value,
        message=f"{hf.path} sets {key}={value!r}: {why}",
        fix="no model YAML can describe this checkpoint yet; it needs a schema field",
    )


def sliding_window(hf: HFConfig) -> int | None:
    """The attention window config.json sets, where it is narrower than the context; None
    where every token attends to the whole sample. Qwen-style configs switch it with
    use_sliding_window (refused when on: their window covers some layers only)."""
    if hf.get("use_sliding_window") is not MISSING:
        return None
    window = hf.get("sliding_window", default=None)
    context = hf.get("max_position_embeddings", default=None)
    if isinstance(window, int) and (context is None or window < context):
        return window
    return None


def _sliding_window_issues(hf: HFConfig) -> list[Issue]:
    """A window narrower than the context changes what a token attends to, and both
    trainers attend over the whole sample. A generic model states it as model.sliding_window,
    which bounds its samples (a sample within the window attends as with full attention);
    megatron-core's specs for the named families have no window."""
    issues = []
    if hf.get("use_sliding_window", default=False):
        issues.append(_unsupported(hf, "use_sliding_window", True, "sliding-window attention"))
    window = sliding_window(hf)
    model_type = hf.get("model_type", "text_config.model_type", default=None)
    if window is not None and model_type in FAMILIES:
        context = hf.get("max_position_embeddings", default=None)
        why = (
            f"sliding-window attention narrower than the context ({context} positions), "
            f"which megatron-core's {model_type} spec does not build"
        )
        issues.append(_unsupported(hf, "sliding_window", window, why))
    kinds = hf.get("layer_types", default=[])
    windowed = [k for k in kinds if k != "full_attention"] if isinstance(kinds, list) else []
    if windowed:
        why = "attention other than full"
        issues.append(_unsupported(hf, "layer_types", sorted(set(windowed)), why))
    pattern = hf.get("sliding_window_pattern", default=None)  # Gemma 3 before layer_types
    if window is not None and pattern is not None:
        why = "windowed and full attention layers mixed"
        issues.append(_unsupported(hf, "sliding_window_pattern", pattern, why))
    return issues


def expressible_issues(hf: HFConfig) -> list[Issue]:
    """Each setting of `hf` the schema cannot describe, all of them: a user fixing one should
    not rerun to meet the next."""
    issues = _sliding_window_issues(hf)
    softcap = hf.get("attn_logit_softcapping", default=None)
    if softcap is not None:
        why = "softcapped attention scores (the trainers' SDPA attention has no softcap)"
        issues.append(_unsupported(hf, "attn_logit_softcapping", softcap, why))
    if hf.get("mlp_bias", default=False):
        issues.append(_unsupported(hf, "mlp_bias", True, "biases on the MLP projections"))
    if hf.get("mlp_only_layers", default=[]):
        why = "dense layers scattered among MoE layers (only a dense prefix is expressible)"
        issues.append(_unsupported(hf, "mlp_only_layers", hf.get("mlp_only_layers"), why))
    step = hf.get("decoder_sparse_step", default=1)
    if step != 1:
        issues.append(_unsupported(hf, "decoder_sparse_step", step, "MoE on every n-th layer only"))
    return issues


def check_expressible(hf: HFConfig) -> None:
    """Refuse architectures the schema cannot describe rather than describe them wrongly,
    naming every setting at once."""
    issues = expressible_issues(hf)
    if issues:
        raise UserError(issues)


def _rope_scaling_kind(hf: HFConfig) -> tuple[str, Any] | None:
    """The object that states RoPE scaling and its type; None where there is no scaling."""
    scope = next((s for s in ROPE_SCOPES if isinstance(hf.get(s, default=None), dict)), None)
    if scope is None:
        return None
    kind = hf.get(*(f"{scope}.{k}" for k in ROPE_KEYS["type"]), default=None)
    return None if kind in (None, "default") else (scope, kind)


def _drawn_issues(hf: HFConfig, traits: FamilyTraits) -> list[Issue]:
    """What architecture() cannot draw from `hf`: each setting at once."""
    issues = expressible_issues(hf)
    scaling = _rope_scaling_kind(hf)
    if scaling is not None and scaling[1] not in SUPPORTED_ROPE_SCALING:
        why = f"only {' and '.join(SUPPORTED_ROPE_SCALING)} RoPE scaling are expressible"
        issues.append(_unsupported(hf, f"{scaling[0]}.rope_type", scaling[1], why))
    act = hf.get("hidden_act", "hidden_activation", default="silu")
    if not (traits.gated_gelu and act in GELUS) and act not in ACTIVATIONS:
        why = f"supported: {', '.join(ACTIVATIONS)}"
        issues.append(_unsupported(hf, "hidden_act", act, why))
    return issues


def _rope_scaling(hf: HFConfig) -> dict[str, Any] | None:
    scaling = _rope_scaling_kind(hf)
    if scaling is None:
        return None
    scope, kind = scaling
    found: dict[str, Any] = {"type": kind}
    unread = rope_fields_unread(kind)  # transformers reads them no more than rlpost does
    for field, keys in ROPE_KEYS.items():
        value = hf.get(*(f"{scope}.{k}" for k in keys))
        if field != "type" and field not in unread and value is not MISSING:
            found[field] = value
    return found


def _present(facts: dict[str, Any]) -> dict[str, Any]:
    """Without the facts the config does not state (their schema default is None)."""
    return {key: value for key, value in facts.items() if value is not None}


def _attention(hf: HFConfig, traits: FamilyTraits) -> dict[str, Any]:
    heads = hf.require("num_attention_heads")
    facts: dict[str, Any] = {
        "num_attention_heads": heads,
        "num_query_groups": hf.get("num_key_value_heads", default=heads),
    }
    if hf.get("kv_lora_rank") is MISSING:  # multi-latent attention has its own head geometry
        facts["kv_channels"] = hf.get("head_dim", default=hf.require("hidden_size") // heads)
    return facts


def _mla(hf: HFConfig) -> dict[str, Any] | None:
    if hf.get("kv_lora_rank") is MISSING:
        return None
    return _present(
        {
            "q_lora_rank": hf.get("q_lora_rank", default=None),
            "kv_lora_rank": hf.require("kv_lora_rank"),
            "qk_head_dim": hf.require("qk_nope_head_dim"),
            "qk_pos_emb_head_dim": hf.require("qk_rope_head_dim"),
            "v_head_dim": hf.require("v_head_dim"),
        }
    )


def _moe(hf: HFConfig, traits: FamilyTraits) -> dict[str, Any] | None:
    experts = hf.get(*EXPERT_KEYS, default=0)
    if not experts:
        return None
    # Mixtral's experts are its MLPs: without moe_intermediate_size, intermediate_size
    expert_ffn = hf.require("moe_intermediate_size", "intermediate_size")
    shared = hf.get("n_shared_experts", default=0)
    topk_method = hf.get("topk_method", default=None)
    return _present(
        {
            "num_experts": experts,
            "top_k": hf.require("num_experts_per_tok"),
            "expert_ffn_hidden_size": expert_ffn,
            "num_shared_experts": shared,
            "shared_expert_ffn_hidden_size": shared * expert_ffn,
            "first_k_dense_layers": hf.get("first_k_dense_replace", default=0),
            "router_score": hf.get("scoring_func", default=traits.router_score),
            "router_expert_bias": traits.router_expert_bias or topk_method == "noaux_tc",
            "router_topk_scaling_factor": hf.get("routed_scaling_factor", default=1.0),
            "router_dtype": "fp32",
            "router_num_groups": hf.get("n_group", default=None),
            "router_group_topk": hf.get("topk_group", default=None),
            "norm_topk_prob": hf.get("norm_topk_prob", default=traits.norm_topk_prob),
            "grouped_gemm": True,
        }
    )


def _activation(hf: HFConfig, traits: FamilyTraits) -> str:
    act = hf.get("hidden_act", "hidden_activation", default="silu")
    return "geglu" if traits.gated_gelu and act in GELUS else ACTIVATIONS[act]


def _qk_layernorm(hf: HFConfig, traits: FamilyTraits) -> bool:
    if traits.qk_norm_key is not None:
        return bool(hf.get(traits.qk_norm_key, default=traits.qk_layernorm))
    return traits.qk_layernorm


def architecture(hf: HFConfig) -> dict[str, Any]:
    """Every ModelConfig architecture field, in schema order (no name or checkpoints)."""
    traits = _traits(hf)
    issues = _drawn_issues(hf, traits)
    if issues:
        raise UserError(issues)
    architectures = hf.get("architectures", default=[traits.architecture])
    facts: dict[str, Any] = {
        "family": traits.family,
        "hf_architecture": architectures[0] if isinstance(architectures, list) else architectures,
        "num_layers": hf.require("num_hidden_layers"),
        "hidden_size": hf.require("hidden_size"),
        "ffn_hidden_size": hf.require("intermediate_size"),
        **_attention(hf, traits),
        "vocab_size": hf.require("vocab_size"),
        "max_position_embeddings": hf.require("max_position_embeddings"),
        "rotary_base": hf.get("rope_theta", "rope_parameters.rope_theta", default=10000.0),
        "rotary_percent": hf.get(
            "partial_rotary_factor", "rope_parameters.partial_rotary_factor", default=1.0
        ),
        "rotary_interleaved": traits.rotary_interleaved,
        "rope_scaling": _rope_scaling(hf),
        "norm_epsilon": hf.get("rms_norm_eps", default=1e-6),
        "qk_layernorm": _qk_layernorm(hf, traits),
        "add_qkv_bias": bool(hf.get("attention_bias", default=traits.qkv_bias)),
        "add_bias_linear": False,
        "post_self_attn_layernorm": traits.sandwich_norms,
        "post_mlp_layernorm": traits.sandwich_norms,
        "sliding_window": sliding_window(hf),
        "tie_word_embeddings": bool(hf.get("tie_word_embeddings", default=traits.tied_embeddings)),
        "activation": _activation(hf, traits),
        "mtp_num_layers": hf.get("num_nextn_predict_layers", default=0),
        "params_dtype": DTYPES.get(str(hf.get("torch_dtype", "dtype", default="")), "bf16"),
        "mla": _mla(hf),
        "moe": _moe(hf, traits),
    }
    return _present(facts)


def checkpoint_paths(hf_checkpoint: str, ref_load: str | None = None) -> dict[str, str]:
    """The policy starts from the HF folder, and the KL's reference is that folder too unless
    given: both trainers read an HF folder as the reference, and a torch_dist one exists only
    once converted (tools/convert_hf_to_megatron.py; name it then, as slime's scripts name
    theirs). Runs write under run.dir."""
    base = hf_checkpoint.rstrip("/")
    return {"hf_checkpoint": base, "ref_load": (ref_load or base).rstrip("/")}


def describe(facts: Mapping[str, Any], display: str) -> str:
    """A one-line description from the facts ('Qwen3-8B (qwen3 dense; 36 layers, ...)')."""
    moe, mla, scaling = facts.get("moe"), facts.get("mla"), facts.get("rope_scaling")
    kind = "MoE" if moe else "dense"
    kind += " with multi-latent attention" if mla else ""
    parts = [f"{facts['num_layers']} layers"]
    if moe and moe["first_k_dense_layers"]:
        parts[0] += f" ({moe['first_k_dense_layers']} dense)"
    parts.append(f"hidden {facts['hidden_size']}")
    if moe:
        shared = f" + {moe['num_shared_experts']} shared" if moe["num_shared_experts"] else ""
        parts.append(f"{moe['num_experts']} experts top-{moe['top_k']}{shared}")
    if not mla:
        parts.append(f"GQA {facts['num_attention_heads']}/{facts['num_query_groups']}")
    if facts["qk_layernorm"] and not mla:
        parts.append("QK-norm")
    if scaling:
        parts.append(f"{scaling['type']} RoPE scaling x{scaling['factor']:g}")
    if facts["mtp_num_layers"]:
        parts.append(f"{facts['mtp_num_layers']} MTP layer(s)")
    parts.append("tied embeddings" if facts["tie_word_embeddings"] else "untied embeddings")
    family = facts["family"]
    if family == GENERIC_FAMILY:
        family = f"{facts['hf_architecture']}, {GENERIC_FAMILY}"
    return f"{display} ({family} {kind}; {', '.join(parts)})"


def model_fields(
    hf: HFConfig,
    name: str,
    hf_checkpoint: str,
    description: str | None = None,
    *,
    ref_load: str | None = None,
) -> dict[str, Any]:
    """The whole model YAML as a mapping, checked by the schema and against `hf` itself."""
    facts = architecture(hf)
    text = description or describe(facts, Path(hf_checkpoint.rstrip("/")).name)
    fields = {
        "name": name,
        "description": text,
        **facts,
        **checkpoint_paths(hf_checkpoint, ref_load),
    }
    cross_check(fields, hf)
    return fields


def cross_check(fields: Mapping[str, Any], hf: HFConfig) -> None:
    """The schema's own validation, then hf_fields' comparison with the same config.json."""
    from pydantic import ValidationError

    try:
        model = ModelConfig.model_validate(fields)
    except ValidationError as exc:
        raise _error(
            "model",
            fields.get("name"),
            f"the YAML drawn from {hf.path} does not validate: {exc}",
            "the HF config is inconsistent; check it",
        ) from None
    issues = compare(model, hf.data, hf.path, lambda key: Location(file="(generated)"))
    if issues:
        raise UserError(issues, title="disagreement with config.json")
