"""Where one train step's time goes, for benchmarks/megatron_train.py --profile: the top
kernels (torch.profiler, by self device time on CUDA, self CPU time on CPU) and the host reads
of tensor values, each of which waits for the GPU.

Host reads are seen by a TorchFunctionMode: Tensor.item, tolist, cpu, numpy, __int__,
__float__, __bool__, __index__, and .to() towards the host (a TorchDispatchMode misses
.tolist() and .cpu() on CPU tensors, so on CPU it would undercount).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

T = torch.Tensor
READS = {T.item, T.tolist, T.cpu, T.numpy, T.__int__, T.__float__, T.__bool__, T.__index__}


def _to_host(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    device = kwargs.get("device")
    for arg in args[1:]:
        if isinstance(arg, str | torch.device):
            device = arg
    return device is not None and torch.device(device).type == "cpu"


class HostReads(TorchFunctionMode):
    """Counts host reads of tensor values by kind while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func in READS or (func is T.to and _to_host(args, kwargs)):
            self.counts[getattr(func, "__name__", str(func))] += 1
        return func(*args, **kwargs)


def count_host_reads(step: Callable[[], object]) -> Counter[str]:
    with HostReads() as mode:
        step()
    return mode.counts


def top_kernels(step: Callable[[], object], rows: int = 15) -> str:
    """One step under torch.profiler, the table of its `rows` costliest ops."""
    from torch.profiler import ProfilerActivity, profile

    on_gpu = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        step()
        if on_gpu:
            torch.cuda.synchronize()
    key = "self_device_time_total" if on_gpu else "self_cpu_time_total"
    return str(prof.key_averages().table(sort_by=key, row_limit=rows))


def profile_report(step: Callable[[], object], rows: int = 15) -> str:
    """Host reads of one step, then the top kernels of another."""
    reads = count_host_reads(step)
    kinds = ", ".join(f"{name} {n}" for name, n in reads.most_common()) or "none"
    return f"host reads per train step: {sum(reads.values())} ({kinds})\n" + top_kernels(step, rows)
