"""Data parallelism over gloo: one process group, explicit SUM all-reduces.

Losses are already divided by step-wide denominators, so summing gradients over ranks gives
the exact full-batch gradient; no averaging, no DDP hooks, and ranks may run different
numbers of micro-batches.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor, nn

from rlpost.backends.stores import process_group_store


@dataclass(frozen=True)
class DataParallel:
    """This process's place in the data-parallel group."""

    rank: int = 0
    world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    timeout_s: float = 600.0
    init_method: str | None = None  # default: tcp://master_addr:master_port

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def init(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank={self.rank} is outside world_size={self.world_size}")
        if not self.enabled or dist.is_initialized():
            return
        timeout = timedelta(seconds=self.timeout_s)
        dist.init_process_group(
            backend="gloo",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timeout,
            **process_group_store(
                self.init_method,
                self.master_addr,
                self.master_port,
                self.rank,
                self.world_size,
                timeout,
            ),
        )

    def sum(self, tensor: Tensor) -> Tensor:
        """All-reduce SUM in place (identity on one rank); returns the tensor."""
        if self.enabled:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def sum_grads(self, params: Iterable[nn.Parameter]) -> None:
        """Sum gradients over ranks in one flat bucket; missing grads count as zeros."""
        grads = []
        for p in params:
            if not p.requires_grad:
                continue
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        if not self.enabled:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def broadcast_params(self, module: nn.Module) -> None:
        """Make every rank start from rank 0's weights."""
        if self.enabled:
            for tensor in module.state_dict().values():
                dist.broadcast(tensor, src=0)

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def close(self) -> None:
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()
