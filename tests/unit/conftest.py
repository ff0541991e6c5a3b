"""Model configs for unit tests of the planner and the preflight."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from rlpost.schema import ModelConfig

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")


def load_model(name: str) -> ModelConfig:
    """A shipped model YAML without Hydra (checkpoint paths are placeholders)."""
    with open(f"{CONF_DIR}/model/{name}.yaml") as f:
        data = yaml.safe_load(f)
    data.update(hf_checkpoint="/ckpt", ref_load="/ckpt")
    return ModelConfig.model_validate(data)


@pytest.fixture
def model_config() -> Callable[[str], ModelConfig]:
    return load_model
