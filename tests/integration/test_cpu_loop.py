"""The real loop on the embedded CPU default: Ray, the router, engine servers, the trainer."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = (
    "rollout_id",
    "rollout/reward_mean",
    "rollout/num_samples",
    "train/loss",
    "train/kl",
    "train/entropy",
    "perf/step_time_s",
    "perf/rollout_tokens_per_s",
)

pytestmark = pytest.mark.integration


def launch(
    run_dir: Path, *overrides: str, timeout_s: float = 240
) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable, str(ROOT / "launch.py"), f"run.dir={run_dir}", "run.progress=false",
        *overrides,
    ]  # fmt: skip
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)


def read_metrics(run_dir: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_colocated_default_runs_rollouts_trains_and_evaluates(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = launch(run_dir, "recipe.rollout.num_rollout=3", "recipe.eval.interval=2")
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_metrics(run_dir)
    assert [r["rollout_id"] for r in records] == [0, 1, 2]
    for record in records:
        assert set(REQUIRED) <= set(record), set(REQUIRED) - set(record)
        assert record["rollout/num_samples"] == 64
        assert 0.0 <= record["rollout/reward_mean"] <= 1.0
        assert record["train/optimizer_steps"] == 1
    # eval before training (logged with rollout 0), after rollout 2 (interval) and at the end
    assert all("eval/arith/accuracy" in records[i] for i in (0, 1, 2))
    assert "eval accuracy" in done.stdout and f"run directory: {run_dir}" in done.stdout
    assert (run_dir / "tensorboard").is_dir() and (run_dir / "config.yaml").is_file()
    # the engines serve the last pushed weights: only the newest version is kept on disk
    assert sorted(p.name for p in (run_dir / "weights").iterdir()) == ["v3"]


def test_decoupled_layout_runs_one_step_off(tmp_path: Path) -> None:
    """recipe.loop.mode=async: rollout N+1 is generated while rollout N trains, so a step
    trains samples at most one weight version old."""
    run_dir = tmp_path / "run"
    done = launch(
        run_dir,
        "layout.colocate=false",
        "layout.train.num_gpus=1",
        "layout.rollout.num_gpus=1",
        "recipe.loop.mode=async",
        "recipe.rollout.num_rollout=3",
        "recipe.eval.interval=null",
        "recipe.eval.datasets=[]",
        "tracking.tensorboard=false",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_metrics(run_dir)
    assert [r["rollout_id"] for r in records] == [0, 1, 2]
    for record in records:
        assert record["rollout/num_samples"] == 64 and math.isfinite(record["train/loss"])
        assert record["rollout/staleness_max"] <= 1
    assert records[0]["rollout/staleness_max"] == 0  # nothing was trained before it
    assert any(r["rollout/staleness_max"] == 1 for r in records)  # generated during a step
