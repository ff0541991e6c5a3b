"""Where one train step's time goes, for benchmarks/megatron_train.py --profile: the top
kernels (torch.profiler, by self device time on CUDA, self CPU time on CPU), on CUDA the device
time by kind of kernel (attention, matmuls, RMSNorm, the compiled kernels by what they fuse,
copies and conversions, ...) beside the profiled step's wall time, and the host reads of tensor
values, each of which waits for the GPU.

Host reads are counted by rlpost.backends.host_reads.HostReads.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import torch

from rlpost.backends.host_reads import HostReads


def count_host_reads(step: Callable[[], object]) -> Counter[str]:
    reads = HostReads()
    with reads:
        step()
    return reads.counts


KINDS: list[tuple[str, str]] = [
    ("attention", r"flash|fmha|cudnn|attention|sdpa"),
    ("optimizer", r"adam|multi_tensor"),
    ("communication", r"nccl"),
    ("rms_norm", r"rms_?norm|layer_norm|gammabeta|norm_grad"),
    ("compiled: swiglu", r"^triton.*silu"),
    ("compiled: rope", r"^triton.*(cat|neg).*mul|^triton.*mul.*(cat|neg)"),
    ("compiled: other", r"^triton"),
    ("matmuls", r"gemm|nvjet|cutlass|xmma|cublas|s16816|sm90_|sm80_|matmul"),
    ("copies and conversions", r"copy|memcpy|memset|cast|convert"),
    ("reductions", r"reduce"),
    ("indexing", r"index|gather|scatter"),
    ("other elementwise", r"elementwise"),
]
"""Kinds of CUDA kernels by name (the first pattern that matches, case-insensitive)."""


def kernel_kind(name: str) -> str:
    for kind, pattern in KINDS:
        if re.search(pattern, name, re.IGNORECASE):
            return kind
    return "other"


def device_time_by_kind(averages: Iterable[Any]) -> Counter[str]:
    """Milliseconds of device time by `kernel_kind`, over the profiler's averages of the CUDA
    kernels (an entry whose device_type is CUDA is a kernel, not the op that launched it)."""
    from torch.profiler import DeviceType

    kinds: Counter[str] = Counter()
    for entry in averages:
        if getattr(entry, "device_type", None) == DeviceType.CUDA:
            kinds[kernel_kind(entry.key)] += entry.self_device_time_total / 1e3
    return kinds


def kinds_table(kinds: Counter[str], wall_ms: float) -> str:
    busy = sum(kinds.values())
    lines = [f"device time by kind, one profiled step of {wall_ms:,.0f} ms wall time "
             f"({busy:,.0f} ms of kernels, {busy / max(wall_ms, 1e-9):.2f} of it)"]  # fmt: skip
    for kind, ms in kinds.most_common():
        lines.append(f"  {kind:26} {ms:9.1f} ms  {ms / max(busy, 1e-9):6.1%}")
    return "\n".join(lines)


def top_kernels(step: Callable[[], object], rows: int = 15) -> str:
    """One step under torch.profiler: the table of its `rows` costliest ops, then the same ops
    by input shapes (which tells a RoPE multiply from a SwiGLU one); on CUDA first the device
    time by kind of kernel."""
    from torch.profiler import ProfilerActivity, profile

    on_gpu = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities, record_shapes=True) as prof:
        start = time.perf_counter()
        step()
        if on_gpu:
            torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - start) * 1e3
    key = "self_device_time_total" if on_gpu else "self_cpu_time_total"
    averages = prof.key_averages()
    by_op = averages.table(sort_by=key, row_limit=rows)
    by_shape = prof.key_averages(group_by_input_shape=True).table(
        sort_by=key, row_limit=2 * rows, max_name_column_width=40, max_shapes_column_width=70
    )
    kinds = ""
    if on_gpu:
        try:
            kinds = kinds_table(device_time_by_kind(averages), wall_ms) + "\n\n"
        except Exception as error:  # the tables below stand without it
            kinds = f"device time by kind: not available ({type(error).__name__}: {error})\n\n"
    return f"{kinds}{by_op}\n\nby input shapes\n{by_shape}"


def profile_report(step: Callable[[], object], rows: int = 15) -> str:
    """Host reads of one step, then the top kernels of another."""
    reads = count_host_reads(step)
    kinds = ", ".join(f"{name} {n}" for name, n in reads.most_common()) or "none"
    return f"host reads per train step: {sum(reads.values())} ({kinds})\n" + top_kernels(step, rows)
