"""Every shipped model x recipe x hardware composes, validates and plans, or fails as documented.

Combinations that cannot run are listed in EXPECTED_FAILURES with the key the error names,
part of its message, and why. A combination not listed must plan cleanly; a listed one must
fail with that key. Rules are matched in order (fnmatch patterns), first match wins.
"""

from __future__ import annotations

import fnmatch
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rlpost.cli.planning import plan_run
from rlpost.errors import UserError

CONF = Path(__file__).resolve().parents[2] / "conf"


def options(group: str) -> list[str]:
    return sorted(path.stem for path in (CONF / group).glob("*.yaml"))


@dataclass(frozen=True)
class Expected:
    model: str
    recipe: str
    hardware: str
    key: str
    fragment: str
    why: str

    def matches(self, model: str, recipe: str, hardware: str) -> bool:
        return all(
            fnmatch.fnmatchcase(value, pattern)
            for value, pattern in (
                (model, self.model),
                (recipe, self.recipe),
                (hardware, self.hardware),
            )
        )


EXPECTED_FAILURES = [
    Expected(
        "qwen3-tiny",
        "grpo_dapo*",
        "*",
        "recipe.rollout.max_response_len",
        "beyond model.max_position_embeddings=512",
        "the tiny model's 512-token context cannot hold grpo_dapo's 8192-token responses",
    ),
    Expected(
        "glm4.5-355b-a32b",
        "*",
        "h100x[18]*",
        "layout.train.tp",
        "no tensor-parallel size fits",
        "355B parameters of training state need the 64-GPU profile",
    ),
    Expected(
        "glm4.5-355b-a32b",
        "*",
        "h[12]00x1",
        "layout.train.tp",
        "no tensor-parallel size fits",
        "355B parameters of training state need the 64-GPU profile",
    ),
    Expected(
        "glm4-9b",
        "*",
        "h[12]00x1",
        "layout.train.tp",
        "no tensor-parallel size fits",
        "9B with fp32 Adam state on one GPU needs ~170 GiB; one H200 has 140, one H100 80",
    ),
    Expected(
        "glm4.7-flash",
        "*",
        "h[12]00x1",
        "layout.train.tp",
        "no tensor-parallel size fits",
        "30B-A3B training state on one GPU needs ~520 GiB",
    ),
    Expected(
        "deepseek-v3",
        "*",
        "h*",
        "layout.train.tp",
        "no tensor-parallel size fits",
        "671B parameters: even 64 H100s at TP8 need ~195 GiB per GPU without a PP/EP layout",
    ),
    Expected(
        "*-8b",
        "*",
        "h[12]00x1",
        "layout.train.tp",
        "no tensor-parallel size fits",
        "8B with fp32 Adam state on one GPU needs ~150 GiB; one H200 has 140, one H100 80",
    ),
    Expected(
        "qwen3-30b-a3b",
        "*",
        "h[12]00x1",
        "layout.train.tp",
        "no tensor-parallel size fits",
        "30B-A3B training state on one GPU needs ~520 GiB",
    ),
    Expected(
        "qwen3-30b-a3b",
        "grpo_dapo*async",
        "h100x8",
        "layout.train.tp",
        "no tensor-parallel size fits",
        "async splits the node 4 + 4; 30B-A3B on 4 GPUs without EP/PP needs ~133 GiB per GPU",
    ),
    Expected(
        "*",
        "grpo_dapo_async",
        "h[12]00x1",
        "layout.rollout.num_gpus",
        "leaves no GPUs for the engines",
        "the async loop needs separate train and rollout GPUs; one GPU cannot be split",
    ),
    Expected(
        "qwen3-4b",
        "grpo_dapo_async",
        "h100x8",
        "recipe.loop.mode",
        "is colocated",
        "the shipped qwen3-4b_h100x8 layout is colocated (seed 001); async needs decoupled",
    ),
    Expected(
        "glm4.7-flash",
        "grpo_dapo_async",
        "h100x[18]*",
        "recipe.loop.mode",
        "is colocated",
        "the shipped glm4.7-flash layouts are colocated; async needs decoupled",
    ),
    Expected(
        "glm4.5-355b-a32b",
        "grpo_dapo_async",
        "h100x64",
        "recipe.loop.mode",
        "is colocated",
        "the shipped glm4.5 layout is colocated (seed 002)",
    ),
    Expected(
        "*",
        "grpo_dapo_fully_async",
        "h[12]00x1",
        "layout.rollout.num_gpus",
        "leaves no GPUs for the engines",
        "the fully_async loop needs separate train and rollout GPUs; one GPU cannot be split",
    ),
    Expected(
        "qwen3-4b",
        "grpo_dapo_fully_async",
        "h100x8",
        "recipe.loop.mode",
        "is colocated",
        "the shipped qwen3-4b_h100x8 layout is colocated (seed 001); fully_async needs decoupled",
    ),
    Expected(
        "glm4.7-flash",
        "grpo_dapo_fully_async",
        "h100x[18]*",
        "recipe.loop.mode",
        "is colocated",
        "the shipped glm4.7-flash layouts are colocated; fully_async needs decoupled",
    ),
    Expected(
        "glm4.5-355b-a32b",
        "grpo_dapo_fully_async",
        "h100x64",
        "recipe.loop.mode",
        "is colocated",
        "the shipped glm4.5 layout is colocated (seed 002)",
    ),
]

COMBINATIONS = list(itertools.product(options("model"), options("recipe"), options("hardware")))


def expected_failure(model: str, recipe: str, hardware: str) -> Expected | None:
    return next((e for e in EXPECTED_FAILURES if e.matches(model, recipe, hardware)), None)


def test_the_table_covers_shipped_groups_only() -> None:
    for rule in EXPECTED_FAILURES:
        assert any(rule.matches(*combo) for combo in COMBINATIONS), rule
    assert len(COMBINATIONS) >= 5 * 4 * 5


@pytest.mark.parametrize(
    ("model", "recipe", "hardware"), COMBINATIONS, ids=[" x ".join(c) for c in COMBINATIONS]
)
def test_combination(
    model: str, recipe: str, hardware: str, combination: Callable[[str, str, str], Any]
) -> None:
    expected = expected_failure(model, recipe, hardware)
    try:
        composed = combination(model, recipe, hardware)
        if isinstance(composed, UserError):
            raise composed
        run, plan = plan_run(*composed)
    except UserError as exc:
        if expected is None:
            pytest.fail(f"{model} x {recipe} x {hardware} should plan:\n{exc.render()}")
        issue = next((i for i in exc.issues if i.key == expected.key), None)
        assert issue is not None, f"expected an issue at {expected.key}:\n{exc.render()}"
        assert expected.fragment in issue.message, issue.render()
        return
    assert expected is None, f"expected to fail at {expected.key} ({expected.why})"
    assert (run.model.name, run.recipe.name, run.hardware.name) == (model, recipe, hardware)
    assert plan.placement.train_gpus <= run.hardware.total_gpus
