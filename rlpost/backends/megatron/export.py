"""HF folders from gathered weight buckets, plus what the Megatron model does not hold.

The trainer builds no MTP (multi-token prediction) layers: RL trains the main model only, and
the engines' speculative decoder keeps the checkpoint's MTP weights. Those tensors (HF layer
indices at or past num_layers) are copied unchanged from `model.hf_checkpoint`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from torch import Tensor

from rlpost.backends.megatron.hf_files import HFCheckpoint, write_hf_folder
from rlpost.schema import ModelConfig

HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def passthrough_names(ckpt: HFCheckpoint, model: ModelConfig) -> list[str]:
    """Checkpoint tensors of layers beyond the decoder (MTP), kept as they are."""
    names = []
    for name in ckpt.names():
        match = HF_LAYER.match(name)
        if match is not None and int(match.group(1)) >= model.num_layers:
            names.append(name)
    return names


def _flatten(
    buckets: Iterable[list[tuple[str, Tensor]]], ckpt: HFCheckpoint, model: ModelConfig
) -> Iterator[tuple[str, Tensor]]:
    for bucket in buckets:
        yield from bucket
    for name in passthrough_names(ckpt, model):
        yield name, ckpt.get(name)


def export_hf_folder(
    buckets: Iterable[list[tuple[str, Tensor]]], model: ModelConfig, out_dir: Path, write: bool
) -> None:
    """Consume every bucket (a collective on every rank); the writing rank saves the folder."""
    if not write:
        for _ in buckets:
            pass
        return
    ckpt = HFCheckpoint(model.hf_checkpoint)
    try:
        write_hf_folder(out_dir, _flatten(buckets, ckpt, model), model.hf_checkpoint)
    finally:
        ckpt.close()
