"""Composing shipped configs quickly: one Hydra compose per group combination, then overrides."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from rlpost.config.loader import compose_run_config
from rlpost.schema import RunConfig

GROUPS = ("model", "recipe", "hardware", "layout")

ComposeRun = Callable[..., RunConfig]


@functools.cache
def composed_combination(model: str, recipe: str, hardware: str) -> Any:
    """compose_run_config's (RunConfig, SourceMap) for one shipped combination, or the
    UserError it raised; composed once per test session (several test files go through every
    combination, and Hydra takes ~70 ms per compose)."""
    from rlpost.errors import UserError

    try:
        return compose_run_config([f"model={model}", f"recipe={recipe}", f"hardware={hardware}"])
    except UserError as exc:
        return exc


@functools.cache
def _composed(groups: tuple[str, ...]) -> dict[str, Any]:
    """The validated tree for these group choices, through the launcher's own loader."""
    return compose_run_config(list(groups))[0].model_dump()


def compose_run(*overrides: str) -> RunConfig:
    """Group choices (`model=...`) through Hydra, then `a.b=value` overrides (a leading `+` or
    `++` is accepted) set on the composed tree, which is validated again."""
    groups = tuple(o for o in overrides if o.split("=")[0] in GROUPS)
    data = copy.deepcopy(_composed(groups))
    for override in overrides:
        if override in groups:
            continue
        dotted, value = override.lstrip("+").split("=", 1)
        *parents, leaf = dotted.split(".")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = yaml.safe_load(value)
    return RunConfig.model_validate(data)


@pytest.fixture(name="compose_run", scope="session")
def compose_run_fixture() -> ComposeRun:
    """`compose_run("model=qwen3-4b", "recipe=grpo_dapo", "layout.train.tp=2") -> RunConfig`."""
    return compose_run


@pytest.fixture(name="combination", scope="session")
def combination_fixture() -> Callable[[str, str, str], Any]:
    """`combination(model, recipe, hardware)`: composed_combination, shared by the files."""
    return composed_combination


def _validates(name: str, written: list[str]) -> None:
    """Fail the test unless the overrides `written` (what a peer's setting `name` is answered
    with) compose and validate on the CPU default."""
    from rlpost.errors import UserError

    try:
        compose_run_config(written)
    except UserError as exc:
        pytest.fail(f"{name} suggests {written}, which is refused:\n{exc.render()}")


@pytest.fixture(name="validates", scope="session")
def validates_fixture() -> Callable[[str, list[str]], None]:
    """`validates(name, overrides)`: a peer table's suggestion composes and validates."""
    return _validates
