"""metrics.jsonl never repeats a rollout id, and TensorBoard drops what a resume redoes."""

from __future__ import annotations

import json
from pathlib import Path

import wandb
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlpost.runtime.metrics import MetricsLogger, read_metrics, truncate_metrics
from rlpost.schema import TrackingConfig, WandbConfig


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
