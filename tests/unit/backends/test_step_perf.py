"""A train step's measurements beside the plan's prediction (rlpost.backends.step_perf)."""

from __future__ import annotations

import pytest
import torch

from rlpost.backends.step_perf import StepMeter, forwards_run, host_memory_now_gib, vs_plan
from rlpost.plan.flops import ForwardFlops
from rlpost.plan.prediction import TrainPrediction

PREDICTION = TrainPrediction(
    train_s=2.0, memory_gib=4.0, peak_tflops=989.0, flops=ForwardFlops(10.0, 1.0)
)


def test_ratios_are_measured_over_predicted() -> None:
    assert vs_plan(PREDICTION, 5.0, 3.0) == {
        "perf/peak_memory_gib": 5.0,
        "perf/memory_vs_plan": 1.25,
        "perf/train_time_vs_plan": 1.5,
    }


def test_forwards_count_training_and_each_no_grad_forward_that_ran() -> None:
    assert forwards_run(reused_old_logprobs=True, ran_reference=False) == 3.0
    assert forwards_run(reused_old_logprobs=False, ran_reference=True) == 5.0


def test_cpu_step_reports_its_peak_resident_memory_and_no_mfu() -> None:
    meter = StepMeter(torch.device("cpu"), 1, PREDICTION, host_memory_now_gib())
    meter.start()
    block = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MiB, touched
    metrics = meter.metrics([4, 4], 3.0, 1.0)
    del block
    assert "perf/mfu" not in metrics
    # the growth over the resident memory before: the block, not the interpreter
    assert 64 / 1024 < metrics["perf/peak_memory_gib"] < 0.5
    assert metrics["perf/memory_vs_plan"] == pytest.approx(metrics["perf/peak_memory_gib"] / 4.0)
    assert metrics["perf/train_time_vs_plan"] == 0.5


def test_without_a_prediction_only_the_peak_is_logged() -> None:
    metrics = StepMeter(torch.device("cpu"), 1, None).metrics([4], 3.0, 1.0)
    assert list(metrics) == ["perf/peak_memory_gib"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_step_reads_the_allocators_peak_since_it_began_and_reports_mfu() -> None:
    device = torch.device("cuda")
    big = torch.ones(256 << 20, dtype=torch.uint8, device=device)
    del big  # a peak before the step: not the step's
    meter = StepMeter(device, 1, PREDICTION)
    meter.start()
    block = torch.ones(16 << 20, dtype=torch.uint8, device=device)
    metrics = meter.metrics([4, 4], 3.0, 1.0)
    del block
    assert 16 / 1024 <= metrics["perf/peak_memory_gib"] < 256 / 1024
    assert metrics["perf/mfu"] == pytest.approx(PREDICTION.flops.over([4, 4], 3.0) / 989e12)
