"""HF -> torch_dist -> HF is exact; a torch_dist checkpoint loads under another layout; a model
YAML that disagrees with config.json is refused before anything is written."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from rlpost.backends.megatron.conversion import hf_to_torch_dist, torch_dist_to_hf
from rlpost.backends.megatron.model_yaml import check_model_matches_hf
from rlpost.backends.megatron.trainer import MegatronTrainer
from rlpost.errors import UserError
from rlpost.schema import ModelConfig
from rlpost.types import TrainSample

REPO = Path(__file__).resolve().parents[4]


def round_trip(rank: int, world: int, port: int, model: ModelConfig, root: Path) -> None:
    hf_to_torch_dist(model, root / "torch_dist")
    torch_dist_to_hf(model, root / "torch_dist", root / "hf")


@pytest.mark.parametrize("arch", ["qwen3", "glm4", "glm4_moe", "glm4_moe_lite"])
def test_round_trip_is_exact(
    arch: str,
    tiny_models: Callable[[str], ModelConfig],
    world: Callable[..., list[Any]],
    same_hf: Callable[[str | Path, str | Path], None],
    tmp_path: Path,
) -> None:
    model = tiny_models(arch)
    world(round_trip, 1, model, tmp_path)
    same_hf(model.hf_checkpoint, tmp_path / "hf")
    assert (tmp_path / "hf" / "config.json").read_text() == (
        Path(model.hf_checkpoint) / "config.json"
    ).read_text()


def test_mismatched_yaml_is_refused(tiny_models: Callable[[str], ModelConfig]) -> None:
    model = tiny_models("glm4_moe").model_copy(update={"num_query_groups": 4})
    with pytest.raises(UserError, match="num_key_value_heads=2"):
        check_model_matches_hf(model, "conf/model/tiny.yaml")


def logprobs_from(trainer: MegatronTrainer, samples: list[TrainSample]) -> list[torch.Tensor]:
    return trainer.compute_logprobs(samples)


def test_torch_dist_loads_under_another_layout(
    make_setup: Callable[..., Any],
    make_rollout: Callable[..., list[TrainSample]],
    world: Callable[..., list[Any]],
    tmp_path: Path,
) -> None:
    """Saved with no parallelism, loaded with experts split over 2 ranks and TP 2."""
    setup, samples = make_setup("glm4_moe", 4), make_rollout(4, seed=2)
    world(round_trip, 1, setup.model, tmp_path)
    from_hf = setup.run(logprobs_from, samples)
    parallel = make_setup("glm4_moe", 4, tp=2, ep=2, sequence_parallel=True)
    from_dist = parallel.with_model(
        load=str(tmp_path / "torch_dist"), hf_checkpoint=str(tmp_path / "hf")
    )
    loaded = from_dist.run(logprobs_from, samples)
    assert max(float((a - b).abs().max()) for a, b in zip(loaded, from_hf, strict=True)) < 1e-5


def test_tool_refuses_a_mismatched_yaml(
    tiny_models: Callable[[str], ModelConfig], tmp_path: Path
) -> None:
    model = tiny_models("qwen3")
    model_yaml = tmp_path / "model.yaml"
    model_yaml.write_text(yaml.safe_dump(model.model_dump(mode="json")))
    command = [
        sys.executable,
        str(REPO / "tools" / "convert_hf_to_megatron.py"),
        "--model-yaml",
        str(model_yaml),
        "model.vocab_size=128",
        "--save",
        str(tmp_path / "out"),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert "vocab_size=128" in result.stderr and "vocab_size=96" in result.stderr
    assert not (tmp_path / "out").exists()
