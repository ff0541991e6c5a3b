"""The CPU layer: version gate, scope (on inside `cpu_compat`, off outside and on CUDA
machines), device redirection, and the CPU RNG tracker."""

from __future__ import annotations

import pytest
import torch
from megatron.core import package_info

from rlpost.backends.megatron import compat


def test_refuses_another_megatron_minor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(package_info, "MINOR", 17)
    with pytest.raises(RuntimeError, match=r"written for 0\.16\.x"):
        compat.check_megatron_version()
    with pytest.raises(RuntimeError, match=r"0\.17"), compat.cpu_compat():
        pass


def test_cuda_requests_land_on_cpu_only_inside() -> None:
    original = torch.cuda.current_device
    with compat.cpu_compat():
        assert torch.empty(3, device="cuda").device.type == "cpu"
        assert torch.zeros(2, device=torch.cuda.current_device()).device.type == "cpu"
        assert torch.ones(2).cuda().to("cuda").device.type == "cpu"
        assert torch.ones(2).type() == "torch.cuda.FloatTensor"
        with torch.cuda.stream(torch.cuda.Stream()):
            torch.cuda.current_stream().record_event().synchronize()
    assert torch.cuda.current_device is original
    assert torch.ones(2).type() == "torch.FloatTensor"


def test_inactive_where_cuda_is_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    original = torch.cuda.current_device
    with compat.cpu_compat():
        assert torch.cuda.current_device is original
        assert torch.ones(2).type() == "torch.FloatTensor"


def test_rng_tracker_forks_and_restores_the_cpu_generator() -> None:
    tracker = compat.CpuRNGStatesTracker()
    tracker.add("model-parallel-rng", 7)
    torch.manual_seed(0)
    outside = torch.get_rng_state()
    with tracker.fork("model-parallel-rng"):
        first = torch.rand(3)
    assert torch.equal(torch.get_rng_state(), outside)
    with tracker.fork("model-parallel-rng"):
        second = torch.rand(3)
    torch.manual_seed(7)
    assert torch.equal(first, torch.rand(3)) and not torch.equal(first, second)
    with pytest.raises(ValueError, match="seed 7"):
        tracker.add("other", 7)


def test_checkpoint_writes_stay_in_process_and_restore() -> None:
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    before = filesystem_async._results_queue
    with compat.in_process_checkpoint_writes():
        assert filesystem_async._results_queue is not None
    assert filesystem_async._results_queue is before
