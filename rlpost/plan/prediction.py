"""What the plan predicts of one rollout's training, for each run to log beside what it measured.

Every run is a test of the planner: the trainers log `perf/memory_vs_plan` (peak memory of the
step over `memory_gib`) and `perf/train_time_vs_plan` (the step's seconds over `train_s`), and
on GPUs `perf/mfu` against `peak_tflops`. The numbers travel to the train ranks in the
TrainerSpec; nothing is re-derived there.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlpost.plan.batch import BatchPlan
from rlpost.plan.cost import train_time
from rlpost.plan.flops import ForwardFlops, forward_flops
from rlpost.plan.layout import ParallelLayout
from rlpost.plan.memory import TrainMemory
from rlpost.plan.work import TrainWork
from rlpost.schema import RunConfig

RANK_PEAK_METRICS = ("perf/peak_memory_gib", "perf/memory_vs_plan")
"""Each train rank measures its own; the run logs the largest (the plan sizes the fullest GPU)."""


@dataclass(frozen=True)
class TrainPrediction:
    train_s: float  # the cost model's training seconds per rollout (rlpost.plan.cost)
    # per GPU, the training estimate less its overhead term (CUDA context, NCCL and cuBLAS
    # workspaces: outside torch's allocator; 0 on CPU): what max_memory_allocated or, on
    # CPU, the train rank's peak RSS is held to
    memory_gib: float
    peak_tflops: float  # per GPU: the hardware profile's peak_bf16_tflops, MFU's denominator
    flops: ForwardFlops  # the model's, for the FLOPs of the samples a step trained


def predict_train(
    cfg: RunConfig,
    par: ParallelLayout,
    batch: BatchPlan,
    work: TrainWork,
    memory: TrainMemory,
    train_gpus: int,
) -> TrainPrediction:
    return TrainPrediction(
        train_s=train_time(cfg, par, batch, work, memory, train_gpus).total_s,
        memory_gib=memory.total_gib - memory.overhead_gib,
        peak_tflops=cfg.hardware.peak_bf16_tflops,
        flops=forward_flops(cfg.model),
    )
