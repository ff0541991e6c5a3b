"""Cross-check a model YAML against the HF config.json in its checkpoint folder.

A model file that disagrees with its checkpoint (query groups, head dim, vocabulary,
experts, ...) converts or loads into a silently different network. When
`model.hf_checkpoint` is a local folder with a config.json, every architecture field the
YAML states is compared with the HF key it must equal; each disagreement is one Issue.
`model.load` and `model.ref_load` naming HF folders are compared the same way by the
preflight (`check_weights_config`). Reads JSON only: transformers is not imported.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rlpost.errors import Issue, Location
from rlpost.schema import GENERIC_FAMILY, ModelConfig, rope_fields_unread

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


def _same(ours: Any, theirs: Any) -> bool:
    if isinstance(ours, bool) or isinstance(theirs, bool):
        return ours is theirs or ours == theirs
    if isinstance(ours, int | float) and isinstance(theirs, int | float):
        return math.isclose(ours, theirs, rel_tol=1e-9, abs_tol=0.0)
    return bool(ours == theirs)


def _ours(model: ModelConfig, field: str) -> Any:
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
        ours = _ours(model, mapping.field)
        if theirs is MISSING or (ours is None and mapping.field == "kv_channels"):
            continue  # the HF file does not state it (or the YAML derives it): nothing to compare
        if mapping.field == "hf_architecture" and isinstance(theirs, list):
            theirs = theirs[0] if theirs else MISSING
        if theirs is MISSING or _same(ours, theirs):
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


def _setter(where: Location, field: str, theirs: Any) -> tuple[str, str]:
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
    setter, set_it = _setter(where, m.field, m.theirs)
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


DERIVED = (
    "family",
    "rotary_percent",
    "rotary_interleaved",
    "qk_layernorm",
    "add_bias_linear",
    "post_self_attn_layernorm",
    "post_mlp_layernorm",
    "activation",
    "mtp_num_layers",
    "moe.num_shared_experts",
    "moe.shared_expert_ffn_hidden_size",
    "moe.first_k_dense_layers",
    "moe.router_score",
    "moe.router_expert_bias",
    "moe.router_topk_scaling_factor",
    "moe.router_num_groups",
    "moe.router_group_topk",
    "moe.norm_topk_prob",
)
"""The fields a checkpoint fixes though its config.json need not state them: what a family's
modelling code does (QK-norm, GLM-4's sandwich norms and interleaved RoPE, a router's scoring
and bias), and what a key's absence means (no MTP layers, no shared experts, RoPE over the whole
head). `rlpost.config.hf_model.architecture` derives each, as `rlpost new model --from-hf`
writes it."""


def derived_issues(
    model: ModelConfig, hf: Mapping[str, Any], config_file: str, locate: Locate
) -> list[Issue]:
    """A checkpoint no model YAML can describe (mixed windowed layers, softcapping, ...: both
    trainers attend over whole samples) as one Issue on model.hf_checkpoint; then
    model.sliding_window where the window config.json gives differs; else, for the
    named families, one Issue per `DERIVED` field where `model` and what its checkpoint
    implies disagree (a generic model is built by transformers from config.json itself, and
    its YAML feeds the plan's counts only)."""
    from rlpost.config.hf_model import (
        FAMILIES,
        HFConfig,
        architecture,
        check_expressible,
        sliding_window,
    )
    from rlpost.errors import UserError  # (hf_model reads this module's maps)

    checkpoint = HFConfig(hf, config_file)
    try:
        check_expressible(checkpoint)
    except UserError as exc:
        return [
            Issue(
                key="model.hf_checkpoint",
                value=model.hf_checkpoint,
                message=f"{issue.message} (config.json's {issue.key})",
                fix=issue.fix,
                location=locate("model.hf_checkpoint"),
            )
            for issue in exc.issues
        ]
    window = sliding_window(checkpoint)
    if model.sliding_window != window:
        return [
            Issue(
                key="model.sliding_window",
                value=model.sliding_window,
                message=f"model.sliding_window={model.sliding_window}, but {config_file} "
                f"gives an attention window of {window} (sliding_window, narrower than "
                "max_position_embeddings; None: attention over the whole context)",
                fix=f"set sliding_window: {'null' if window is None else window} in the model YAML",
                location=locate("model.sliding_window"),
            )
        ]
    model_type = checkpoint.get("model_type", "text_config.model_type", default=None)
    if model.family == GENERIC_FAMILY or model_type not in FAMILIES:
        return []  # another architecture: hf_architecture's comparison says so
    try:
        facts = architecture(checkpoint)
    except UserError:
        return []  # a config.json without a fact every YAML states: compared by key alone
    issues = []
    for field in DERIVED:
        theirs: Any = facts
        for part in field.split("."):
            theirs = theirs.get(part) if isinstance(theirs, Mapping) else None
        ours = _ours(model, field)
        if field.startswith("moe.") and model.moe is None:
            continue  # the moe section's presence is compared apart
        if _same(ours, theirs):
            continue
        key = f"model.{field}"
        where = locate(key)
        setter, set_it = _setter(where, field, theirs)
        issues.append(
            Issue(
                key=key,
                value=ours,
                message=f"{setter} says {field}={ours!r}, but the {facts['family']} "
                f"checkpoint of {config_file} has {theirs!r} (what its config.json states, "
                f"or its modelling code does where the file is silent): the model would not "
                "match its checkpoint",
                fix=f"{set_it} (`rlpost new model --from-hf` writes every such field), or "
                "point model.hf_checkpoint at the checkpoint this YAML describes",
                location=where,
            )
        )
    return issues


def check_hf_config(data: Mapping[str, Any], locate: Locate) -> list[Issue]:
    """Compare the resolved `model` section with `<hf_checkpoint>/config.json` when it exists."""
    raw = data.get("model")
    if not isinstance(raw, Mapping) or not isinstance(raw.get("hf_checkpoint"), str):
        return []
    config_path = Path(raw["hf_checkpoint"]).expanduser() / "config.json"
    if not config_path.is_file():
        return []
    try:
        model = ModelConfig.model_validate(raw)
    except ValidationError:
        return []  # the schema errors are reported already; compare a valid model only
    try:
        hf = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        return [
            Issue(
                key="model.hf_checkpoint",
                value=raw["hf_checkpoint"],
                message=f"{config_path} cannot be read as JSON: {exc}",
                fix="point model.hf_checkpoint at a Hugging Face checkpoint folder",
                location=locate("model.hf_checkpoint"),
            )
        ]
    issues = compare(model, hf, str(config_path), locate)
    stated = {issue.key for issue in issues}
    derived = derived_issues(model, hf, str(config_path), locate)
    return issues + [issue for issue in derived if issue.key not in stated]


WEIGHTS_ROLES = {
    "model.load": "the policy would start from the weights of another network",
    "model.ref_load": "the KL would be measured against another network",
}


def check_weights_config(key: str, folder: str, model: ModelConfig) -> list[Issue]:
    """`key` (model.load or model.ref_load) naming an HF folder of another architecture than
    `model`'s: its config.json compared as model.hf_checkpoint's is, one Issue naming every
    disagreement. A folder without a config.json (a torch_dist checkpoint: its tensor
    metadata reads only with torch) is not compared here: megatron-core compares its tensor
    shapes with the model's when the trainer loads it."""
    config_path = Path(folder).expanduser() / "config.json"
    if not config_path.is_file():
        return []
    fix = (
        f"point {key} at weights of this model's architecture (a checkpoint whose config.json "
        "agrees with model.hf_checkpoint's), or remove it"
    )
    try:
        hf = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        return [Issue(key, f"{config_path} cannot be read as JSON: {exc}", fix, value=folder)]
    if not isinstance(hf, Mapping):
        return [Issue(key, f"{config_path} holds no JSON object", fix, value=folder)]
    found = mismatches(model, hf)
    if not found:
        return []
    theirs = ", ".join(m.stated() for m in found)
    ours = ", ".join(f"{m.field}={m.ours!r}" for m in found)
    return [
        Issue(
            key,
            f"its config.json says {theirs}, where the model says {ours}: {WEIGHTS_ROLES[key]}",
            fix,
            value=folder,
        )
    ]
