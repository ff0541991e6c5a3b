"""The sweep summary: after `launch.py -m a=1,2 b=x,y`, one row per job.

A Hydra callback (registered in conf/config.yaml) notes each job's overrides, directory and
how it ended, and rewrites summary.txt and summary.json in the sweep directory as each job
ends (the jobs still to come show as "not run"), so a sweep that is killed leaves the jobs so
far; when the sweep ends it prints the table.

A job whose run could not finish, or that raised an exception nothing expected (a bug),
returns a JobOutcome (its Hydra task's return value, so Hydra neither stops the sweep nor
raises it again after the batch): it shows as failed, with the reason and its logs, and the
next job starts. A job that was stopped (SIGTERM, Ctrl-C) ends the sweep there, and so does
a Ctrl-C between jobs (the launcher calls SweepSummary.interrupt); a sweep that ended early
says where the jobs that finished are and how to run the others. The sweep's exit status:
the stopped job's (143 for SIGTERM, 130 for Ctrl-C), or else 3 when a job's run failed, 2
when a job was refused, 0 when every job finished. Imports nothing heavy: it runs in the
launcher process.
"""

from __future__ import annotations

import json
import re
import shlex
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from rlpost.cli.sweep_check import sweep_jobs
from rlpost.config.typed_overrides import own_overrides, typed_forms
from rlpost.errors import EXIT_USER_ERROR, UserError
from rlpost.plan.table import render_table
from rlpost.runtime.failures import (
    EXIT_INTERRUPTED,
    FAILURES_LOG,
    RunFailed,
    RunInterrupted,
    RunStopped,
    resume_value,
)
from rlpost.runtime.metrics import read_metrics
from rlpost.runtime.stop import EXIT_STOPPED, HeldSignals

SUMMARY_TEXT = "summary.txt"
SUMMARY_JSON = "summary.json"
REWARD_KEY = "rollout/reward_mean"
STEP_TIME_KEY = "perf/step_time_s"
PRINTING_MODES = frozenset({"plan", "slime_args"})
NOT_RUN = "not run"
ENDS_SWEEP = frozenset({"stopped", "interrupted"})
CTRL_C = "Ctrl-C before its run started"
SIGTERM_EARLY = "SIGTERM before its run started"


@dataclass(frozen=True)
class JobOutcome:
    """A sweep job that did not finish: failed (its run), stopped (SIGTERM), interrupted
    (Ctrl-C) or refused (its config, at its start); the exit status a single launch would
    have had, the reason in one line and where its logs are."""

    status: str
    exit_status: int
    reason: str
    logs: str | None = None
    checkpoint: str | None = None  # the newest a stopped or interrupted run saved

    @classmethod
    def of_failure(cls, failure: RunFailed) -> JobOutcome:
        status = (
            "stopped"
            if isinstance(failure, RunStopped)
            else "interrupted"
            if isinstance(failure, RunInterrupted)
            else "failed"
        )
        logs = failure.run_dir / "logs"
        if (logs / FAILURES_LOG).is_file():
            logs = logs / FAILURES_LOG
        reason = failure.what.splitlines()[0] if failure.what else failure.headline
        checkpoint = str(failure.checkpoint) if failure.checkpoint is not None else None
        return cls(status, failure.exit_status, reason, str(logs), checkpoint)

    @classmethod
    def of_refusal(cls, error: UserError) -> JobOutcome:
        first = error.issues[0] if error.issues else None
        reason = f"{error.title}: {first.key}: {first.message}" if first else error.title
        return cls("refused", EXIT_USER_ERROR, reason.splitlines()[0])


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
    exit_status: int | None = 0  # None: not run
    reason: str | None = None  # a job that did not finish: why, in one line
    logs: str | None = None  # and where to look


def eval_accuracy(record: dict[str, Any]) -> float | None:
    """Mean accuracy over the eval sets logged in this record, if any."""
    values = [
        float(v)
        for k, v in record.items()
        if k.startswith("eval/") and k.endswith("/accuracy") and isinstance(v, int | float)
    ]
    return statistics.fmean(values) if values else None


def summarize_job(
    job: int,
    overrides: str,
    run_dir: Path,
    status: str,
    mode: str = "train",
    outcome: JobOutcome | None = None,
) -> JobSummary:
    """A job of mode=plan or slime_args trained nothing: its status says what it did, and
    it has no rollouts to count. `outcome`: how a job that did not finish ended."""
    ended: dict[str, Any] = {"exit_status": 1 if status == "failed" else 0}
    if outcome is not None:
        status = outcome.status
        ended = {"exit_status": outcome.exit_status, "reason": outcome.reason, "logs": outcome.logs}
    if mode in PRINTING_MODES:
        printed = "plan printed" if mode == "plan" else "slime args printed"
        status = printed if status == "completed" else status
        return JobSummary(job, overrides, str(run_dir), status, None, None, None, None, **ended)
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
        # an evaluation before the first rollout has a record of its own: no rollout
        rollouts=sum(any(k.startswith("rollout/") for k in r) for r in records),
        final_reward=rewards[-1] if rewards else None,
        best_eval_accuracy=max(accuracies) if accuracies else None,
        step_time_s=statistics.median(times) if times else None,
        **ended,
    )


def not_run(job: int, overrides: str) -> JobSummary:
    return JobSummary(job, overrides, "", NOT_RUN, None, None, None, None, exit_status=None)


def sweep_exit_status(jobs: Sequence[JobSummary]) -> int:
    """The sweep's exit status: a stopped job's (it ended the sweep), else the highest of the
    others' (3, a failed run, over 2, a refused job); 0 when every job that ran finished."""
    for job in jobs:
        if job.status in ENDS_SWEEP and job.exit_status:
            return job.exit_status
    return max((job.exit_status or 0 for job in jobs), default=0)


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
    table = render_table(headers, rows, title="sweep summary")
    notes = [
        f"job {j.job} {j.status}: {j.reason}" + (f"\n  logs: {j.logs}" if j.logs else "")
        for j in jobs
        if j.reason
    ]
    return "\n".join([table, *notes])


def render_rest(jobs: Sequence[JobSummary], commands: Mapping[int, Sequence[str]]) -> str:
    """For a sweep that ended before its last job (SIGTERM, Ctrl-C): where the jobs that
    finished are, and the launches that run the others (`commands`: each job's overrides);
    '' when every job ran."""
    left = [j for j in jobs if j.status in ENDS_SWEEP or j.status == NOT_RUN]
    if not left:
        return ""
    done = [j for j in jobs if j.exit_status == 0]
    lines = ["", "the sweep ended before its last job"]
    if done:
        lines.append("finished, in their run directories:")
        lines += [f"  job {j.job}: {j.run_dir}" for j in done]
    lines.append("to run the rest, one launch each:")
    for j in left:
        launch = shlex.join(["python", "launch.py", *commands.get(j.job, [])])
        lines.append(f"  job {j.job} ({j.status}): {launch}")
    return "\n".join(lines)


def write_summary(sweep_dir: Path, jobs: Sequence[JobSummary]) -> str:
    text = render_summary(jobs)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    (sweep_dir / SUMMARY_TEXT).write_text(text + "\n", encoding="utf-8")
    payload = [asdict(j) for j in jobs]
    (sweep_dir / SUMMARY_JSON).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return text


@dataclass(frozen=True)
class EndedJob:
    overrides: list[str]
    run_dir: Path
    status: str  # Hydra's: completed, or failed when the job raised
    mode: str
    outcome: JobOutcome | None


class SweepSummary(Callback):
    """Collects the jobs of a multirun, rewrites the summary as each ends, prints it when the
    sweep ends and exits with the sweep's status (0: nothing to say)."""

    running: ClassVar[SweepSummary | None] = None  # this process's sweep, for a Ctrl-C

    def __init__(self) -> None:
        self.planned: dict[int, list[str]] = {}
        self.typed: dict[str, str] = {}  # a job's override as Hydra wrote it -> as typed
        self.ended: dict[int, EndedJob] = {}
        self.sweep_dir: Path | None = None
        # hydra.sweep.subdir as written (conf/config.yaml: ${hydra.job.num}): each job's folder
        self.subdir: str | None = None
        self.starting: int | None = None  # the job that started last
        self.finished = False
        # Ctrl-C and SIGTERM land in a job (rlpost.cli.launch.run_job), not in Hydra's steps
        # between jobs
        self.signals = HeldSignals()

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.sweep_dir = Path(str(config.hydra.sweep.dir))
        written = OmegaConf.to_container(config.hydra.sweep, resolve=False)
        subdir = written.get("subdir") if isinstance(written, dict) else None
        self.subdir = str(subdir) if subdir is not None else None
        task = OmegaConf.to_container(config.hydra.overrides.task, resolve=False)
        overrides = [str(o) for o in task] if isinstance(task, list) else []
        self.planned = {job.num: job.overrides for job in sweep_jobs(overrides)}
        self.typed = typed_forms(overrides)
        SweepSummary.running = self
        self.signals.hold()

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.mode == RunMode.MULTIRUN:
            self.starting = int(config.hydra.job.num)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        hydra_cfg = job_return.hydra_cfg.hydra if job_return.hydra_cfg is not None else None
        task = job_return.cfg
        if hydra_cfg is None or hydra_cfg.mode != RunMode.MULTIRUN or task is None:
            return
        run_dir = OmegaConf.select(task, "run.dir", default=None) or hydra_cfg.runtime.output_dir
        overrides = list(job_return.overrides or [])
        status = job_return.status.name.lower() if job_return.status is not None else "?"
        outcome = None
        if job_return.status == JobStatus.COMPLETED:
            value = job_return.return_value
            outcome = value if isinstance(value, JobOutcome) else None
        mode = str(OmegaConf.select(task, "mode", default="train"))
        num = int(hydra_cfg.job.num)
        self.ended[num] = EndedJob(overrides, Path(run_dir), status, mode, outcome)
        if self.sweep_dir is None:
            self.sweep_dir = Path(str(hydra_cfg.sweep.dir))
        jobs = self.summaries()
        write_summary(self.sweep_dir, jobs)
        if outcome is not None and outcome.status in ENDS_SWEEP:
            self._finish(jobs)  # the jobs after this one do not start

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self.signals.release()  # one held since the last job: the sweep ends as interrupted
        if not self.ended:
            return
        self._finish(self.summaries())

    def interrupt(self, sigterm: bool = False) -> None:
        """Ctrl-C (or, `sigterm`, a SIGTERM: a scheduler's time limit) outside a job's run,
        between two jobs or while one plans, checks or starts its run: the job that was
        starting shows as interrupted (stopped) and the jobs after it as not run, the summary
        is written and printed, with how to run the rest. The caller exits."""
        if self.finished or self.sweep_dir is None:
            return
        said, status, exit_status, reason = (
            ("stopped by SIGTERM", "stopped", EXIT_STOPPED, SIGTERM_EARLY)
            if sigterm
            else ("interrupted (Ctrl-C)", "interrupted", EXIT_INTERRUPTED, CTRL_C)
        )
        print(f"rlpost: sweep {said}", file=sys.stderr, flush=True)
        cut = self.starting if self.starting not in self.ended else None
        jobs = [
            replace(j, status=status, exit_status=exit_status, reason=reason) if j.job == cut else j
            for j in self.summaries()
        ]
        self._report(jobs)

    def summaries(self) -> list[JobSummary]:
        """Every job of the sweep: those that ended as they ended, the others not run."""
        overrides = {**self.planned, **{n: job.overrides for n, job in self.ended.items()}}
        nums = sorted(overrides)
        own = own_overrides([overrides[num] for num in nums], self.typed)
        jobs = []
        for num, own_of_job in zip(nums, own, strict=True):
            differ = " ".join(own_of_job)
            job = self.ended.get(num)
            if job is None:
                jobs.append(not_run(num, differ))
            else:
                jobs.append(
                    summarize_job(num, differ, job.run_dir, job.status, job.mode, job.outcome)
                )
        return jobs

    def _finish(self, jobs: list[JobSummary]) -> None:
        self._report(jobs)
        status = sweep_exit_status(jobs)
        if status:
            raise SystemExit(status)

    def _report(self, jobs: list[JobSummary]) -> None:
        assert self.sweep_dir is not None  # set by on_multirun_start or the first job's end
        self.finished = True
        text = write_summary(self.sweep_dir, jobs)
        rest = render_rest(jobs, {j.job: self._command(j) for j in jobs})
        print(f"\n{text}\nsweep summary: {self.sweep_dir / SUMMARY_TEXT}{rest}", flush=True)

    def _command(self, job: JobSummary) -> list[str]:
        """The overrides that run `job` as a single launch; a stopped or interrupted run that
        saved a checkpoint continues from it."""
        overrides = [
            # without the '++' the launcher gives schema keys (it adds it again)
            self.typed.get(o, o).removeprefix("++").replace("${hydra:job.num}", str(job.job))
            for o in self.planned.get(job.job, [])
        ]
        ended = self.ended.get(job.job)
        if ended is not None and ended.outcome is not None and ended.outcome.checkpoint:
            overrides = [o for o in overrides if not o.startswith(("run.dir=", "run.resume="))]
            resume = resume_value(Path(ended.outcome.checkpoint), Path(job.run_dir))
            overrides += [f"run.dir={job.run_dir}", f"run.resume={resume}"]
        folder = self._job_folder(job.job)
        if folder is not None:  # in the sweep's folder, where the sweep would have run it
            overrides.append(f"hydra.run.dir={hydra_quoted(str(folder))}")
        return overrides

    def _job_folder(self, num: int) -> Path | None:
        """Job `num`'s folder in the sweep (Hydra's output directory for it); None when
        hydra.sweep.subdir depends on more than the job's number."""
        if self.sweep_dir is None or self.subdir is None:
            return None
        subdir = self.subdir
        for ref in ("${hydra.job.num}", "${hydra:job.num}"):
            subdir = subdir.replace(ref, str(num))
        return None if "${" in subdir else self.sweep_dir / subdir


def hydra_quoted(value: str) -> str:
    """`value` as a Hydra override's value: quoted where Hydra's grammar would read it as
    more than a string (spaces, commas, brackets, quotes, ...). In a quoted value a
    backslash is literal except before a quote (or the closing one), where it is doubled."""
    if value and all(c.isalnum() or c in "/._-" for c in value):
        return value
    escaped = re.sub(r"(\\\\*)(?='|$)", r"\1\1", value).replace("'", "\\'")
    return f"'{escaped}'"
