"""save_checkpoint / load_checkpoint: a run resumed from a checkpoint takes the same next step
as the run that kept going (weights, Adam moments and step count all restored)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from rlpost.types import TrainSample


@pytest.mark.parametrize(
    ("arch", "sizes"),
    [("qwen3", {"dp": 2}), ("glm4_moe", {"ep": 2, "dp": 2})],
    ids=["dense-dp2", "moe-ep2"],
)
def test_resumed_run_takes_the_same_step(
    arch: str,
    sizes: dict[str, int],
    make_setup: Callable[..., Any],
    make_rollout: Callable[..., list[TrainSample]],
    kept_and_resumed: Callable[..., tuple[dict[str, Any], dict[str, Any]]],
) -> None:
    kept, resumed = kept_and_resumed(make_setup(arch, **sizes), make_rollout(8, seed=9))
    assert resumed["step"] == kept["step"] == 2
    assert resumed["metrics"]["train/loss"] == pytest.approx(
        kept["metrics"]["train/loss"], abs=1e-7
    )
    for name, weight in kept["weights"].items():
        assert torch.allclose(resumed["weights"][name], weight, atol=1e-7, rtol=0), name


def test_a_checkpoint_without_optimizer_restores_weights_and_step(
    make_setup: Callable[..., Any],
    make_rollout: Callable[..., list[TrainSample]],
    kept_and_resumed: Callable[..., tuple[dict[str, Any], dict[str, Any]]],
) -> None:
    setup, samples = make_setup("qwen3", tp=2), make_rollout(8, seed=9)
    saved, loaded = kept_and_resumed(setup, samples, with_optimizer=False)
    assert loaded["saved_step"] == saved["saved_step"] == 1
    for name, weight in saved["saved_weights"].items():
        assert torch.equal(loaded["saved_weights"][name], weight), name
    # the next step starts from the same weights (the same loss) with Adam started over, so it
    # moves them otherwise than the run that kept its moments
    assert loaded["step"] == saved["step"] == 2
    assert loaded["metrics"]["train/loss"] == pytest.approx(
        saved["metrics"]["train/loss"], abs=1e-7
    )
    assert any(not torch.allclose(loaded["weights"][n], w) for n, w in saved["weights"].items())


def trained_and_saved(trainer: Any, samples: list[TrainSample], ckpt: Any) -> dict[str, Any]:
    trainer.train_step(samples)
    trainer.save_checkpoint(ckpt)
    weights = {n: w.clone() for b in trainer.iter_hf_weights() for n, w in b}
    return {"step": trainer.step, "weights": weights}


def loaded_weights(trainer: Any, ckpt: Any) -> dict[str, Any]:
    """mode=eval's trainer: the checkpoint loaded, and the weights it would send."""
    trainer.load_checkpoint(ckpt)
    weights = {n: w.clone() for b in trainer.iter_hf_weights() for n, w in b}
    return {"optimizer": trainer.optimizer, "step": trainer.step, "weights": weights}


@pytest.mark.parametrize(
    ("arch", "saved", "loaded"),
    [("qwen3", {"tp": 2}, {"dp": 2}), ("glm4_moe", {"ep": 2, "dp": 2}, {"dp": 2})],
    ids=["dense-tp2-to-dp2", "moe-ep2-to-dp2"],
)
def test_an_evaluation_trainer_loads_a_checkpoints_weights_alone_and_sends_them(
    arch: str,
    saved: dict[str, int],
    loaded: dict[str, int],
    tmp_path: Any,
    make_setup: Callable[..., Any],
    make_layout: Callable[..., Any],
    make_rollout: Callable[..., list[TrainSample]],
) -> None:
    """Built without gradient buffers or an optimizer (trains=False), under another layout,
    it reads the model part of a checkpoint saved with Adam's state and sends exactly the
    weights the training run held at that checkpoint."""
    from dataclasses import replace

    setup = make_setup(arch, **saved)
    samples = make_rollout(8, seed=9)
    ckpt = tmp_path / "checkpoint"
    kept = setup.run(trained_and_saved, samples, ckpt)
    evaluation = replace(setup, layout=make_layout(**loaded), trains=False)
    got = evaluation.run(loaded_weights, ckpt)
    assert got["optimizer"] is None and got["step"] == kept["step"] == 1
    assert got["weights"].keys() == kept["weights"].keys()
    for name, weight in kept["weights"].items():
        assert torch.equal(got["weights"][name], weight), name


# (architecture, layout saved under, layout resumed under); every world is 2 ranks
RESHARDS = [
    ("qwen3", {"tp": 2}, {"dp": 2}),
    ("qwen3", {"dp": 2}, {"tp": 2}),
    ("qwen3", {"pp": 2}, {"dp": 2}),
    ("qwen3", {"dp": 2}, {"pp": 2}),
    ("glm4_moe", {"ep": 2, "dp": 2}, {"dp": 2}),
    ("glm4_moe", {"dp": 2}, {"ep": 2, "dp": 2}),
    # Adam replicated on every rank (no distributed optimizer)
    ("qwen3", {"tp": 2, "distributed_optimizer": False}, {"dp": 2, "distributed_optimizer": False}),
]


@pytest.mark.parametrize(
    ("arch", "saved", "resumed"),
    RESHARDS,
    ids=[
        f"{a}-{'.'.join(f'{k}{v}' for k, v in s.items())}-to-"
        f"{'.'.join(f'{k}{v}' for k, v in r.items())}"
        for a, s, r in RESHARDS
    ],
)
def test_a_checkpoint_resumes_under_another_layout(
    arch: str,
    saved: dict[str, int],
    resumed: dict[str, int],
    make_setup: Callable[..., Any],
    make_layout: Callable[..., Any],
    make_rollout: Callable[..., list[TrainSample]],
    kept_and_resumed: Callable[..., tuple[dict[str, Any], dict[str, Any]]],
) -> None:
    """Weights and Adam state saved under one grid load under another: the next step's loss,
    grad norm and weights equal those of the run that stayed (1e-4 relative)."""
    setup, other = make_setup(arch, **saved), make_layout(**resumed)
    kept, moved = kept_and_resumed(setup, make_rollout(8, seed=9), resumed_layout=other)
    assert moved["saved_step"] == kept["saved_step"] == 1 and moved["step"] == 2
    for name, weight in kept["saved_weights"].items():
        assert torch.allclose(moved["saved_weights"][name], weight, rtol=1e-6, atol=0), name
    for key in ("train/loss", "train/grad_norm"):
        assert moved["metrics"][key] == pytest.approx(kept["metrics"][key], rel=1e-4), key
    # Adam's moments came along: a restarted Adam would move the weights otherwise
    for name, weight in kept["weights"].items():
        assert torch.allclose(moved["weights"][name], weight, rtol=1e-4, atol=1e-6), name
