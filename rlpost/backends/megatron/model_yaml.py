"""The model section for the conversion tools, and its check against the HF config.json.

Light on purpose (no torch, no megatron-core): the tools refuse a bad YAML in a second.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from rlpost.config.hf_fields import compare
from rlpost.errors import Issue, Location, UserError
from rlpost.schema import ModelConfig


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


def _from_file(path: Path, overrides: Sequence[str]) -> ModelConfig:
    if not path.is_file():
        raise UserError([Issue("--model-yaml", f"{path} is not a file", "pass a model YAML")])
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    data.pop("defaults", None)
    for override in overrides:
        key, _, value = override.partition("=")
        if not key.startswith("model.") or not _:
            raise UserError(
                [
                    Issue(
                        override,
                        "with --model-yaml only model.<key>=<value> overrides apply",
                        "write e.g. model.hf_checkpoint=/path/to/checkpoint",
                    )
                ]
            )
        _set(data, key.removeprefix("model."), yaml.safe_load(value))
    try:
        return ModelConfig.model_validate(data)
    except ValidationError as exc:
        issues = [
            Issue(
                "model." + ".".join(str(p) for p in err["loc"]),
                f"{path}: {err['msg']}",
                "correct the model YAML (interpolations such as ${...} are not resolved here; "
                "use model=<name> for conf/model files)",
            )
            for err in exc.errors()
        ]
        raise UserError(issues) from None


def resolve_model(
    overrides: Sequence[str], yaml_file: str | None
) -> tuple[ModelConfig, str | None]:
    """(ModelConfig, the YAML file it came from) from `model=<name>` overrides or a file."""
    if yaml_file is not None:
        return _from_file(Path(yaml_file), overrides), yaml_file
    names = [o.split("=", 1)[1] for o in overrides if o.startswith("model=")]
    if not names:
        raise UserError(
            [
                Issue(
                    "model",
                    "no model given",
                    "pass model=<name> (a file in conf/model) or --model-yaml FILE",
                )
            ]
        )
    from rlpost.config.loader import compose_run_config

    run, _ = compose_run_config(list(overrides))
    return run.model, f"conf/model/{names[-1]}.yaml"


def check_model_matches_hf(model: ModelConfig, yaml_file: str | None = None) -> None:
    """UserError listing every field where the model YAML and config.json disagree."""
    config_path = Path(model.hf_checkpoint) / "config.json"
    if not config_path.is_file():
        raise UserError(
            [
                Issue(
                    key="model.hf_checkpoint",
                    value=model.hf_checkpoint,
                    message=f"{config_path} does not exist: conversion needs the HF checkpoint "
                    "the model YAML describes",
                    fix="point model.hf_checkpoint at a local HF folder (config.json, "
                    "*.safetensors)",
                )
            ]
        )
    hf = json.loads(config_path.read_text(encoding="utf-8"))
    issues = compare(model, hf, str(config_path), lambda key: Location(file=yaml_file))
    if issues:
        raise UserError(issues, title="model YAML / HF config mismatch")


def check_torch_dist_folder(folder: str, key: str) -> None:
    """UserError unless `folder` is a torch_dist checkpoint (megatron-core's metadata.json),
    checked before megatron-core is imported: it would raise its own traceback."""
    path = Path(folder).expanduser()
    what = "is not a torch_dist checkpoint (no metadata.json)"
    fix = (
        "give a torch_dist checkpoint folder: the one tools/convert_hf_to_megatron.py --save "
        "wrote, or a Megatron iter_<step> folder"
    )
    if not path.exists():
        what = "no such folder on this machine"
    elif not path.is_dir():
        what = "is a file, not a checkpoint folder"
    elif (path / "metadata.json").is_file():
        return
    elif (path / "manifest.json").is_file() or (path / "ckpt").is_dir():
        what = "is an rlpost run's checkpoint (or run directory), not a torch_dist folder"
        fix = f"export it with tools/export_hf.py {folder} <out_dir> (either trainer's format)"
    elif (path / "config.json").is_file():
        what = "is an HF folder already (config.json, no metadata.json)"
        fix = "use it as it is, or give the torch_dist checkpoint to convert"
    raise UserError([Issue(key, what, fix, value=folder)], title="command-line error")
