"""`rlpost validate`: every check the launcher runs before it starts anything, and no run.

Overrides are checked against the groups and the schema, Hydra composes (a broken defaults
entry or YAML is located in its file), the run validates (schema, hooks, SGLang options, the
model against its config.json), and the planner plans it; `mode=slime_args` renders the
slime arguments too. Exit 0 with a short summary, or 2 with every problem found.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from rlpost.cli.target import Target, add_target_arguments, target_from_args
from rlpost.config.loader import compose_run_config
from rlpost.config.overrides import refuse_sweeps
from rlpost.config.sources import SourceMap
from rlpost.plan import Plan
from rlpost.schema import RunConfig
from rlpost.schema.hardware import device_word
from rlpost.schema.run import LAUNCH_MODES

HELP = "check a config (every launcher check, plan included) without running anything"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    parser.add_argument(
        "--no-local-checks",
        action="store_true",
        help="for a config meant to run on another machine: skip what depends on this one "
        "(checkpoint and data files, packages, GPUs, credentials)",
    )


def _render_slime_args(run: RunConfig, plan: Plan) -> None:
    from rlpost.plan import render_slime_args

    render_slime_args(run, plan)


def _no_check(run: RunConfig, plan: Plan, machine: bool) -> None:
    return None


LOCAL_NOTE = (
    "(the checks above include this machine's {checked}; for a config meant to run on another "
    "machine, add --no-local-checks)"
)


def _preflight(run: RunConfig, plan: Plan, machine: bool) -> None:
    from rlpost.errors import UserError
    from rlpost.preflight import preflight

    try:
        preflight(run, plan, machine=machine)
    except UserError as exc:
        if not machine:
            raise
        checked = "files, packages and GPUs" if run.hardware.kind == "gpu" else "files and packages"
        raise UserError(
            exc.issues, title=exc.title, note=LOCAL_NOTE.format(checked=checked)
        ) from None


# Checks a mode adds after planning (the launcher's MODES, minus their side effects).
MODE_CHECKS: dict[str, Callable[[RunConfig, Plan, bool], None]] = {
    "slime_args": lambda run, plan, machine: _render_slime_args(run, plan),
    "train": _preflight,
    "eval": _preflight,
}


def check(target: Target, machine: bool = True) -> tuple[RunConfig, SourceMap, Plan]:
    """Compose, validate and plan `target`, then run what its mode checks before it starts
    (for training: the preflight, with this machine's files and packages unless `machine`
    is false); UserError lists what is wrong."""
    from rlpost.cli.planning import located, plan_run

    run, sources = compose_run_config(
        target.overrides, config_dir=target.config_dir, config_name=target.config_name
    )
    run, plan = plan_run(run, sources)
    with located(sources):
        MODE_CHECKS.get(run.mode, _no_check)(run, plan, machine)
    return run, sources, plan


def checked(run: RunConfig, machine: bool = True) -> str:
    """What the checks covered: config.json only when it is on this machine (it is compared
    where it is found), the files and this machine only for a training mode without
    --no-local-checks."""
    config_json = (Path(run.model.hf_checkpoint).expanduser() / "config.json").is_file()
    local = run.mode in LAUNCH_MODES and machine
    text = "overrides, defaults lists, schema, hooks, SGLang options" + (
        ", config.json" if config_json else ""
    )
    text += ", plan" + (", files and this machine" if local else "")
    if run.mode in LAUNCH_MODES and not machine:
        unread = "files, packages or GPUs" if run.hardware.kind == "gpu" else "files or packages"
        text += f" (not this machine's {unread}: --no-local-checks)"
    elif not config_json:
        text += f" (no config.json at model.hf_checkpoint={run.model.hf_checkpoint} here)"
    return text


def _eval_sets(run: RunConfig) -> str:
    names = [d.name for d in run.recipe.eval.datasets]
    return f"{len(names)} set(s): {', '.join(names)}" if names else "no sets"


def summary(run: RunConfig, plan: Plan, machine: bool = True) -> str:
    """A few lines: what was checked and what the plan comes to."""
    p, par, eng, mem, batch = plan.placement, plan.parallel, plan.engine, plan.memory, plan.batch
    unit = device_word(run.hardware.kind)
    split = (
        f"colocated on {p.train_gpus} {device_word(run.hardware.kind, p.train_gpus)}"
        if p.colocate
        else f"{p.train_gpus} train + {p.rollout_gpus} rollout {device_word(run.hardware.kind, 2)}"
    )
    lines = [
        f"rlpost: OK  model={plan.model} recipe={plan.recipe} hardware={plan.hardware} "
        f"(layout {plan.layout}, mode {run.mode})",
        f"  checked  {checked(run, machine)}",
        f"  layout   {split}: train TP{par.tp} PP{par.pp} CP{par.cp} EP{par.ep} DP{par.dp}; "
        f"{eng.num_engines} engine(s) of {eng.gpus_per_engine} {unit}(s)",
        (
            f"  batch    {batch.samples_per_rollout} samples per rollout, "
            f"{batch.steps_per_rollout} optimizer step(s) each, {batch.num_rollout} rollouts"
            if run.mode != "eval"
            else f"  eval     {_eval_sets(run)}, evaluated once"
        ),
        "  memory   "
        + (
            f"train peak {mem.train.total_gib:.1f} GiB"
            if plan.trains
            else f"train ranks send weights, {mem.train.total_gib:.1f} GiB"
            if plan.starts_train_ranks
            else "no training"
        )
        + f", rollout peak {mem.rollout.total_gib:.1f} GiB, of {mem.gpu_gib:.1f} GiB per {unit}",
    ]
    lines += [f"  note     {note}" for note in plan.notes]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    machine = not args.no_local_checks
    target = target_from_args(args)
    refuse_sweeps(
        target.overrides,
        "rlpost validate checks one run",
        "python launch.py -m mode=plan {token} checks and plans every job (it runs nothing), "
        "or give one value ({first})",
    )
    config, _, plan = check(target, machine=machine)
    print(summary(config, plan, machine))
    return 0
