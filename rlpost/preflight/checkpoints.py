"""The checkpoint folders a launch names: model.hf_checkpoint is a local Hugging Face folder
(config.json, tokenizer files, weights), and an HF folder given as model.load or model.ref_load
is of the model's architecture (or, for megatron, a torch_dist checkpoint). rlpost reads local
folders only and never downloads.
"""

from __future__ import annotations

from pathlib import Path

from rlpost.config.chat_templates import chat_templates
from rlpost.config.hf_check import check_weights_config
from rlpost.errors import Issue
from rlpost.plan.plan import Plan
from rlpost.preflight.tokens import (
    check_markers_survive_sampling,
    check_template_kwargs,
    check_thinking_reward,
    check_tokens_in_embedding,
)
from rlpost.schema import ModelConfig, RunConfig

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "model*.bin")
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
HUB_NOTE = (
    "rlpost reads local folders only and never downloads (a hub id such as Qwen/Qwen3-4B is "
    "not fetched)"
)


def _folder_issue(key: str, value: str, problem: str, fix: str) -> Issue:
    return Issue(key, problem, fix, value=value)


def check_hf_folder(key: str, value: str, *, needs_weights: bool = True) -> list[Issue]:
    """A local Hugging Face model folder: config.json, tokenizer files and weights."""
    path = Path(value).expanduser()
    fix = (
        "point it at a local HF checkpoint folder (config.json, *.safetensors, tokenizer "
        "files), e.g. one made with `hf download <repo> --local-dir <folder>`"
    )
    if not path.exists():
        return [_folder_issue(key, value, f"no such folder on this machine; {HUB_NOTE}", fix)]
    if not path.is_dir():
        return [_folder_issue(key, value, "is a file, not a checkpoint folder", fix)]
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        missing.append(f"tokenizer files ({', '.join(TOKENIZER_FILES[:2])})")
    if needs_weights and not any(any(path.glob(p)) for p in WEIGHT_PATTERNS):
        missing.append("weights (*.safetensors)")
    if missing:
        return [_folder_issue(key, value, f"the folder has no {' and no '.join(missing)}", fix)]
    return []


def _weights_issues(key: str, value: str, backend: str, model: ModelConfig) -> list[Issue]:
    """A policy or reference checkpoint the trainer will read: an HF folder of the model's
    architecture, or (megatron only) a torch_dist checkpoint."""
    path = Path(value).expanduser()
    readable = (
        "an HF folder or a torch_dist checkpoint"
        if backend == "megatron"
        else ("an HF folder (the torch trainer reads no torch_dist checkpoint)")
    )
    if not path.exists():
        return [
            _folder_issue(
                key,
                value,
                f"no such checkpoint on this machine; {HUB_NOTE}",
                f"point it at {readable} on this machine (e.g. ${{model.hf_checkpoint}}), "
                "or remove it",
            )
        ]
    if (path / "metadata.json").is_file():
        if backend == "megatron":
            return []
        return [
            _folder_issue(
                key,
                value,
                "is a torch_dist checkpoint, which the torch trainer cannot read",
                "point it at an HF folder (tools/convert_megatron_to_hf.py writes one), or "
                "train with the megatron backend",
            )
        ]
    return check_hf_folder(key, value) or check_weights_config(key, value, model)


def check_checkpoints(cfg: RunConfig, plan: Plan) -> list[Issue]:
    model = cfg.model
    issues = check_hf_folder("model.hf_checkpoint", model.hf_checkpoint)
    # the reference only matters when the recipe reads it
    ref = model.ref_load
    if ref is not None and ref != model.hf_checkpoint and cfg.recipe.algo.reference_interval > 0:
        issues += _weights_issues("model.ref_load", ref, plan.trainer_backend, model)
    if model.load is not None and model.load != model.hf_checkpoint:
        issues += _weights_issues("model.load", model.load, plan.trainer_backend, model)
    if (
        cfg.recipe.data.apply_chat_template
        and not issues
        and not chat_templates(Path(model.hf_checkpoint).expanduser())
    ):
        issues.append(
            Issue(
                "recipe.data.apply_chat_template",
                f"the tokenizer in {model.hf_checkpoint} has no chat template "
                f"(tokenizer_config.json's chat_template, or {CHAT_TEMPLATE_FILES[0]})",
                "use a checkpoint whose tokenizer has a chat template (an instruct or chat "
                "model), or set recipe.data.apply_chat_template: false",
                value=True,
            )
        )
    elif cfg.recipe.data.apply_chat_template and not issues:
        issues += check_template_kwargs(cfg.recipe.data.apply_chat_template_kwargs, model)
    if not issues:
        issues += check_tokens_in_embedding(cfg.model)
        issues += check_thinking_reward(cfg)
        issues += check_markers_survive_sampling(cfg)
    return issues
