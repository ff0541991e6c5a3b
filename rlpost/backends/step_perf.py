"""A train step's peak memory, time and MFU beside the plan's prediction (both trainers).

`perf/memory_vs_plan`: on CUDA, torch.cuda.max_memory_allocated since the step began over the
plan's per-GPU training estimate less its overhead term (the CUDA context and workspaces, which
the allocator does not see); on CPU, the train rank's peak resident memory over the step
(VmHWM, reset at the step's start where Linux allows it, else the process's lifetime peak)
less its resident memory before the trainer built anything (the interpreter and its
libraries, which the estimate does not count), over the same estimate (whose overhead term is
0 there). Freed host memory the allocator keeps for reuse still counts as resident.
`perf/train_time_vs_plan`: the step's seconds over the cost model's training seconds per
rollout. `perf/mfu` (CUDA only): model
FLOPs (rlpost.plan.flops) over the step's seconds x train GPUs x the profile's peak. The model
FLOPs are the samples' as the rollout gives them: where the torch trainer packs a group's
prompt once, it computes less than that, and its MFU reads high by as much.
"""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Sequence
from pathlib import Path

import torch

from rlpost.plan.flops import TRAIN_FORWARDS, mfu
from rlpost.plan.prediction import TrainPrediction

GIB = 1024**3
CLEAR_REFS = Path("/proc/self/clear_refs")
STATUS = Path("/proc/self/status")


def vs_plan(
    prediction: TrainPrediction, peak_memory_gib: float, train_s: float
) -> dict[str, float]:
    return {
        "perf/peak_memory_gib": peak_memory_gib,
        "perf/memory_vs_plan": peak_memory_gib / prediction.memory_gib,
        "perf/train_time_vs_plan": train_s / prediction.train_s,
    }


def forwards_run(reused_old_logprobs: bool, ran_reference: bool) -> float:
    """The model forwards a rollout ran: training's three, and each no-grad one."""
    return TRAIN_FORWARDS + (0.0 if reused_old_logprobs else 1.0) + float(ran_reference)


def _rss_peak_gib() -> float:
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / GIB  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB  # Linux: KiB


def host_memory_now_gib() -> float:
    """This process's resident memory now (VmRSS), the CPU baseline of `StepMeter`."""
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / GIB  # kB
    except OSError:
        pass
    return 0.0


def _reset_rss_peak() -> None:
    # resets VmHWM (Linux >= 4.0); where it cannot, the lifetime peak: never below the step's
    with contextlib.suppress(OSError):
        CLEAR_REFS.write_text("5")


class StepMeter:
    """`start()` when a train step begins; `metrics()` when it ends."""

    def __init__(
        self,
        device: torch.device,
        world_size: int,
        prediction: TrainPrediction | None,
        host_baseline_gib: float = 0.0,
    ) -> None:
        """`host_baseline_gib`: the process's resident memory before the trainer built its
        models (host_memory_now_gib), left out of a CPU step's peak."""
        self.cuda = device.type == "cuda" and torch.cuda.is_available()
        self.device, self.world_size = device, world_size
        self.prediction = prediction
        self.host_baseline_gib = host_baseline_gib

    def start(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            _reset_rss_peak()

    def peak_memory_gib(self) -> float:
        if self.cuda:
            return torch.cuda.max_memory_allocated(self.device) / GIB
        return _rss_peak_gib() - self.host_baseline_gib

    def metrics(self, lengths: Sequence[int], forwards: float, train_s: float) -> dict[str, float]:
        peak = self.peak_memory_gib()
        if self.prediction is None:
            return {"perf/peak_memory_gib": peak}
        out = vs_plan(self.prediction, peak, train_s)
        if self.cuda:
            flops = self.prediction.flops.over(lengths, forwards)
            out["perf/mfu"] = mfu(flops, train_s, self.world_size, self.prediction.peak_tflops)
        return out
