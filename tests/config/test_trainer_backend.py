"""trainer.backend against the layout and the hardware, checked with the plan."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rlpost.errors import UserError
from rlpost.plan import build_plan
from rlpost.plan.backends import resolve_trainer_backend
from rlpost.schema import RunConfig

ComposeRun = Callable[..., RunConfig]

TINY = ("model=qwen3-tiny", "recipe=grpo_tiny_math", "hardware=cpu")
QWEN = ("model=qwen3-4b", "recipe=grpo_dapo", "hardware=h100x8")


@pytest.mark.parametrize(
    ("overrides", "backend"),
    [
        (TINY, "torch"),  # data parallel on CPU
        ((*TINY, "layout.train.tp=2"), "megatron"),  # the model is split
        (QWEN, "megatron"),  # GPUs
        ((*TINY, "trainer.backend=megatron"), "megatron"),
    ],
    ids=["cpu-dp", "cpu-tp2", "gpu", "explicit"],
)
def test_auto_picks_a_backend_that_can_train_the_layout(
    compose_run: ComposeRun, overrides: tuple[str, ...], backend: str
) -> None:
    cfg = compose_run(*overrides)
    plan = build_plan(cfg)
    assert resolve_trainer_backend(cfg, plan.parallel) == backend


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ((*TINY, "trainer.backend=torch", "layout.train.tp=2"), "data parallel only"),
        ((*QWEN, "trainer.backend=torch"), "trains on CPU"),
    ],
    ids=["torch-tp2", "torch-on-gpus"],
)
def test_a_backend_that_cannot_train_the_layout_is_refused(
    compose_run: ComposeRun, overrides: tuple[str, ...], fragment: str
) -> None:
    with pytest.raises(UserError) as caught:
        build_plan(compose_run(*overrides))
    (issue,) = [i for i in caught.value.issues if fragment in i.message]
    assert issue.key == "trainer.backend" and "trainer.backend=megatron" in issue.fix


def test_recompute_on_the_torch_trainer_is_refused_not_ignored(compose_run: ComposeRun) -> None:
    with pytest.raises(UserError) as caught:
        build_plan(compose_run(*TINY, "layout.train.recompute.granularity=full"))
    (issue,) = caught.value.issues
    assert issue.key == "layout.train.recompute.granularity"
    assert "never recomputes" in issue.message and "trainer.backend=megatron" in issue.fix
    plan = build_plan(
        compose_run(*TINY, "layout.train.recompute.granularity=full", "trainer.backend=megatron")
    )
    assert plan.parallel.recompute == "full"
