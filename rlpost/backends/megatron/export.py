"""HF folders from gathered weight buckets, plus what the Megatron model does not hold.

Unless `recipe.train.mtp_training` is on, the trainer builds no MTP (multi-token prediction)
layers and the engines' speculative decoder keeps the checkpoint's: those tensors (HF layer
indices at or past num_layers) are copied unchanged from `model.hf_checkpoint`. A trained MTP
layer is exported like any other. Either way, an MTP layer's repeats of the shared embedding
and output head (`model.layers.{N}.embed_tokens`, `.shared_head.head`), when the checkpoint
has them, are written from the exported shared tensors: they are the same weights.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from torch import Tensor

from rlpost.backends.megatron.hf_files import HFCheckpoint, write_hf_folder
from rlpost.backends.megatron.weights import WeightMap
from rlpost.schema import ModelConfig

HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def passthrough_names(ckpt: HFCheckpoint, model: ModelConfig) -> list[str]:
    """Checkpoint tensors of layers beyond the decoder (MTP): kept as they are unless the
    model exports them."""
    names = []
    for name in ckpt.names():
        match = HF_LAYER.match(name)
        if match is not None and int(match.group(1)) >= model.num_layers:
            names.append(name)
    return names


def _flatten(
    buckets: Iterable[list[tuple[str, Tensor]]], ckpt: HFCheckpoint, model: ModelConfig
) -> Iterator[tuple[str, Tensor]]:
    beyond = passthrough_names(ckpt, model)
    weight_map = WeightMap(model)
    repeats: dict[str, list[str]] = {}
    for name in beyond:
        source = weight_map.mtp_shared_source(name)
        if source is not None:
            repeats.setdefault(source, []).append(name)
    written: set[str] = set()
    for bucket in buckets:
        for name, tensor in bucket:
            written.add(name)
            yield name, tensor
            for repeat in repeats.get(name, []):
                written.add(repeat)
                yield repeat, tensor.clone()  # safetensors refuses shared storage
    for name in beyond:
        if name not in written:
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
