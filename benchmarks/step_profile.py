"""Where one train step's time goes, for benchmarks/megatron_train.py --profile: the top
kernels (torch.profiler, by self device time on CUDA, self CPU time on CPU) and the host reads
of tensor values, each of which waits for the GPU.

Host reads are counted by rlpost.backends.host_reads.HostReads.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch

from rlpost.backends.host_reads import HostReads


def count_host_reads(step: Callable[[], object]) -> Counter[str]:
    with HostReads() as mode:
        step()
    return mode.counts


def top_kernels(step: Callable[[], object], rows: int = 15) -> str:
    """One step under torch.profiler: the table of its `rows` costliest ops, then the same ops
    by input shapes (which tells a RoPE multiply from a SwiGLU one)."""
    from torch.profiler import ProfilerActivity, profile

    on_gpu = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities, record_shapes=True) as prof:
        step()
        if on_gpu:
            torch.cuda.synchronize()
    key = "self_device_time_total" if on_gpu else "self_cpu_time_total"
    by_op = prof.key_averages().table(sort_by=key, row_limit=rows)
    by_shape = prof.key_averages(group_by_input_shape=True).table(
        sort_by=key, row_limit=2 * rows, max_name_column_width=40, max_shapes_column_width=70
    )
    return f"{by_op}\n\nby input shapes\n{by_shape}"


def profile_report(step: Callable[[], object], rows: int = 15) -> str:
    """Host reads of one step, then the top kernels of another."""
    reads = count_host_reads(step)
    kinds = ", ".join(f"{name} {n}" for name, n in reads.most_common()) or "none"
    return f"host reads per train step: {sum(reads.values())} ({kinds})\n" + top_kernels(step, rows)
