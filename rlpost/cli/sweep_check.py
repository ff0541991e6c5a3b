"""Every job of a sweep checked before the first starts.

Hydra runs a sweep's jobs one after another, and each validates its config when it starts:
without this, `launch.py -m recipe.rollout.temperature=0.8,-1` trains job 0 to the end and
only then refuses job 1. Here each job's config is composed as Hydra's sweep composes it (its
job number set, so `${hydra:job.num}` resolves) and run through what a single launch checks
before anything starts: the schema, the hooks, the plan, and for a training job the
preflight. Nothing is written: a job's default run.dir is named, not claimed.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from rlpost.config.loader import PRIMARY_CONFIG, load_run_config
from rlpost.config.overrides import LaunchArgs, main_dir, parse_argv, search_roots
from rlpost.config.resolvers import register_resolvers
from rlpost.config.sources import ConfigRoot, SourceMap, defer_source_map
from rlpost.config.typed_overrides import typed_forms
from rlpost.errors import Issue, UserError
from rlpost.schema.run import LAUNCH_MODES

if TYPE_CHECKING:
    from hydra.core.config_loader import ConfigLoader


@dataclass(frozen=True)
class SweepJob:
    num: int
    overrides: list[str]  # as Hydra's sweeper gives them to the job (`lr=1e-05`)
    typed: list[str]  # the same, as the user typed them (`lr=1e-5`), to name the job by


@dataclass(frozen=True)
class Checked:
    """A job that would start: its composed config (Hydra's node included), where it writes,
    the wandb run it resumes by id, and the places they were set."""

    full: DictConfig
    run_dir: str | None
    wandb_run_id: str | None
    sources: SourceMap


def sweep_jobs(overrides: Sequence[str]) -> list[SweepJob]:
    """The jobs Hydra's basic sweeper makes of these overrides, numbered as it numbers them;
    [] when it refuses the sweep (its own message comes at the launch)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
        batches = BasicSweeper.split_arguments(parsed, None)
    except HydraException:
        return []
    jobs = (job for batch in batches for job in batch)
    typed = typed_forms(overrides)
    return [
        SweepJob(num, list(job), [typed.get(o, o) for o in job]) for num, job in enumerate(jobs)
    ]


def _job_config(
    loader: ConfigLoader, config_name: str, job: SweepJob, first: DictConfig | None
) -> DictConfig:
    """The job's config with its Hydra node set as the sweep sets it (HydraConfig too);
    with `first`'s resolved values cached, as Hydra does, so ${now:...} reads the same."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    cfg = loader.load_configuration(config_name, job.overrides, RunMode.RUN)
    if first is not None:
        OmegaConf.copy_cache(from_config=first, to_config=cfg)
    with open_dict(cfg):
        cfg.hydra.mode = RunMode.MULTIRUN
        cfg.hydra.job.num = job.num
        cfg.hydra.job.id = str(job.num)
    HydraConfig.instance().set_config(cfg)
    output = os.path.join(str(cfg.hydra.sweep.dir), str(cfg.hydra.sweep.subdir))
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.runtime.output_dir = os.path.abspath(output)
    HydraConfig.instance().set_config(cfg)
    return cfg


def check_job(
    loader: ConfigLoader,
    config_name: str,
    job: SweepJob,
    roots: list[ConfigRoot],
    first: DictConfig | None = None,
) -> Checked:
    """UserError when this job would be refused as it starts; else what it would do."""
    from hydra.errors import HydraException

    from rlpost.cli.planning import located, plan_run
    from rlpost.config.search_path import composition_issues

    try:
        full = _job_config(loader, config_name, job, first)
    except HydraException as exc:
        raise UserError(composition_issues(exc, roots)) from None
    hydra_overrides = list(full.hydra.overrides.hydra) + list(full.hydra.overrides.task)
    config_sources = OmegaConf.to_container(full.hydra.runtime.config_sources)
    sources = defer_source_map(config_name, hydra_overrides, config_sources)  # type: ignore[arg-type]
    cfg = copy.deepcopy(full)
    with read_write(cfg), open_dict(cfg):
        del cfg["hydra"]
        resume_auto = OmegaConf.select(cfg, "run.resume", default=None) == "auto"
        if OmegaConf.select(cfg, "run.dir", default=None) is None and not resume_auto:
            # the job's own folder, as run_job names it; claimed only when the job starts
            cfg.run.dir = str(full.hydra.runtime.output_dir)
    run, plan = plan_run(load_run_config(cfg, sources), sources)
    if run.mode not in LAUNCH_MODES:
        return Checked(full, None, None, sources)
    from rlpost.preflight import preflight

    with located(sources):
        preflight(run, plan)
    wandb = run.tracking.wandb
    run_dir = os.path.abspath(os.path.expanduser(run.run.dir)) if run.run.dir else None
    return Checked(full, run_dir, wandb.run_id if wandb.enabled else None, sources)


# What a sweep's jobs must not share: the key, the Checked field holding its value, why, the fix
# ({value}: the shared value; the per-job value quoted, so that a shell leaves ${...} to Hydra).
ONE_PER_JOB = (
    (
        "run.dir",
        "run_dir",
        "each job would run in this one directory: the second would find the first's run "
        "there (its checkpoints, its metrics) and be refused once the first had finished",
        "leave run.dir unset (each job gets a folder of its own under runs/multirun), or give "
        "each job its own: run.dir='{value}/${{hydra:job.num}}'",
    ),
    (
        "tracking.wandb.run_id",
        "wandb_run_id",
        "each job would resume this one wandb run and log from step 0, and wandb drops every "
        "step below the last one logged ('User provided step ... is less than current step "
        "... Dropping entry'), so the later jobs' curves are lost",
        "leave tracking.wandb.run_id unset (wandb gives each job a run of its own; "
        "tracking.wandb.group gathers them), or give each job its own: "
        "tracking.wandb.run_id='{value}-${{hydra:job.num}}'",
    ),
)


def shared_by_jobs(jobs: Sequence[tuple[SweepJob, Checked]], shared: set[str]) -> list[Issue]:
    """Jobs that would write one run directory or log to one wandb run, wherever the value
    was set (a config file, an experiment, the command line)."""
    issues = []
    for key, field, why, fix in ONE_PER_JOB:
        by_value: dict[str, list[tuple[SweepJob, Checked]]] = {}
        for job, checked in jobs:
            if (value := getattr(checked, field)) is not None:
                by_value.setdefault(value, []).append((job, checked))
        for value, same in by_value.items():
            if len(same) < 2:
                continue
            names = ", ".join(f"job {job.num} ({_label(job, shared)})" for job, _ in same)
            location = same[0][1].sources.locate(key)
            issues.append(
                Issue(
                    key,
                    f"{names} share this value: {why}",
                    fix.format(value=value),
                    value=value,
                    location=location,
                )
            )
    return issues


def _label(job: SweepJob, shared: set[str]) -> str:
    own = [
        typed.lstrip("+")
        for o, typed in zip(job.overrides, job.typed, strict=True)
        if o not in shared and not o.startswith("hydra.")
    ]
    return " ".join(own) or "(no overrides of its own)"


def check_sweep(argv: Sequence[str]) -> None:
    """UserError naming each job of the sweep in `argv` (checked by prepare_argv) that would
    be refused, with its overrides; nothing when `argv` is no sweep."""
    from hydra.core.global_hydra import GlobalHydra

    from rlpost.config.search_path import hydra_session

    args: LaunchArgs = parse_argv(argv)
    if not args.multirun or args.informational:
        return
    jobs = sweep_jobs(args.overrides)
    if not jobs:
        return
    register_resolvers()
    shared = set.intersection(*(set(job.overrides) for job in jobs))
    roots = search_roots(args.config_dir, args.config_path)
    config_name = args.config_name or PRIMARY_CONFIG
    refused: dict[str, tuple[Issue, list[SweepJob]]] = {}
    with hydra_session(args.config_dir, main_dir(args.config_path)):
        loader = GlobalHydra.instance().config_loader()
        first = None
        started: list[tuple[SweepJob, Checked]] = []
        for job in jobs:
            try:
                checked = check_job(loader, config_name, job, roots, first)
                first = checked.full if first is None else first
                started.append((job, checked))
            except UserError as exc:
                for issue in exc.issues:  # one entry per problem, with the jobs it refuses
                    refused.setdefault(issue.render(), (issue, []))[1].append(job)
        for issue in shared_by_jobs(started, shared):  # located while Hydra's search path holds
            refused[issue.render()] = (issue, [])
    if not refused:
        return
    issues = []
    for issue, bad in refused.values():
        if not bad:  # a problem between jobs, which names them
            issues.append(issue)
            continue
        if len(bad) == len(jobs) and len(jobs) > 1:
            where = f"every job of the sweep ({len(jobs)})"
        else:
            where = "; ".join(f"job {job.num} ({_label(job, shared)})" for job in bad)
        issues.append(
            Issue(
                issue.key,
                f"in {where}: {issue.message}",
                issue.fix,
                value=issue.value,
                location=issue.location,
            )
        )
    raise UserError(
        issues,
        title="sweep error",
        note=f"no job has started: each of the sweep's {len(jobs)} jobs is checked before the "
        "first starts",
    )
