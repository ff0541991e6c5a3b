"""The sweep summary: after `launch.py -m a=1,2 b=x,y`, one row per job.

A Hydra callback (registered in conf/config.yaml) notes each job's overrides and directory
as it ends; when the sweep ends it reads every job's metrics.jsonl and writes
summary.txt and summary.json into the sweep directory, and prints the table. Imports
nothing heavy: it runs in the launcher process.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from rlpost.plan.table import render_table
from rlpost.runtime.metrics import read_metrics

SUMMARY_TEXT = "summary.txt"
SUMMARY_JSON = "summary.json"
REWARD_KEY = "rollout/reward_mean"
STEP_TIME_KEY = "perf/step_time_s"
PRINTING_MODES = frozenset({"plan", "slime_args"})


@dataclass(frozen=True)
class JobSummary:
    job: int
    overrides: str
    run_dir: str
    status: str
    rollouts: int | None  # None: the job only printed (mode=plan or slime_args)
    final_reward: float | None
    best_eval_accuracy: float | None
    step_time_s: float | None


def eval_accuracy(record: dict[str, Any]) -> float | None:
    """Mean accuracy over the eval sets logged in this record, if any."""
    values = [
        float(v)
        for k, v in record.items()
        if k.startswith("eval/") and k.endswith("/accuracy") and isinstance(v, int | float)
    ]
    return statistics.fmean(values) if values else None


def summarize_job(
    job: int, overrides: str, run_dir: Path, status: str, mode: str = "train"
) -> JobSummary:
    """A job of mode=plan or slime_args trained nothing: its status says what it did, and
    it has no rollouts to count."""
    if mode in PRINTING_MODES:
        printed = "plan printed" if mode == "plan" else "slime args printed"
        status = printed if status == "completed" else status
        return JobSummary(job, overrides, str(run_dir), status, None, None, None, None)
    records = read_metrics(run_dir)
    rewards = [r[REWARD_KEY] for r in records if isinstance(r.get(REWARD_KEY), int | float)]
    accuracies = [a for a in map(eval_accuracy, records) if a is not None]
    # the median ignores the first rollout's warm-up and any save or eval outlier
    times = [r[STEP_TIME_KEY] for r in records if isinstance(r.get(STEP_TIME_KEY), int | float)]
    return JobSummary(
        job=job,
        overrides=overrides,
        run_dir=str(run_dir),
        status=status,
        rollouts=len(records),
        final_reward=rewards[-1] if rewards else None,
        best_eval_accuracy=max(accuracies) if accuracies else None,
        step_time_s=statistics.median(times) if times else None,
    )


def render_summary(jobs: Sequence[JobSummary]) -> str:
    rows = [
        [
            str(j.job),
            j.overrides or "(none)",
            j.status,
            j.rollouts,
            j.final_reward,
            j.best_eval_accuracy,
            j.step_time_s,
        ]
        for j in jobs
    ]
    headers = ["job", "overrides", "status", "rollouts", "final reward", "best eval acc", "step s"]
    return render_table(headers, rows, title="sweep summary")


def write_summary(sweep_dir: Path, jobs: Sequence[JobSummary]) -> str:
    text = render_summary(jobs)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    (sweep_dir / SUMMARY_TEXT).write_text(text + "\n", encoding="utf-8")
    payload = [asdict(j) for j in jobs]
    (sweep_dir / SUMMARY_JSON).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return text


class SweepSummary(Callback):
    """Collects the jobs of a multirun and summarizes them when it ends."""

    def __init__(self) -> None:
        self.jobs: list[tuple[int, list[str], Path, str, str]] = []

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        hydra_cfg = job_return.hydra_cfg.hydra if job_return.hydra_cfg is not None else None
        if hydra_cfg is None or hydra_cfg.mode != RunMode.MULTIRUN:
            return
        task = job_return.cfg
        run_dir = OmegaConf.select(task, "run.dir", default=None) or hydra_cfg.runtime.output_dir
        overrides = [o.lstrip("+") for o in job_return.overrides or []]
        status = job_return.status.name.lower() if job_return.status is not None else "?"
        mode = str(OmegaConf.select(task, "mode", default="train"))
        self.jobs.append((int(hydra_cfg.job.num), overrides, Path(run_dir), status, mode))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not self.jobs:
            return
        sweep_dir = Path(str(config.hydra.sweep.dir))
        # the overrides every job shares say nothing about the difference between jobs
        shared = set.intersection(*(set(job[1]) for job in self.jobs))
        jobs = [
            summarize_job(
                num, " ".join(o for o in overrides if o not in shared), path, status, mode
            )
            for num, overrides, path, status, mode in sorted(self.jobs, key=lambda j: j[0])
        ]
        text = write_summary(sweep_dir, jobs)
        print(f"\n{text}\nsweep summary: {sweep_dir / SUMMARY_TEXT}", flush=True)
