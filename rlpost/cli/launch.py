"""The launcher: argv -> checked overrides -> Hydra -> RunConfig -> Plan -> the mode's action.

    python launch.py model=glm4-9b recipe=grpo_dapo hardware=h100x8 mode=plan

`mode=plan` and `mode=slime_args` import nothing heavy (no torch, ray, transformers,
megatron or sglang) and create no run directory; `mode=train` and `mode=eval` (one
evaluation, no training) hand the run to `rlpost.runtime.train`. Exit status: 0 when the
run is done; 2 for a configuration error (any UserError: its message, no traceback, before
anything starts); 3 when a run that started could not finish (what failed, the run
directory, the checkpoint to resume from); 4 for an exception nothing expected before the
run started (most likely a bug of rlpost's: its traceback once and a line that says so);
143 when SIGTERM stopped it (rlpost.runtime.stop), 130 when Ctrl-C did.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from omegaconf import DictConfig, OmegaConf

from rlpost.cli.planning import located, plan_run
from rlpost.config.loader import PRIMARY_CONFIG, load_run_config
from rlpost.config.overrides import TYPED_ARGV, flags_first, prepare_argv
from rlpost.config.resolvers import register_resolvers
from rlpost.config.sources import CONF_DIR, SourceMap, defer_source_map
from rlpost.errors import Issue, UserError, exit_with, exit_with_internal_error
from rlpost.schema import RunConfig
from rlpost.schema.run import LAUNCH_MODES
from rlpost.streams import guard_std_streams

if TYPE_CHECKING:
    from rlpost.cli.sweep import JobOutcome
    from rlpost.plan import Plan
    from rlpost.runtime.failures import RunFailed
    from rlpost.runtime.stop import HeldSignals


def _print_plan(cfg: RunConfig, plan: Plan) -> None:
    from rlpost.plan import render_plan

    print(render_plan(plan, cfg.plan.format))


def _print_slime_args(cfg: RunConfig, plan: Plan) -> None:
    from rlpost.plan import render_slime_args

    print(render_slime_args(cfg, plan, cfg.plan.format), end="")


def _claim(run_dir: Path) -> None:
    """One launch at a time per run directory: two would mix their metrics and checkpoints."""
    from rlpost.runtime.rundir import lock_holder, lock_run_dir

    if lock_run_dir(run_dir) is None:
        raise UserError(
            [
                Issue(
                    "run.dir",
                    f"another launch (pid {lock_holder(run_dir)}) is running in this run "
                    "directory; two would mix their metrics and checkpoints",
                    "wait for it to end, or choose another run.dir",
                    value=str(run_dir),
                )
            ],
            title="run directory in use",
        )


def _end_leftovers(run_dir: Path) -> None:
    """End what a killed launch of this run left running here (rlpost.runtime.leftovers)."""
    from rlpost.runtime.leftovers import end_leftovers

    left = end_leftovers(run_dir)
    if left:
        names = ", ".join(f"{p.pid} {p.name[:40]}" for p in left[:4])
        more = f" and {len(left) - 4} more" if len(left) > 4 else ""
        print(
            f"[rlpost] ended {len(left)} process(es) that the run's previous launch left "
            f"running: {names}{more}",
            flush=True,
        )


def _train(cfg: RunConfig, plan: Plan) -> None:
    """The preflight and the resume point (both light), then the run itself. Raises RunFailed
    when the run could not finish (RunStopped: SIGTERM)."""
    from rlpost.plan.cluster import paths_for_the_cluster
    from rlpost.preflight import preflight
    from rlpost.runtime.failures import stopped
    from rlpost.runtime.resume import find_resume_point
    from rlpost.runtime.rundir import run_dir_of
    from rlpost.runtime.stop import Terminated, sigterm_raises

    run_dir = run_dir_of(cfg)
    resume = None
    with sigterm_raises():
        try:
            warnings = preflight(cfg, plan)
            cfg = paths_for_the_cluster(cfg, os.getcwd())
            resume = find_resume_point(cfg, plan, run_dir)
            _claim(run_dir)
            _end_leftovers(run_dir)
            for issue in warnings:
                print(f"rlpost: warning: {issue.key}: {issue.message}", file=sys.stderr)
            from rlpost.runtime.train import run

            run(cfg, plan, resume)
        except Terminated:
            resumed = resume.path if resume else None
            raise stopped(None, run_dir, 0, "", cfg.mode == "eval", resumed) from None


PRINTING_MODES = {"plan", "slime_args"}
MODES: dict[str, Callable[[RunConfig, Plan], None]] = {
    "plan": _print_plan,
    "slime_args": _print_slime_args,
    "train": _train,
    "eval": _train,  # the same launch; the loop evaluates once and trains nothing
}


def _sources_of_current_job() -> SourceMap:
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    overrides = [*hc.overrides.hydra, *hc.overrides.task]
    config_sources = OmegaConf.to_container(hc.runtime.config_sources)
    name = hc.job.config_name or PRIMARY_CONFIG
    return defer_source_map(name, overrides, config_sources)  # type: ignore[arg-type]


def _default_run_dir(cfg: DictConfig) -> None:
    """run.dir: null means the job's Hydra output directory (a sweep job's own subdir). A
    training launch claims it; when another launch that started in the same second holds
    it, this one takes <dir>-2 (-3, ...). An export (mode=slime_args) keeps run.dir null,
    as it is without Hydra's job (`_print_once`): the script is the same with --config-dir
    or without, and saves to ./slime/ where slime runs, not to the folder it was exported in.
    A single mode=plan job keeps it null too, as without Hydra's job: its plan is the plan of
    the launch it shows (whose refusals, run.resume=auto without run.dir among them, it
    repeats), with --config-dir or without; a sweep's plan jobs get their subdirs."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if OmegaConf.select(cfg, "run.dir", default=None) is not None:
        return
    mode = OmegaConf.select(cfg, "mode", default="train")
    if mode == "slime_args":
        return
    if mode == "plan" and HydraConfig.get().mode != RunMode.MULTIRUN:
        return
    training = mode in LAUNCH_MODES
    if training and OmegaConf.select(cfg, "run.resume", default=None) == "auto":
        return  # a fresh dated directory holds nothing to resume: validation says so
    base = Path(HydraConfig.get().runtime.output_dir)
    chosen = base
    if training:
        from rlpost.runtime.rundir import lock_run_dir

        n = 1
        while lock_run_dir(chosen) is None:
            n += 1
            chosen = base.with_name(f"{base.name}-{n}")
    OmegaConf.update(cfg, "run.dir", str(chosen), force_add=True)


def launch_job(cfg: DictConfig) -> None:
    """Validate, plan, then do what `mode` asks."""
    sources = _sources_of_current_job()
    _default_run_dir(cfg)
    run, plan = plan_run(load_run_config(cfg, sources), sources)
    with located(sources):
        MODES[run.mode](run, plan)


def run_job(cfg: DictConfig, job: Callable[[DictConfig], None] = launch_job) -> JobOutcome | None:
    """The Hydra task: `job` (launch_job). A refusal or a run that could not finish ends a
    single launch with its status; a sweep's job prints the same and returns how it ended,
    for the sweep summary: raising would end the sweep (SystemExit), or have Hydra raise it
    again once the jobs have run, before the summary is written. An exception nothing
    expected (a bug) ends a single launch as an internal error (its traceback once, exit
    status 4: errors.exit_with_internal_error); in a sweep it is that job's failure: its
    traceback in the run directory's logs/failures.log, as a run's, and the next job starts.
    Between a sweep's jobs Ctrl-C and SIGTERM are held (the sweep's HeldSignals) and raised
    as the next job starts."""
    held = _sweep_signals()
    if held is not None:
        held.release()  # a Ctrl-C or SIGTERM since the last job ends the sweep here
    try:
        return _run_job(cfg, job)
    finally:
        if held is not None:
            held.hold()  # until the next job: Hydra's own steps, the summary


def _sweep_signals() -> HeldSignals | None:
    """The running sweep's held signals; None outside a sweep."""
    if not _in_sweep():
        return None
    from rlpost.cli.sweep import SweepSummary

    running = SweepSummary.running
    return running.signals if running is not None else None


def _run_job(cfg: DictConfig, job: Callable[[DictConfig], None]) -> JobOutcome | None:
    from rlpost.runtime.failures import RunFailed

    refused = False
    try:
        job(cfg)
    except UserError as exc:
        refused = True
        if not _in_sweep():
            exit_with(exc)
        print(exc.render(), file=sys.stderr, flush=True)
        from rlpost.cli.sweep import JobOutcome

        return JobOutcome.of_refusal(exc)
    except RunFailed as failure:
        return _ended(failure)
    except Exception as exc:
        if not _in_sweep():
            exit_with_internal_error(exc)
        return _ended(_failed_job(cfg, exc))
    finally:
        _discard_output_dir(refused)
    return None


def _ended(failure: RunFailed) -> JobOutcome:
    """A run that could not finish: its message; a single launch exits with its status."""
    print(failure.render(_job_command()), file=sys.stderr, flush=True)
    if not _in_sweep():
        raise SystemExit(failure.exit_status) from None
    from rlpost.cli.sweep import JobOutcome

    return JobOutcome.of_failure(failure)


def _job_command() -> list[str] | None:
    """The flags and overrides that launch this job again (a sweep's job: its own values, as
    typed, without -m); None outside a Hydra job."""
    from hydra.core.hydra_config import HydraConfig

    from rlpost.config.overrides import parse_argv
    from rlpost.config.typed_overrides import typed_forms

    if not HydraConfig.initialized():
        return None
    args = parse_argv(sys.argv[1:])
    flags = [
        f"{flag}={value}"
        for flag, value in (
            ("--config-dir", args.config_dir),
            ("--config-path", args.config_path),
            ("--config-name", args.config_name),
        )
        if value is not None
    ]
    typed = typed_forms(args.overrides)
    # Hydra's own (hydra.searchpath, hydra.run.dir) as given; the job's from its config,
    # without the '++' the launcher gives schema keys (it adds it again)
    hydra = [o for o in args.overrides if o.lstrip("+").startswith("hydra.")]
    task = [typed.get(o, o).removeprefix("++") for o in HydraConfig.get().overrides.task]
    return [*flags, *task, *hydra]


def _failed_job(cfg: DictConfig, exc: Exception) -> RunFailed:
    """A sweep job that raised what nothing expected, recorded as a run's failure is."""
    from hydra.core.hydra_config import HydraConfig

    from rlpost.runtime.failures import describe, failed, record_failure

    run_dir = Path(
        OmegaConf.select(cfg, "run.dir", default=None) or HydraConfig.get().runtime.output_dir
    )
    record_failure(run_dir, exc)
    evaluation = OmegaConf.select(cfg, "mode", default="train") == "eval"
    return failed(describe(exc), run_dir, 0, evaluation)


def _in_sweep() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _discard_output_dir(refused: bool) -> None:
    """The output folder Hydra made for this job goes again when nothing was written there,
    after a refusal or a single launch whose run.dir is elsewhere (a sweep's job folders
    stay for its summary). Only a folder named by the launch's start time (the default
    runs/<date>/<time>, which a training launch with run.dir unset has claimed): one named
    otherwise (`hydra.run.dir=.`, a folder of the user's) may have been there before. The
    folders above it that the start time names (runs/<date>) go too when that leaves them
    empty; `runs/` itself stays. A refused sweep job's own folder goes, and nothing above
    it: the sweep goes on, and its summary is written there."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from rlpost.runtime.rundir import discard_unused

    if not HydraConfig.initialized():
        return
    hc = HydraConfig.get()
    sweep = hc.mode == RunMode.MULTIRUN
    if sweep and not refused:
        return
    named = hc.sweep if sweep else hc.run
    # hc.run / hc.sweep are DictConfig nodes: their container is a dict
    container = cast(dict[str, Any], OmegaConf.to_container(named, resolve=False))
    pattern = str(container.get("dir", ""))
    output = Path(hc.runtime.output_dir)
    if "${now:" not in pattern or not discard_unused(output) or sweep:
        return
    folder = output.parent  # the folders above it that the start time names
    for part in reversed(Path(pattern).parts[:-1]):
        if "${now:" not in part:
            break
        try:
            folder.rmdir()  # only when empty
        except OSError:
            break
        folder = folder.parent


def _printing_mode(args: Sequence[str]) -> bool:
    """A single job that only prints (mode=plan or slime_args) from plain overrides: it needs
    no Hydra job (no run directory, no sweep), so one compose is enough — Hydra's own entry
    composes twice, once only to learn whether the command is a sweep."""
    modes = {a.lstrip("+").split("=", 1)[1] for a in args if a.lstrip("+").startswith("mode=")}
    plain = all("=" in a and not a.startswith(("-", "hydra.", "+hydra.")) for a in args)
    return plain and bool(modes) and modes <= PRINTING_MODES


def _print_once(args: Sequence[str]) -> None:
    from rlpost.config.loader import compose_run_config

    try:
        run, sources = compose_run_config(args)
        MODES[run.mode](*plan_run(run, sources))
    except UserError as exc:
        exit_with(exc)
    except Exception as exc:
        exit_with_internal_error(exc)


def main(argv: Sequence[str] | None = None, job: Callable[[DictConfig], None] = launch_job) -> None:
    """Check argv's overrides, then hand them to Hydra. SIGTERM before a training launch's
    own handling (rlpost.runtime.stop) ends it with a line and status 143, Ctrl-C with a
    line and 130, as one during the run does (RunInterrupted). A reader of the
    output that leaves (`| head`, a killed `tee`) ends nothing: the launch goes on printing
    to /dev/null and exits with its own status (rlpost.streams); a sweep goes on with its
    next job. `job`: what each Hydra job does (run_job says how its ending is reported)."""
    from rlpost.runtime.failures import EXIT_INTERRUPTED
    from rlpost.runtime.stop import EXIT_STOPPED, Terminated, sigterm_raises

    guard_std_streams()
    typed = sys.argv[1:] if argv is None else list(argv)
    TYPED_ARGV[:] = [sys.argv[0], *typed]
    args = flags_first(typed)
    with sigterm_raises():
        try:
            _main(args, job)
        except Terminated:
            _ended_early(args, sigterm=True)
            raise SystemExit(EXIT_STOPPED) from None
        except KeyboardInterrupt:
            _ended_early(args, sigterm=False)
            raise SystemExit(EXIT_INTERRUPTED) from None
        finally:
            _sweep_over()


def _sweep_over() -> None:
    """However a sweep ended (its last job's end holds Ctrl-C and SIGTERM, and a job that
    ended the sweep leaves Hydra's loop with them held), this process's handlers are the
    ones from before it again, and no sweep is running."""
    if "rlpost.cli.sweep" not in sys.modules:
        return
    from rlpost.cli.sweep import SweepSummary

    running, SweepSummary.running = SweepSummary.running, None
    if running is not None:
        running.signals.restore()


def _ended_early(args: Sequence[str], sigterm: bool) -> None:
    """Ctrl-C or SIGTERM outside a run's own handling: a sweep prints what it did and did
    not do. One that has not begun (its jobs being checked, Hydra setting it up: the signal
    ends it there, as it ends a single launch's checks) ran no job and wrote nothing, not
    even its folder: the same command runs it whole."""
    running = None
    if "rlpost.cli.sweep" in sys.modules:  # Hydra's callback imported it: a sweep may run
        from rlpost.cli.sweep import SweepSummary

        running = SweepSummary.running
    if running is not None:
        running.interrupt(sigterm)
        return
    said = "stopped by SIGTERM" if sigterm else "interrupted (Ctrl-C)"
    if _is_sweep(args):
        print(
            f"rlpost: sweep {said} before its first job started: no job ran and nothing was "
            "written; the same command runs the whole sweep",
            file=sys.stderr,
        )
    else:
        print(f"rlpost: {said} before the run started", file=sys.stderr)


def _is_sweep(args: Sequence[str]) -> bool:
    from rlpost.config.overrides import parse_argv

    try:
        return parse_argv(args).multirun
    except UserError:  # a flag of another tool's: refused as the launch started
        return False


def _main(args: list[str], job: Callable[[DictConfig], None]) -> None:
    if _printing_mode(args):
        _print_once(args)
        return
    import hydra

    from rlpost.cli.sweep_check import check_sweep

    try:
        checked = prepare_argv(args)
        check_sweep(checked)
    except UserError as exc:
        exit_with(exc)
    sys.argv = [sys.argv[0], *checked]
    register_resolvers()
    entry = hydra.main(config_path=str(CONF_DIR), config_name=PRIMARY_CONFIG, version_base=None)

    def task(cfg: DictConfig) -> JobOutcome | None:
        return run_job(cfg, job)

    entry(task)()
