"""Weights in size-bounded buckets: which tensors travel to the engines together.

A bucket holds tensors of one dtype in a fixed order, so it can travel as one flattened
tensor (one IPC handle instead of hundreds) and the receiver can allocate it from the list.
A tensor larger than the bound travels alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class WeightInfo:
    """A weight as the receiving side must allocate it."""

    name: str
    dtype: str  # torch dtype without the "torch." prefix, as SGLang's requests name it
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty(0, dtype=to_dtype(self.dtype)).element_size()


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def to_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"'{name}' is not a torch dtype")
    return dtype


def weight_infos(named: Sequence[tuple[str, Tensor]]) -> list[WeightInfo]:
    return [WeightInfo(n, dtype_name(t.dtype), tuple(t.shape)) for n, t in named]


def plan_buckets(weights: Sequence[WeightInfo], max_bytes: int) -> list[list[WeightInfo]]:
    """Consecutive weights of one dtype, at most `max_bytes` per bucket (an oversized
    weight gets a bucket of its own). Order within a dtype is kept."""
    if max_bytes <= 0:
        raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
    buckets: list[list[WeightInfo]] = []
    open_by_dtype: dict[str, tuple[list[WeightInfo], int]] = {}
    for weight in weights:
        current, used = open_by_dtype.get(weight.dtype, ([], 0))
        if current and used + weight.nbytes > max_bytes:
            buckets.append(current)
            current, used = [], 0
        current.append(weight)
        open_by_dtype[weight.dtype] = (current, used + weight.nbytes)
    buckets.extend(bucket for bucket, _ in open_by_dtype.values() if bucket)
    return buckets
