"""The weight-update process group, formed the way SGLang's engines form theirs.

For distributed weight sync the trainer (rank 0) and every engine TP rank (ranks 1..) meet
at the trainer's address: a TCP store the trainer serves on that address alone
(rlpost.backends.stores), prefixed with the group's name, and a
group built outside the default one, so it coexists with the trainer's own data-parallel
group and the engine's TP group. SGLang's `init_custom_process_group` builds its side in the
same steps, so the keys both sides write to the store agree (for the same torch release).
rlpost's CPU engine joins with this module too, over gloo.

This reaches into torch.distributed internals (`_new_process_group_helper`, `_world`):
there is no public API for a second, non-default group with its own rendezvous. Checked
against torch 2.13; revisit when torch changes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import cast

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed import distributed_c10d as c10d

from rlpost.backends.sglang.buckets import WeightInfo, to_dtype
from rlpost.backends.stores import tcp_store


def init_update_group(
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    group_name: str,
    backend: str = "nccl",
    timeout_s: float = 600.0,
) -> dist.ProcessGroup:
    """Join (rank 0: host) the group; blocks until all `world_size` ranks have joined."""
    timeout = timedelta(seconds=timeout_s)
    # rank 0 serves the rendezvous on master_address alone; the engines connect by URL
    store = tcp_store(master_address, master_port, rank, world_size, timeout)
    store = c10d.PrefixStore(group_name, store)
    group: dist.ProcessGroup
    group, _ = c10d._new_process_group_helper(
        world_size,
        rank,
        [],
        backend,
        store,
        group_name=cast("c10d.GroupName", group_name),  # a NewType of str
        timeout=timeout,
    )
    # Group-rank bookkeeping torch keeps for registered groups: destroy needs it.
    c10d._world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group


def destroy_update_group(group: dist.ProcessGroup) -> None:
    dist.destroy_process_group(group)


def _wire(tensor: Tensor) -> Tensor:
    """FP8 travels as its bytes (gloo has no float8 types; NCCL's are newer than ours)."""
    return tensor.view(torch.uint8) if tensor.dtype == torch.float8_e4m3fn else tensor


def broadcast_weights(tensors: Sequence[Tensor], group: dist.ProcessGroup) -> None:
    """Send from group rank 0, in order; receivers allocate from the same WeightInfo list."""
    for tensor in tensors:
        dist.broadcast(_wire(tensor.detach().contiguous()), group=group, group_src=0)


def receive_weights(
    infos: Sequence[WeightInfo], group: dist.ProcessGroup, device: str | torch.device = "cpu"
) -> list[tuple[str, Tensor]]:
    received = []
    for info in infos:
        tensor = torch.empty(info.shape, dtype=to_dtype(info.dtype), device=device)
        dist.broadcast(_wire(tensor), group=group, group_src=0)
        received.append((info.name, tensor))
    return received
