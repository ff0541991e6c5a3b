"""Weights between HF checkpoints and a (possibly parallel) megatron-core model.

- `load_hf_weights`: every process reads its own shard of each tensor straight from the HF
  safetensors; no communication, any layout.
- `iter_hf_weights`: the whole model in HF names, gathered across tensor-, expert- and
  pipeline-parallel ranks, in buckets of at most `bucket_bytes`; every rank receives every
  bucket in the same order (a tensor larger than a bucket travels alone).
- `save_torch_dist` / `load_torch_dist`: megatron-core's dist_checkpointing format, which is
  layout independent (a checkpoint saved under one parallel layout loads under any other).
  A model with MTP layers loads from a checkpoint saved without them by taking those layers
  from the HF checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing, parallel_state
from torch import Tensor, nn

from rlpost.backends.megatron.compat import in_process_checkpoint_writes
from rlpost.backends.megatron.config import MegatronSettings
from rlpost.backends.megatron.distributed import compute_device
from rlpost.backends.megatron.hf_files import HFCheckpoint
from rlpost.backends.megatron.provider import stage_layers
from rlpost.backends.megatron.weights import (
    Placement,
    Rule,
    Shapes,
    WeightMap,
    is_mapped,
    shard,
    unshard,
)
from rlpost.schema import ModelConfig

HFTensor = tuple[str, Tensor]
EMBEDDING = "embedding.word_embeddings.weight"
MTP_PREFIX = "mtp."


class WeightMismatchError(ValueError):
    """An HF checkpoint that does not fit the model built from the model YAML."""


@dataclass(frozen=True)
class ModelWeights:
    """How this process's parameters relate to the HF checkpoint."""

    weight_map: WeightMap
    shapes: Shapes
    placement: Placement
    num_local_experts: int

    @classmethod
    def current(cls, model: ModelConfig, settings: MegatronSettings) -> ModelWeights:
        """From megatron-core's initialised process groups."""
        ps = parallel_state
        local_experts = 0
        if model.moe is not None:
            local_experts = model.moe.num_experts // ps.get_expert_model_parallel_world_size()
        placement = Placement(
            layer_offset=stage_layers(settings).start,
            expert_offset=ps.get_expert_model_parallel_rank() * local_experts,
            tp_rank=ps.get_tensor_model_parallel_rank(),
            tp_size=ps.get_tensor_model_parallel_world_size(),
            etp_rank=ps.get_expert_tensor_parallel_rank(),
            etp_size=ps.get_expert_tensor_parallel_world_size(),
        )
        shapes = Shapes.of(model, settings.gpt.vocab_size)
        return cls(WeightMap(model), shapes, placement, local_experts)


def local_tensors(module: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """Parameters and persistent buffers that carry checkpoint weights, by local name."""
    for name, tensor in module.state_dict(keep_vars=True).items():
        if tensor is not None and is_mapped(name):
            yield name, tensor


def load_hf_weights(
    module: nn.Module, ckpt: HFCheckpoint, weights: ModelWeights, prefix: str = ""
) -> None:
    """Copy this process's shard of every HF tensor into `module` (in place); only the local
    names starting with `prefix` when given."""
    missing: list[str] = []
    with torch.no_grad():
        for local, tensor in local_tensors(module):
            if not local.startswith(prefix):
                continue
            name = weights.placement.global_name(local)
            rule = weights.weight_map.rule(name)
            absent = [n for n in rule.hf_names if n not in ckpt]
            if absent:
                missing += absent
                continue
            full = rule.layout.to_full([ckpt.get(n) for n in rule.hf_names], weights.shapes)
            part = shard(full, rule.layout, *weights.placement.group(rule))
            if part.shape != tensor.shape:
                raise WeightMismatchError(
                    f"{ckpt.folder}: {', '.join(rule.hf_names)} give {name} the shape "
                    f"{tuple(part.shape)} on this rank, but the model built from the YAML has "
                    f"{tuple(tensor.shape)}; the model YAML does not describe this checkpoint"
                )
            tensor.copy_(part.to(tensor.dtype))
    if missing:
        shown = ", ".join(missing[:5]) + (
            f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""
        )
        raise WeightMismatchError(
            f"{ckpt.folder} lacks {len(missing)} tensors the model needs: {shown}; the model "
            "YAML does not describe this checkpoint (family, layers, experts, bias or norms)"
        )


def _gather(tensor: Tensor, group: dist.ProcessGroup | None) -> list[Tensor]:
    if group is None or dist.get_world_size(group) == 1:
        return [tensor.detach()]
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, tensor.detach().contiguous(), group=group)
    return parts


def _hf_tensors(rule: Rule, full: Tensor, weights: ModelWeights) -> list[HFTensor]:
    return list(zip(rule.hf_names, rule.layout.from_full(full, weights.shapes), strict=True))


def stage_hf_weights(module: nn.Module, weights: ModelWeights) -> Iterator[HFTensor]:
    """This pipeline stage's weights in HF names, gathered over TP, expert TP and EP.

    Collective: every rank of the stage must iterate it to the end, in step.
    """
    ps = parallel_state
    ep_group = ps.get_expert_model_parallel_group() if weights.num_local_experts else None
    for local, tensor in local_tensors(module):
        name = weights.placement.global_name(local)
        if not weights.weight_map.exported(name) or _stage_copy(name):
            continue
        rule = weights.weight_map.rule(name)
        tp_group = (
            ps.get_expert_tensor_parallel_group()
            if rule.expert
            else ps.get_tensor_model_parallel_group()
        )
        full = unshard(
            _gather(tensor, tp_group if rule.layout.split_dim is not None else None), rule.layout
        )
        if not rule.expert:
            yield from _hf_tensors(rule, full, weights)
            continue
        for ep_rank, part in enumerate(_gather(full, ep_group)):
            placement = Placement(
                layer_offset=weights.placement.layer_offset,
                expert_offset=ep_rank * weights.num_local_experts,
            )
            yield from _hf_tensors(
                weights.weight_map.rule(placement.global_name(local)), part, weights
            )


def _stage_copy(name: str) -> bool:
    """The last stage's copy of the embedding, which its MTP layers read (the first stage
    exports the embedding)."""
    return name == EMBEDDING and not parallel_state.is_pipeline_first_stage()


def _buckets(tensors: Iterator[HFTensor], bucket_bytes: int) -> Iterator[list[HFTensor]]:
    bucket: list[HFTensor] = []
    size = 0
    for name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def _broadcast_bucket(
    bucket: list[HFTensor] | None, src: int, group: dist.ProcessGroup
) -> list[HFTensor] | None:
    """Owner sends a bucket (None: its stage is done) to the rest of the pipeline group."""
    meta = [None if bucket is None else [(n, t.shape, t.dtype) for n, t in bucket]]
    dist.broadcast_object_list(meta, src=src, group=group)
    if meta[0] is None:
        return None
    received: list[HFTensor] = []
    device = compute_device()  # receive where the collective works (NCCL: the GPU)
    for i, (name, shape, dtype) in enumerate(meta[0]):
        tensor = (
            bucket[i][1].contiguous()
            if bucket is not None
            else torch.empty(shape, dtype=dtype, device=device)
        )
        dist.broadcast(tensor, src=src, group=group)
        received.append((name, tensor))
    return received


def iter_hf_weights(
    module: nn.Module, weights: ModelWeights, bucket_bytes: int = 512 << 20
) -> Iterator[list[HFTensor]]:
    """The whole model in HF names, in size-bounded buckets, on every rank.

    Collective over the whole training world: every rank must consume every bucket.
    """
    ps = parallel_state
    pp_size = ps.get_pipeline_model_parallel_world_size()
    if pp_size == 1:
        yield from _buckets(stage_hf_weights(module, weights), bucket_bytes)
        return
    group = ps.get_pipeline_model_parallel_group()
    ranks = dist.get_process_group_ranks(group)
    my_stage = ps.get_pipeline_model_parallel_rank()
    for stage in range(pp_size):
        owned = (
            _buckets(stage_hf_weights(module, weights), bucket_bytes) if stage == my_stage else None
        )
        while True:
            bucket = next(owned, None) if owned is not None else None
            received = _broadcast_bucket(bucket, ranks[stage], group)
            if received is None:
                break
            yield received
            del bucket, received  # before the next bucket is gathered: one alive at a time


def save_torch_dist(state: nn.Module | dict[str, Any], ckpt_dir: str | Path) -> None:
    """Write a module (or a sharded state dict) as a dist_checkpointing (torch_dist)
    checkpoint; every rank writes its own shards. Collective."""
    path = Path(ckpt_dir)
    path.mkdir(parents=True, exist_ok=True)
    sharded = _sharded(state) if isinstance(state, nn.Module) else state
    with in_process_checkpoint_writes():
        dist_checkpointing.save(sharded, str(path))


def load_torch_dist_state(sharded: dict[str, Any], ckpt_dir: str | Path) -> dict[str, Any]:
    """The checkpoint's values for a sharded state dict (any layout it was saved under)."""
    loaded: dict[str, Any] = dist_checkpointing.load(sharded, str(ckpt_dir))
    return loaded


def load_torch_dist(
    module: nn.Module,
    ckpt_dir: str | Path,
    hf_checkpoint: str | None = None,
    weights: ModelWeights | None = None,
) -> None:
    """Load a torch_dist checkpoint written under any parallel layout into `module`. MTP
    layers the checkpoint lacks are read from `hf_checkpoint` (refused without one)."""
    sharded = _sharded(module)
    wants_mtp = any(key.startswith(MTP_PREFIX) for key in sharded)
    from_hf = wants_mtp and not has_mtp_layers(ckpt_dir)
    if from_hf:
        if hf_checkpoint is None or weights is None:
            raise WeightMismatchError(
                f"{ckpt_dir} holds no MTP layers, and the model trains them; convert the HF "
                "checkpoint again (tools/convert_hf_to_megatron.py writes them) or turn "
                "recipe.train.mtp_training off"
            )
        sharded = {k: v for k, v in sharded.items() if not k.startswith(MTP_PREFIX)}
    module.load_state_dict(load_torch_dist_state(sharded, ckpt_dir), strict=False)
    if from_hf:
        assert hf_checkpoint is not None and weights is not None
        ckpt = HFCheckpoint(hf_checkpoint)
        try:
            load_hf_weights(module, ckpt, weights, prefix=MTP_PREFIX)
        finally:
            ckpt.close()


def has_mtp_layers(ckpt_dir: str | Path) -> bool:
    """Whether a torch_dist checkpoint holds MTP layers (reads its metadata only)."""
    keys = dist_checkpointing.load_tensors_metadata(str(ckpt_dir))
    return any(key.startswith(MTP_PREFIX) for key in keys)


def _sharded(module: nn.Module) -> dict[str, Any]:
    """megatron-core's sharded state dict of a MegatronModule."""
    sharded: dict[str, Any] = module.sharded_state_dict()  # type: ignore[operator]
    return sharded
