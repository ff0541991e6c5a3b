"""Process groups for megatron-core: torch.distributed (gloo on CPU, nccl on GPU), then
megatron-core's tensor/pipeline/context/expert/data-parallel groups and RNG states."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from torch import Tensor

from rlpost.backends.megatron.compat import (
    check_megatron_version,
    install_te_fallbacks,
    model_parallel_cpu_manual_seed,
    needs_cpu_compat,
)
from rlpost.backends.megatron.config import ParallelSizes
from rlpost.backends.stores import process_group_store


@dataclass(frozen=True)
class ProcessPlace:
    """This process in the training world."""

    rank: int = 0
    world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    timeout_s: float = 600.0
    init_method: str | None = None  # default: tcp://master_addr:master_port


def init_parallel(place: ProcessPlace, sizes: ParallelSizes, seed: int) -> None:
    """torch.distributed, then megatron-core's groups; idempotent for the same sizes."""
    check_megatron_version()
    if sizes.world_size != place.world_size:
        raise ValueError(
            f"the layout needs tp x pp x cp x dp = {sizes.world_size} processes, but "
            f"world_size={place.world_size}; start one trainer process per train GPU"
        )
    if not dist.is_initialized():
        backend = "gloo" if needs_cpu_compat() else "nccl"
        if backend == "nccl":
            torch.cuda.set_device(place.rank % torch.cuda.device_count())
        timeout = timedelta(seconds=place.timeout_s)
        dist.init_process_group(
            backend=backend,
            rank=place.rank,
            world_size=place.world_size,
            timeout=timeout,
            **process_group_store(
                place.init_method,
                place.master_addr,
                place.master_port,
                place.rank,
                place.world_size,
                timeout,
            ),
        )
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            **sizes.init_kwargs(), create_gloo_process_groups=needs_cpu_compat()
        )
    install_te_fallbacks()  # before any model is built, GPU machines without TE included
    model_parallel_cpu_manual_seed(seed)


def destroy_parallel() -> None:
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def compute_device() -> torch.device:
    """Where this rank computes, and where its collectives want their tensors (NCCL takes
    CUDA tensors only)."""
    if needs_cpu_compat():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def all_reduce_sum(tensor: Tensor, group: dist.ProcessGroup | None = None) -> Tensor:
    """Sum `tensor` over `group` in place, wherever it lives (a host tensor makes the round
    trip through the compute device)."""
    device = compute_device()
    if tensor.device == device:
        dist.all_reduce(tensor, group=group)
        return tensor
    on_device = tensor.to(device)
    dist.all_reduce(on_device, group=group)
    tensor.copy_(on_device.to(tensor.device))
    return tensor
