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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rlpost.config.hf_fields import (
    Locate,
    compare,
    mismatches,
    model_value,
    same_value,
    setter_and_fix,
)
from rlpost.config.hf_model import (
    FAMILIES,
    HFConfig,
    architecture,
    check_expressible,
    sliding_window,
)
from rlpost.errors import Issue, UserError
from rlpost.schema import GENERIC_FAMILY, ModelConfig

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
        ours = model_value(model, field)
        if field.startswith("moe.") and model.moe is None:
            continue  # the moe section's presence is compared apart
        if same_value(ours, theirs):
            continue
        key = f"model.{field}"
        where = locate(key)
        setter, set_it = setter_and_fix(where, field, theirs)
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
