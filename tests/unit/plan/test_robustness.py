"""Any layout a user can write either plans or fails with a UserError, never a crash."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from rlpost.errors import UserError
from rlpost.plan import build_plan, render_plan, render_slime_args
from rlpost.schema import RunConfig

Runs = Callable[..., RunConfig]


CHOICES: dict[str, list[object]] = {
    "layout__colocate": [True, False],
    "layout__train__num_gpus": [1, 2, 3, 4, 6, 8, 12, 16],
    "layout__train__tp": [1, 2, 3, 4, 8],
    "layout__train__pp": [1, 2, 3, 4],
    "layout__train__cp": [1, 2],
    "layout__train__ep": [1, 2, 4, 8, 16],
    "layout__train__etp": [1, 2],
    "layout__train__dp": [1, 2, 4],
    "layout__rollout__gpus_per_engine": [1, 2, 3, 4, 8, 16],
    "layout__rollout__sglang": [
        {"enable_dp_attention": True, "dp_size": 2},
        {"enable_dp_attention": True, "dp_size": 3},
        {"ep_size": 2},
    ],
}


def random_layout(rng: random.Random) -> dict[str, object]:
    """Each field set with probability 0.3, else left for the planner to derive."""
    layout = {key: rng.choice(values) for key, values in CHOICES.items() if rng.random() < 0.3}
    if layout.get("layout__colocate") is False and rng.random() < 0.5:
        layout["layout__rollout__num_gpus"] = rng.choice([0, 2, 4, 8])
    if layout.get("layout__train__tp") == 1:
        layout["layout__train__sequence_parallel"] = False
    return layout


@pytest.mark.parametrize(
    ("model", "hardware"),
    [("qwen3-4b", "h100x16"), ("glm4.7-flash", "h100x16"), ("glm4-9b", "h100x8")],
)
def test_random_layouts_plan_or_explain(run_config: Runs, model: str, hardware: str) -> None:
    rng = random.Random(f"{model}/{hardware}")
    planned = rejected = 0
    for _ in range(60):
        run = run_config(model, hardware, layout=False, **random_layout(rng))
        try:
            plan = build_plan(run)
        except UserError as error:
            assert error.issues and all(issue.key and issue.fix for issue in error.issues)
            rejected += 1
            continue
        render_plan(plan, "table")
        render_plan(plan, "json")
        try:
            render_slime_args(run, plan)
        except UserError as error:
            assert error.issues[0].key == "layout.train.num_gpus"
        par = plan.parallel
        assert par.tp * par.pp * par.cp * par.dp == plan.placement.train_gpus
        planned += 1
    assert planned and rejected
