"""Megatron-only step arithmetic; the rest is shared with the torch backend (rlpost.algo.steps).

Ranks that meet in expert-parallel all-to-alls must run equally many micro-batches, so every
rank takes the largest count any rank needs (`equalize`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from rlpost.algo.steps import even_counts
from rlpost.backends.megatron.distributed import compute_device


def equalize(
    groups: list[list[list[int]]], lengths: Sequence[int], synced: bool
) -> list[list[list[int]]]:
    """Every rank's micro-batch count per entry raised to the world's largest."""
    counts = torch.tensor([len(g) for g in groups], dtype=torch.long)
    if synced and dist.is_initialized() and dist.get_world_size() > 1:
        counts = counts.to(compute_device())
        dist.all_reduce(counts, op=dist.ReduceOp.MAX)
    return even_counts(groups, lengths, [int(n) for n in counts.tolist()])
