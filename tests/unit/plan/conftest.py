"""Run configs for planner tests: shipped groups composed once, then dotted overrides."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rlpost.schema import RunConfig

CONF_DIR = str(Path(__file__).resolve().parents[3] / "conf")


@functools.cache
def _composed(model: str, recipe: str, hardware: str, with_layout: bool) -> dict[str, Any]:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rlpost.config.resolvers import register_resolvers

    register_resolvers()
    overrides = [f"model={model}", f"recipe={recipe}", f"hardware={hardware}"]
    overrides += [] if with_layout else ["~layout"]
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose("config", overrides=overrides)
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    return data


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        data = data.setdefault(key, {})
    data[leaf] = value


def make_run(
    model: str,
    hardware: str,
    recipe: str = "grpo_dapo",
    *,
    layout: bool = True,
    **overrides: Any,
) -> RunConfig:
    """A validated RunConfig; `layout=False` composes without the shipped layout for the
    pair (everything derived); overrides use `__` for dots (layout__train__tp=2)."""
    data = copy.deepcopy(_composed(model, recipe, hardware, layout))
    for key, value in overrides.items():
        _set(data, key.replace("__", "."), value)
    return RunConfig.model_validate(data)


@pytest.fixture
def run_config() -> Callable[..., RunConfig]:
    return make_run
