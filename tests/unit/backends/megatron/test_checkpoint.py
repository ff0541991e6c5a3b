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
