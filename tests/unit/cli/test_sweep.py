"""The sweep summary: one row per job, from each job's metrics, written and printed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rlpost.cli.sweep import JobSummary, summarize_job, write_summary

REPO = Path(__file__).resolve().parents[3]


def write_metrics(run_dir: Path, records: list[dict[str, float]]) -> None:
    run_dir.mkdir(parents=True)
    lines = [json.dumps({"rollout_id": i, **r}) for i, r in enumerate(records)]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_job_summary_takes_final_reward_best_eval_and_median_step(tmp_path: Path) -> None:
    write_metrics(
        tmp_path / "0",
        [
            {"rollout/reward_mean": 0.1, "perf/step_time_s": 9.0, "eval/a/accuracy": 0.2},
            {"rollout/reward_mean": 0.3, "perf/step_time_s": 1.0},
            {"rollout/reward_mean": 0.2, "perf/step_time_s": 2.0, "eval/a/accuracy": 0.6},
        ],
    )
    job = summarize_job(0, "recipe.optim.lr=1e-4", tmp_path / "0", "completed")
    assert (job.rollouts, job.final_reward, job.best_eval_accuracy, job.step_time_s) == (
        3, 0.2, 0.6, 2.0
    )  # fmt: skip
    empty = summarize_job(1, "", tmp_path / "missing", "failed")
    assert (empty.rollouts, empty.final_reward, empty.best_eval_accuracy) == (0, None, None)
    text = write_summary(tmp_path, [job, empty])
    assert "recipe.optim.lr=1e-4" in text and "0.60" in text
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert [JobSummary(**j) for j in saved] == [job, empty]


def test_multirun_writes_and_prints_the_summary(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "launch.py"),
            "-m",
            "mode=plan",
            "recipe.optim.lr=1e-4,2e-4",
            "run.seed=3",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "sweep summary" in done.stdout
    table = (sweep_dir / "summary.txt").read_text()
    rows = [line.split() for line in table.splitlines()[3:]]
    # only what differs between jobs is shown; plan jobs trained nothing and say so
    assert [row[:5] for row in rows] == [
        ["0", "recipe.optim.lr=0.0001", "plan", "printed", "-"],
        ["1", "recipe.optim.lr=0.0002", "plan", "printed", "-"],
    ]
    saved = json.loads((sweep_dir / "summary.json").read_text())
    assert [(j["status"], j["rollouts"]) for j in saved] == [("plan printed", None)] * 2
