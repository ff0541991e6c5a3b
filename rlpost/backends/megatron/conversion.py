"""HF checkpoint <-> torch_dist checkpoint, in one process (the tools' library side).

Both directions first compare the model YAML with the HF config.json (rlpost.config.hf_fields)
and refuse on any disagreement: a YAML that does not describe its checkpoint converts into a
silently different network. A torch_dist checkpoint is layout independent: written here with
no parallelism, it loads under any layout the trainer runs (`model.load` / `model.ref_load`).
It includes the model's MTP layers (model.mtp_num_layers), so MTP training can start from it;
back to HF, a checkpoint without them (saved by a run that did not train them) takes them from
`model.hf_checkpoint`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from megatron.core.models.gpt import GPTModel

from rlpost.backends.megatron.compat import cpu_compat, needs_cpu_compat
from rlpost.backends.megatron.config import MegatronSettings, megatron_settings
from rlpost.backends.megatron.convert import (
    ModelWeights,
    has_mtp_layers,
    iter_hf_weights,
    load_hf_weights,
    load_torch_dist,
    save_torch_dist,
)
from rlpost.backends.megatron.distributed import ProcessPlace, destroy_parallel, init_parallel
from rlpost.backends.megatron.export import export_hf_folder
from rlpost.backends.megatron.hf_files import HFCheckpoint
from rlpost.backends.megatron.model_yaml import check_model_matches_hf
from rlpost.backends.megatron.provider import build_gpt_model
from rlpost.plan.layout import ParallelLayout
from rlpost.schema import ModelConfig

SINGLE_PROCESS = ParallelLayout.single_process()


@contextmanager
def single_process_model(
    model: ModelConfig, with_mtp: bool = False
) -> Iterator[tuple[MegatronSettings, GPTModel]]:
    """The whole model in this process (a world of one), inside the CPU layer; torn down
    afterwards. `with_mtp`: its MTP layers too."""
    settings = megatron_settings(
        model,
        SINGLE_PROCESS,
        on_gpu=not needs_cpu_compat(),
        # builds the layers; conversion never trains, so the factor is never used
        mtp_loss_scaling_factor=1.0 if with_mtp else None,
    )
    with cpu_compat():
        # a world of one: its store listens on a port the kernel picks as it binds (0), which
        # no other rank needs to know and no other process can take first
        init_parallel(ProcessPlace(master_port=0), settings.parallel, seed=1234)
        try:
            yield settings, build_gpt_model(settings)
        finally:
            destroy_parallel()


def hf_has_mtp_layers(model: ModelConfig) -> bool:
    """Whether `model.hf_checkpoint` holds MTP weights (published checkpoints sometimes keep
    num_nextn_predict_layers but drop the weights)."""
    ckpt = HFCheckpoint(model.hf_checkpoint)
    try:
        first = f"model.layers.{model.num_layers}.eh_proj.weight"
        return model.mtp_num_layers > 0 and first in ckpt
    finally:
        ckpt.close()


def hf_to_torch_dist(
    model: ModelConfig, save_dir: str | Path, yaml_file: str | None = None
) -> Path:
    """Convert `model.hf_checkpoint` into a torch_dist checkpoint at `save_dir` (MTP layers
    included when the HF checkpoint has them)."""
    check_model_matches_hf(model, yaml_file)
    with single_process_model(model, hf_has_mtp_layers(model)) as (settings, module):
        ckpt = HFCheckpoint(model.hf_checkpoint)
        try:
            load_hf_weights(module, ckpt, ModelWeights.current(model, settings))
        finally:
            ckpt.close()
        save_torch_dist(module, save_dir)
    return Path(save_dir)


def torch_dist_to_hf(
    model: ModelConfig, load_dir: str | Path, out_dir: str | Path, yaml_file: str | None = None
) -> Path:
    """Write a torch_dist checkpoint as an HF folder (config, tokenizer, and MTP weights the
    checkpoint lacks, from `model.hf_checkpoint`)."""
    check_model_matches_hf(model, yaml_file)
    with_mtp = model.mtp_num_layers > 0 and has_mtp_layers(load_dir)
    with single_process_model(model, with_mtp) as (settings, module):
        load_torch_dist(module, load_dir)
        buckets = iter_hf_weights(module, ModelWeights.current(model, settings))
        export_hf_folder(buckets, model, Path(out_dir), write=True)
    return Path(out_dir)
