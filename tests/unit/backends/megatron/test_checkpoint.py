"""save_checkpoint / load_checkpoint: a run resumed from a checkpoint takes the same next step
as the run that kept going (weights, Adam moments and step count all restored)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from rlpost.backends.megatron.trainer import MegatronTrainer
from rlpost.plan.layout import ParallelLayout
from rlpost.schema import AlgoConfig, ModelConfig, OptimConfig, TrainConfig
from rlpost.types import TrainSample


def step_after(
    rank: int,
    world: int,
    port: int,
    model: ModelConfig,
    configs: tuple[AlgoConfig, OptimConfig, TrainConfig],
    par: ParallelLayout,
    samples: list[TrainSample],
    ckpt: Path,
    resume: bool,
) -> dict[str, Any] | None:
    """Keep going: step, save, step. Resume: load, step. Returns the last step's results."""
    trainer = MegatronTrainer(model, *configs, par, rank=rank, world_size=world, master_port=port)
    try:
        if resume:
            trainer.load_checkpoint(ckpt)
        else:
            trainer.train_step(samples)
            trainer.save_checkpoint(ckpt)
        metrics = trainer.train_step(samples)
        weights = dict(kv for b in trainer.iter_hf_weights() for kv in b)
        step = trainer.step
    finally:
        trainer.close()
    return {"metrics": metrics, "weights": weights, "step": step} if rank == 0 else None


@pytest.mark.parametrize(
    ("arch", "sizes"),
    [("qwen3", {"dp": 2}), ("glm4_moe", {"ep": 2, "dp": 2})],
    ids=["dense-dp2", "moe-ep2"],
)
def test_resumed_run_takes_the_same_step(
    arch: str,
    sizes: dict[str, int],
    tiny_models: Callable[[str], ModelConfig],
    world: Callable[..., list[Any]],
    make_layout: Callable[..., ParallelLayout],
    make_rollout: Callable[..., list[TrainSample]],
    make_configs: Callable[..., Any],
    tmp_path: Path,
) -> None:
    model, samples, configs = tiny_models(arch), make_rollout(8, seed=9), make_configs()
    par = make_layout(**sizes)
    kept = world(step_after, par.world, model, configs, par, samples, tmp_path, False)[0]
    resumed = world(step_after, par.world, model, configs, par, samples, tmp_path, True)[0]
    assert resumed["step"] == kept["step"] == 2
    assert resumed["metrics"]["train/loss"] == pytest.approx(
        kept["metrics"]["train/loss"], abs=1e-7
    )
    for name, weight in kept["weights"].items():
        assert torch.allclose(resumed["weights"][name], weight, atol=1e-7, rtol=0), name


def weights_after_load(
    rank: int,
    world: int,
    port: int,
    model: ModelConfig,
    configs: tuple[AlgoConfig, OptimConfig, TrainConfig],
    par: ParallelLayout,
    samples: list[TrainSample],
    ckpt: Path,
    resume: bool,
) -> dict[str, Any] | None:
    """Save without the optimizer after a step, or load such a checkpoint: the weights."""
    trainer = MegatronTrainer(model, *configs, par, rank=rank, world_size=world, master_port=port)
    try:
        if resume:
            trainer.load_checkpoint(ckpt)
        else:
            trainer.train_step(samples)
            trainer.save_checkpoint(ckpt, with_optimizer=False)
        # copies: a replicated weight comes back as the live parameter, which the next step moves
        weights = {n: w.clone() for b in trainer.iter_hf_weights() for n, w in b}
        step = trainer.step
        metrics = trainer.train_step(samples)  # Adam starts over from the loaded weights
    finally:
        trainer.close()
    return {"weights": weights, "step": step, "metrics": metrics} if rank == 0 else None


def test_a_checkpoint_without_optimizer_restores_weights_and_step(
    tiny_models: Callable[[str], ModelConfig],
    world: Callable[..., list[Any]],
    make_layout: Callable[..., ParallelLayout],
    make_rollout: Callable[..., list[TrainSample]],
    make_configs: Callable[..., Any],
    tmp_path: Path,
) -> None:
    model, samples, configs = tiny_models("qwen3"), make_rollout(8, seed=9), make_configs()
    par = make_layout(tp=2)
    saved = world(weights_after_load, par.world, model, configs, par, samples, tmp_path, False)[0]
    loaded = world(weights_after_load, par.world, model, configs, par, samples, tmp_path, True)[0]
    assert loaded["step"] == saved["step"] == 1
    for name, weight in saved["weights"].items():
        assert torch.equal(loaded["weights"][name], weight), name
    assert loaded["metrics"]["train/loss"] == loaded["metrics"]["train/loss"]  # it trains on
