"""On a CUDA machine the CPU layer stays off and the same trainer runs in bf16 over NCCL.

Skipped without CUDA (the CPU tests cover the logic); run on a GPU machine with
`pytest -m gpu tests/unit/backends/megatron`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from rlpost.backends.megatron.compat import needs_cpu_compat
from rlpost.backends.megatron.trainer import MegatronTrainer
from rlpost.types import TrainSample

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


BF16 = {"params_dtype": "bf16"}


def one_step(trainer: MegatronTrainer, samples: list[TrainSample]) -> dict[str, Any]:
    before = {n: w.clone() for b in trainer.iter_hf_weights() for n, w in b}
    metrics = trainer.train_step(samples)
    after = {n: w.clone() for b in trainer.iter_hf_weights() for n, w in b}
    moved = max(float((after[n].float() - w.float()).abs().max()) for n, w in before.items())
    return {"metrics": metrics, "moved": moved, "compat": needs_cpu_compat()}


def test_trains_on_cuda_in_bf16(
    make_setup: Callable[..., Any], make_rollout: Callable[..., list[TrainSample]]
) -> None:
    result = make_setup("qwen3").with_model(**BF16).run(one_step, make_rollout(8))
    assert not result["compat"]
    assert math.isfinite(result["metrics"]["train/loss"]) and result["moved"] > 0


def offload_round_trip(trainer: MegatronTrainer, samples: list[TrainSample]) -> dict[str, Any]:
    """Step, offload (as around a colocated rollout), onload, step: the second step must see
    the weights and Adam state the first one left."""
    trainer.train_step(samples)
    before = {n: w.clone() for b in trainer.iter_hf_weights() for n, w in b}
    held = torch.cuda.memory_allocated()
    freed = trainer.offload()
    released = held - torch.cuda.memory_allocated()
    trainer.onload()
    after = {n: w.clone() for b in trainer.iter_hf_weights() for n, w in b}
    second = trainer.train_step(samples)
    same = all(torch.equal(before[n], after[n]) for n in before)
    return {"freed": freed, "released": released, "same": same, "loss": second["train/loss"]}


def test_offload_frees_gpu_memory_and_onload_restores_the_state(
    make_setup: Callable[..., Any], make_rollout: Callable[..., list[TrainSample]]
) -> None:
    result = make_setup("qwen3").with_model(**BF16).run(offload_round_trip, make_rollout(8))
    assert result["freed"] > 0 and result["released"] >= result["freed"]
    assert result["same"] and math.isfinite(result["loss"])
