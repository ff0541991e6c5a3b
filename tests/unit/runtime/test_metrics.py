"""metrics.jsonl never repeats a rollout id, and TensorBoard drops what a resume redoes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import wandb
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlpost.rewards import compute_rewards
from rlpost.runtime.metrics import (
    MetricsLogger,
    read_metrics,
    reward_extra_means,
    truncate_metrics,
)
from rlpost.runtime.pipeline import Batch, Tally
from rlpost.runtime.train_data import rollout_metrics
from rlpost.schema import RewardConfig, TrackingConfig, WandbConfig
from rlpost.types import Sample

HOOKS = Path(__file__).resolve().parents[2] / "hooks_fixtures"


def test_truncate_drops_resumed_rollouts_and_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"rollout_id": i, "x": i}) for i in range(5)]
    path.write_text("\n".join(lines) + '\n{"rollout_id": 5, "x"')  # killed mid-write
    assert [r["rollout_id"] for r in read_metrics(tmp_path)] == [0, 1, 2, 3, 4]
    truncate_metrics(path, 3)
    assert [r["rollout_id"] for r in read_metrics(tmp_path)] == [0, 1, 2]


def _log(run_dir: Path, rollouts: range, start: int, value: float) -> None:
    logger = MetricsLogger(run_dir, TrackingConfig(tensorboard=True), "run", start_rollout=start)
    for rollout_id in rollouts:
        logger.log(rollout_id, {"rollout/reward_mean": value})
    logger.close()


def test_a_resumed_logger_continues_without_duplicates(tmp_path: Path) -> None:
    _log(tmp_path, range(0, 5), start=0, value=1.0)  # killed after rollout 4 was logged
    _log(tmp_path, range(3, 6), start=3, value=2.0)  # resumed from the checkpoint after 3
    records = read_metrics(tmp_path)
    assert [r["rollout_id"] for r in records] == [0, 1, 2, 3, 4, 5]
    assert [r["rollout/reward_mean"] for r in records] == [1.0, 1.0, 1.0, 2.0, 2.0, 2.0]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scalars = events.Scalars("rollout/reward_mean")
    assert [(s.step, s.value) for s in scalars] == [
        (0, 1.0), (1, 1.0), (2, 1.0), (3, 2.0), (4, 2.0), (5, 2.0)
    ]  # fmt: skip


def test_wandb_offline_run_keeps_its_id_across_a_resume(tmp_path: Path) -> None:
    tracking = TrackingConfig(tensorboard=False, wandb=WandbConfig(enabled=True, mode="offline"))
    first = MetricsLogger(tmp_path, tracking, "run")
    run_id = first.wandb_run_id
    first.log(0, {"x": 1.0})
    first.close()
    second = MetricsLogger(tmp_path, tracking, "run", start_rollout=1, wandb_run_id=run_id)
    assert run_id is not None and second.wandb_run_id == run_id
    second.log(1, {"x": 2.0})
    second.close()
    # one folder per launch (named by start time, with a -1 suffix when two start within the
    # same second), each holding the same run's record
    runs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 2
    assert all((folder / f"run-{run_id}.wandb").is_file() for folder in runs)
    wandb.teardown()  # stop this process's wandb service (and unset WANDB_SERVICE)


def _scored(text: str, group: int, **metadata: Any) -> Sample:
    return Sample(group, 0, "What is 30+4?", [1, 2, 3], "34", dict(metadata), response_text=text)


def test_numbers_a_verl_shaped_function_returns_beside_the_score_are_rollout_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each number of the dict (a bool as 1 or 0, a NumPy one as Python's) is averaged over
    the rollout's samples whose dict had it as a finite number: keys may differ between
    samples, one that is not finite is left out, one named as a rollout metric is
    (`reward_mean`) replaces nothing; strings are no metric. The record is strict JSON."""
    monkeypatch.syspath_prepend(str(HOOKS))
    groups = [
        [_scored("34", 0, difficulty=2), _scored("35", 0)],
        [_scored("34", 1, difficulty=4), _scored("7", 1)],
    ]
    samples = [s for g in groups for s in g]
    config = RewardConfig(custom_function="rlpost_test_hooks.verl_with_extras")
    for sample, reward in zip(samples, asyncio.run(compute_rewards(samples, config)), strict=True):
        sample.reward = reward
    metrics = rollout_metrics(Batch(groups, [0, 0, 0, 0], Tally(), 0.0))
    extras = {k: v for k, v in metrics.items() if k.startswith("rollout/reward_extra/")}
    assert extras == {
        "rollout/reward_extra/acc": 0.5,
        "rollout/reward_extra/difficulty": 3.0,  # the two samples whose row has one
        "rollout/reward_extra/format_ok": 1.0,
        "rollout/reward_extra/length": 1.75,
        "rollout/reward_extra/margin": 0.5,  # the wrong answers' NaN left out
        "rollout/reward_extra/reward_mean": 5.0,
    }
    assert metrics["rollout/reward_mean"] == 0.0  # the scores', 1 and -1 twice
    assert list(extras) == sorted(extras)  # the same order whichever sample came first

    logger = MetricsLogger(tmp_path, TrackingConfig(), "run")
    logger.log(0, metrics)
    logger.close()

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in metrics.jsonl")

    [line] = logger.path.read_text().splitlines()
    record = json.loads(line, parse_constant=refuse)
    assert {k: record[k] for k in extras} == extras


def test_reward_extra_means_of_numbers_whose_sum_overflows_and_of_none() -> None:
    big = [_scored("", 0), _scored("", 1), _scored("", 2)]
    for sample, extra in zip(big, [{"x": 1e308}, {"x": 1e308}, {"x": "text"}], strict=True):
        sample.reward_extra = extra
    assert reward_extra_means(big, "rollout") == {"rollout/reward_extra/x": 1e308}
    assert reward_extra_means([_scored("", 0)], "eval/aime") == {}
