"""`rlpost validate`: every check the launcher runs before it starts anything, and no run.

Overrides are checked against the groups and the schema, Hydra composes (a broken defaults
entry or YAML is located in its file), the run validates (schema, hooks, SGLang options, the
model against its config.json), and the planner plans it; `mode=slime_args` renders the
slime arguments too. Exit 0 with a short summary, or 2 with every problem found.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from rlpost.cli.target import Target, add_target_arguments, target_from_args
from rlpost.config.loader import compose_run_config
from rlpost.config.sources import SourceMap
from rlpost.plan import Plan
from rlpost.schema import RunConfig

HELP = "check a config (every launcher check, plan included) without running anything"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)


def _render_slime_args(run: RunConfig, plan: Plan) -> None:
    from rlpost.plan import render_slime_args

    render_slime_args(run, plan)


def _no_check(run: RunConfig, plan: Plan) -> None:
    return None


def _memory_fit(run: RunConfig, plan: Plan) -> None:
    from rlpost.plan.fit import enforce_memory_fit

    enforce_memory_fit(run, plan)


# Checks a mode adds after planning (the launcher's MODES, minus their side effects).
MODE_CHECKS: dict[str, Callable[[RunConfig, Plan], None]] = {
    "slime_args": _render_slime_args,
    "train": _memory_fit,
}


def check(target: Target) -> tuple[RunConfig, SourceMap, Plan]:
    """Compose, validate and plan `target`; UserError lists what is wrong."""
    from rlpost.cli.launch import plan_run

    run, sources = compose_run_config(
        target.overrides, config_dir=target.config_dir, config_name=target.config_name
    )
    plan = plan_run(run, sources)
    MODE_CHECKS.get(run.mode, _no_check)(run, plan)
    return run, sources, plan


def summary(run: RunConfig, plan: Plan) -> str:
    """A few lines: what was checked and what the plan comes to."""
    p, par, eng, mem, batch = plan.placement, plan.parallel, plan.engine, plan.memory, plan.batch
    split = (
        f"colocated on {p.train_gpus} GPUs"
        if p.colocate
        else f"{p.train_gpus} train + {p.rollout_gpus} rollout GPUs"
    )
    lines = [
        f"rlpost: OK  model={plan.model} recipe={plan.recipe} hardware={plan.hardware} "
        f"(layout {plan.layout}, mode {run.mode})",
        "  checked  overrides, defaults lists, schema, hooks, SGLang options, config.json, plan",
        f"  layout   {split}: train TP{par.tp} PP{par.pp} CP{par.cp} EP{par.ep} DP{par.dp}; "
        f"{eng.num_engines} engine(s) of {eng.gpus_per_engine} GPU(s)",
        f"  batch    {batch.samples_per_rollout} samples per rollout, "
        f"{batch.steps_per_rollout} optimizer step(s) each, {batch.num_rollout} rollouts",
        f"  memory   train peak {mem.train.total_gib:.1f} GiB, rollout peak "
        f"{mem.rollout.total_gib:.1f} GiB, of {mem.gpu_gib:.1f} GiB per GPU",
    ]
    lines += [f"  note     {note}" for note in plan.notes]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    config, _, plan = check(target_from_args(args))
    print(summary(config, plan))
    return 0
