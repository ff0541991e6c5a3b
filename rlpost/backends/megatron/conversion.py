"""HF checkpoint <-> torch_dist checkpoint, in one process (the tools' library side).

Both directions first compare the model YAML with the HF config.json (rlpost.config.hf_check)
and refuse on any disagreement: a YAML that does not describe its checkpoint converts into a
silently different network. A torch_dist checkpoint is layout independent: written here with
no parallelism, it loads under any layout the trainer runs (`model.load` / `model.ref_load`).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rlpost.backends.megatron.compat import cpu_compat, needs_cpu_compat
from rlpost.backends.megatron.config import MegatronSettings, megatron_settings
from rlpost.backends.megatron.convert import (
    ModelWeights,
    iter_hf_weights,
    load_hf_weights,
    load_torch_dist,
    save_torch_dist,
)
from rlpost.backends.megatron.distributed import ProcessPlace, destroy_parallel, init_parallel
from rlpost.backends.megatron.export import export_hf_folder
from rlpost.backends.megatron.hf_files import HFCheckpoint
from rlpost.backends.megatron.provider import build_gpt_model
from rlpost.config.hf_check import compare
from rlpost.errors import Issue, Location, UserError
from rlpost.plan.layout import ParallelLayout
from rlpost.schema import ModelConfig

SINGLE_PROCESS = ParallelLayout(
    tp=1,
    pp=1,
    cp=1,
    ep=1,
    etp=1,
    dp=1,
    sequence_parallel=False,
    recompute="none",
    recompute_method="uniform",
    recompute_num_layers=1,
    distributed_optimizer=False,
)


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def single_process_model(model: ModelConfig) -> Iterator[tuple[MegatronSettings, object]]:
    """The whole model in this process (world of one), torn down afterwards."""
    settings = megatron_settings(model, SINGLE_PROCESS, on_gpu=not needs_cpu_compat())
    with cpu_compat():
        init_parallel(ProcessPlace(master_port=_free_port()), settings.parallel, seed=1234)
        try:
            yield settings, build_gpt_model(settings)
        finally:
            destroy_parallel()


def hf_to_torch_dist(model: ModelConfig, save_dir: str | Path, yaml_file: str | None = None) -> Path:
    """Convert `model.hf_checkpoint` into a torch_dist checkpoint at `save_dir`."""
    check_model_matches_hf(model, yaml_file)
    with single_process_model(model) as (settings, module):
        ckpt = HFCheckpoint(model.hf_checkpoint)
        try:
            load_hf_weights(module, ckpt, ModelWeights.current(model, settings))  # type: ignore[arg-type]
        finally:
            ckpt.close()
        with cpu_compat():
            save_torch_dist(module, save_dir)  # type: ignore[arg-type]
    return Path(save_dir)


def torch_dist_to_hf(
    model: ModelConfig, load_dir: str | Path, out_dir: str | Path, yaml_file: str | None = None
) -> Path:
    """Write a torch_dist checkpoint as an HF folder (config, tokenizer and MTP weights from
    `model.hf_checkpoint`)."""
    check_model_matches_hf(model, yaml_file)
    with single_process_model(model) as (settings, module):
        with cpu_compat():
            load_torch_dist(module, load_dir)  # type: ignore[arg-type]
            weights = ModelWeights.current(model, settings)
            export_hf_folder(iter_hf_weights(module, weights), model, Path(out_dir), write=True)  # type: ignore[arg-type]
    return Path(out_dir)
