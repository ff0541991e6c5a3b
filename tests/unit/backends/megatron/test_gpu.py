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
from rlpost.plan.layout import ParallelLayout
from rlpost.schema import AlgoConfig, ModelConfig, OptimConfig, TrainConfig
from rlpost.types import TrainSample

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def one_step(
    rank: int,
    world: int,
    port: int,
    model: ModelConfig,
    configs: tuple[AlgoConfig, OptimConfig, TrainConfig],
    par: ParallelLayout,
    samples: list[TrainSample],
) -> dict[str, Any]:
    trainer = MegatronTrainer(model, *configs, par, rank=rank, world_size=world, master_port=port)
    try:
        before = {n: w.clone() for b in trainer.iter_hf_weights() for n, w in b}
        metrics = trainer.train_step(samples)
        after = {n: w.clone() for b in trainer.iter_hf_weights() for n, w in b}
    finally:
        trainer.close()
    moved = max(float((after[n].float() - w.float()).abs().max()) for n, w in before.items())
    return {"metrics": metrics, "moved": moved, "compat": needs_cpu_compat()}


def test_trains_on_cuda_in_bf16(
    tiny_models: Callable[[str], ModelConfig],
    world: Callable[..., list[Any]],
    make_layout: Callable[..., ParallelLayout],
    make_rollout: Callable[..., list[TrainSample]],
    make_configs: Callable[..., Any],
) -> None:
    model = tiny_models("qwen3").model_copy(update={"params_dtype": "bf16"})
    [result] = world(one_step, 1, model, make_configs(), make_layout(), make_rollout(8))
    assert not result["compat"]
    assert math.isfinite(result["metrics"]["train/loss"]) and result["moved"] > 0


def offload_round_trip(
    rank: int,
    world: int,
    port: int,
    model: ModelConfig,
    configs: tuple[AlgoConfig, OptimConfig, TrainConfig],
    par: ParallelLayout,
    samples: list[TrainSample],
) -> dict[str, Any]:
    """Step, offload (as around a colocated rollout), onload, step: the second step must see
    the weights and Adam state the first one left."""
    trainer = MegatronTrainer(model, *configs, par, rank=rank, world_size=world, master_port=port)
    try:
        trainer.train_step(samples)
        before = {n: w.clone() for b in trainer.iter_hf_weights() for n, w in b}
        held = torch.cuda.memory_allocated()
        freed = trainer.offload()
        released = held - torch.cuda.memory_allocated()
        trainer.onload()
        after = {n: w.clone() for b in trainer.iter_hf_weights() for n, w in b}
        second = trainer.train_step(samples)
    finally:
        trainer.close()
    same = all(torch.equal(before[n], after[n]) for n in before)
    return {"freed": freed, "released": released, "same": same, "loss": second["train/loss"]}


def test_offload_frees_gpu_memory_and_onload_restores_the_state(
    tiny_models: Callable[[str], ModelConfig],
    world: Callable[..., list[Any]],
    make_layout: Callable[..., ParallelLayout],
    make_rollout: Callable[..., list[TrainSample]],
    make_configs: Callable[..., Any],
) -> None:
    model = tiny_models("qwen3").model_copy(update={"params_dtype": "bf16"})
    args = (model, make_configs(), make_layout(), make_rollout(8))
    [result] = world(offload_round_trip, 1, *args)
    assert result["freed"] > 0 and result["released"] >= result["freed"]
    assert result["same"] and math.isfinite(result["loss"])
