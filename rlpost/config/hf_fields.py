"""The model YAML's architecture fields, the HF config.json keys that hold them, and their
comparison: one Mismatch (and one Issue) per field where the two disagree. What hf_check
reports of a model YAML, what hf_model checks of the YAML it draws from a config.json, and
what the trainers read of a config.json. Reads JSON only: transformers is not imported.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rlpost.errors import Issue, Location
from rlpost.schema import ModelConfig, rope_fields_unread

MISSING = object()


@dataclass(frozen=True)
class FieldMap:
    """A ModelConfig field path ('moe.top_k') and the HF keys that hold it, first found wins."""

    field: str
    hf_keys: tuple[str, ...]


ARCHITECTURE = (
    FieldMap("hf_architecture", ("architectures",)),
    FieldMap("num_layers", ("num_hidden_layers",)),
    FieldMap("hidden_size", ("hidden_size",)),
    FieldMap("ffn_hidden_size", ("intermediate_size",)),
    FieldMap("num_attention_heads", ("num_attention_heads",)),
    FieldMap("num_query_groups", ("num_key_value_heads",)),
    FieldMap("kv_channels", ("head_dim",)),
    FieldMap("vocab_size", ("vocab_size",)),
    FieldMap("max_position_embeddings", ("max_position_embeddings",)),
    FieldMap("rotary_base", ("rope_theta", "rope_parameters.rope_theta")),
    FieldMap("rotary_percent", ("partial_rotary_factor", "rope_parameters.partial_rotary_factor")),
    FieldMap("norm_epsilon", ("rms_norm_eps",)),
    FieldMap("tie_word_embeddings", ("tie_word_embeddings",)),
    FieldMap("add_qkv_bias", ("attention_bias",)),
    FieldMap("mtp_num_layers", ("num_nextn_predict_layers",)),
)
MOE = (
    FieldMap("moe.num_experts", ("n_routed_experts", "num_experts", "num_local_experts")),
    FieldMap("moe.top_k", ("num_experts_per_tok",)),
    FieldMap("moe.expert_ffn_hidden_size", ("moe_intermediate_size",)),
    FieldMap("moe.num_shared_experts", ("n_shared_experts",)),
    FieldMap("moe.first_k_dense_layers", ("first_k_dense_replace",)),
    FieldMap("moe.router_topk_scaling_factor", ("routed_scaling_factor",)),
)
MLA = (
    FieldMap("mla.q_lora_rank", ("q_lora_rank",)),
    FieldMap("mla.kv_lora_rank", ("kv_lora_rank",)),
    FieldMap("mla.qk_head_dim", ("qk_nope_head_dim",)),
    FieldMap("mla.qk_pos_emb_head_dim", ("qk_rope_head_dim",)),
    FieldMap("mla.v_head_dim", ("v_head_dim",)),
)
# transformers 5 writes `rope_parameters`; older configs, and most published ones, `rope_scaling`
ROPE_SCOPES = ("rope_scaling", "rope_parameters")
ROPE_KEYS = {
    "type": ("rope_type", "type"),
    "factor": ("factor",),
    "original_max_position_embeddings": ("original_max_position_embeddings",),
    "low_freq_factor": ("low_freq_factor",),
    "high_freq_factor": ("high_freq_factor",),
    "beta_fast": ("beta_fast",),
    "beta_slow": ("beta_slow",),
    "mscale": ("mscale",),
    "mscale_all_dim": ("mscale_all_dim",),
}
ROPE_SCALING = tuple(
    FieldMap(f"rope_scaling.{field}", tuple(f"{s}.{k}" for s in ROPE_SCOPES for k in keys))
    for field, keys in ROPE_KEYS.items()
)
UNSCALED_ROPE_TYPES = (None, "default")
# transformers 5 saves Qwen3-MoE's num_experts as num_local_experts (Mixtral's key)
EXPERT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts")


def hf_value(hf: Mapping[str, Any], dotted: str) -> Any:
    """`hf[a][b]` for 'a.b', looking inside `text_config` too; MISSING when absent."""
    for scope in (hf, hf.get("text_config") or {}):
        node: Any = scope
        for part in dotted.split("."):
            if not isinstance(node, Mapping) or part not in node:
                node = MISSING
                break
            node = node[part]
        if node is not MISSING:
            return node
    return MISSING


def _first(hf: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[str, Any]:
    for key in keys:
        value = hf_value(hf, key)
        if value is not MISSING:
            return key, value
    return keys[0], MISSING


def same_value(ours: Any, theirs: Any) -> bool:
    if isinstance(ours, bool) or isinstance(theirs, bool):
        return ours is theirs or ours == theirs
    if isinstance(ours, int | float) and isinstance(theirs, int | float):
        return math.isclose(ours, theirs, rel_tol=1e-9, abs_tol=0.0)
    return bool(ours == theirs)


def model_value(model: ModelConfig, field: str) -> Any:
    node: Any = model
    for part in field.split("."):
        node = getattr(node, part, None)
    return node


Locate = Callable[[str], Location]


@dataclass(frozen=True)
class Mismatch:
    """A field of the model and what a config.json says of it instead. `section`: the
    model has a moe or rope_scaling section and the checkpoint not, or the reverse."""

    field: str
    ours: Any
    hf_key: str
    theirs: Any  # MISSING: the config.json does not state it
    section: str | None = None

    def stated(self) -> str:
        """What the config.json says, as `hf_key=value` (or that it lacks the key)."""
        return f"no {self.hf_key}" if self.theirs is MISSING else f"{self.hf_key}={self.theirs!r}"


def mismatches(model: ModelConfig, hf: Mapping[str, Any]) -> list[Mismatch]:
    """Every field the HF config states and `model` disagrees with, then a moe or
    rope_scaling section that one of the two has and the other not."""
    maps = list(ARCHITECTURE)
    maps += MOE if model.moe is not None else []
    maps += MLA if model.mla is not None else []
    if model.rope_scaling is not None:
        unread = {f"rope_scaling.{f}" for f in rope_fields_unread(model.rope_scaling.type)}
        maps += [m for m in ROPE_SCALING if m.field not in unread]
    found = []
    for mapping in maps:
        hf_key, theirs = _first(hf, mapping.hf_keys)
        ours = model_value(model, mapping.field)
        if theirs is MISSING or (ours is None and mapping.field == "kv_channels"):
            continue  # the HF file does not state it (or the YAML derives it): nothing to compare
        if mapping.field == "hf_architecture" and isinstance(theirs, list):
            theirs = theirs[0] if theirs else MISSING
        if theirs is MISSING or same_value(ours, theirs):
            continue
        found.append(Mismatch(mapping.field, ours, hf_key, theirs))
    sections = (_moe_section(model, hf), _rope_section(model, hf))
    return found + [m for m in sections if m is not None]


def compare(
    model: ModelConfig, hf: Mapping[str, Any], config_file: str, locate: Locate
) -> list[Issue]:
    """One Issue per field where `model` and the HF config disagree."""
    return [
        _mismatch(m, config_file, locate)
        if m.section is None
        else _section_issue(m, config_file, locate)
        for m in mismatches(model, hf)
    ]


def setter_and_fix(where: Location, field: str, theirs: Any) -> tuple[str, str]:
    """Who set model.`field` (a model YAML, the command line, the schema's default) and how
    to set it to `theirs` there."""
    value = json.dumps(theirs)
    if where.override is not None:
        return (
            f"the command line ({where.override})",
            f"set model.{field}={value} on the command line",
        )
    if where.file is not None:
        return where.file, f"set {field}: {value} in {where.file}"
    return "the schema's default", f"set {field}: {value} in the model YAML"


def _mismatch(m: Mismatch, config_file: str, locate: Locate) -> Issue:
    key = f"model.{m.field}"
    where = locate(key)
    setter, set_it = setter_and_fix(where, m.field, m.theirs)
    return Issue(
        key=key,
        value=m.ours,
        message=f"{setter} says {m.field}={m.ours!r}, but {config_file} says "
        f"{m.stated()}: the model would not match its checkpoint",
        fix=f"{set_it}, or point model.hf_checkpoint at the checkpoint this YAML describes",
        location=where,
    )


def _moe_section(model: ModelConfig, hf: Mapping[str, Any]) -> Mismatch | None:
    hf_key, experts = _first(hf, EXPERT_KEYS)
    if isinstance(experts, int) and experts > 0 and model.moe is None:
        return Mismatch("moe", None, hf_key, experts, section="moe")
    if model.moe is not None and experts is MISSING:
        keys = " or ".join(EXPERT_KEYS)
        return Mismatch("moe.num_experts", model.moe.num_experts, keys, MISSING, section="moe")
    return None


def _rope_section(model: ModelConfig, hf: Mapping[str, Any]) -> Mismatch | None:
    hf_key, kind = _first(hf, ROPE_SCALING[0].hf_keys)
    kind = None if kind is MISSING else kind
    if model.rope_scaling is None and kind not in UNSCALED_ROPE_TYPES:
        return Mismatch("rope_scaling", None, hf_key, kind, section="rope_scaling")
    if model.rope_scaling is not None and kind in UNSCALED_ROPE_TYPES:
        ours = model.rope_scaling.type
        return Mismatch("rope_scaling.type", ours, hf_key, kind, section="rope_scaling")
    return None


def _section_issue(m: Mismatch, config_file: str, locate: Locate) -> Issue:
    """A moe or rope_scaling section the model YAML has and its checkpoint not, or the
    reverse."""
    if m.section == "moe" and m.ours is None:
        return Issue(
            key="model.moe",
            message=f"{config_file} says {m.hf_key}={m.theirs} (a mixture-of-experts model), "
            "but the model YAML has no moe section",
            fix="add a moe section (num_experts, top_k, expert_ffn_hidden_size, ...) "
            "matching the HF config",
            location=locate("model"),
        )
    if m.section == "moe":
        return Issue(
            key="model.moe",
            message=f"the model YAML has a moe section, but {config_file} has no "
            f"{m.hf_key}: the checkpoint is a dense model",
            fix="remove the moe section, or point model.hf_checkpoint at the MoE checkpoint",
            location=locate("model.moe"),
        )
    if m.ours is None:
        return Issue(
            key="model.rope_scaling",
            message=f"{config_file} scales RoPE ({m.theirs!r}), but the model YAML has no "
            "rope_scaling section: positions beyond the original context would be "
            "encoded differently from pre-training",
            fix="add rope_scaling (type, factor, original_max_position_embeddings, ...) "
            "matching the HF config's rope_scaling",
            location=locate("model"),
        )
    return Issue(
        key="model.rope_scaling",
        message=f"the model YAML scales RoPE ({m.ours}), but {config_file} does not",
        fix="remove the rope_scaling section, or point model.hf_checkpoint at the "
        "checkpoint this YAML describes",
        location=locate("model.rope_scaling"),
    )
