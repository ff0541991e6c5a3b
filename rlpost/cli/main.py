"""The `rlpost` command: list, check, show and scaffold configs; plan and launch runs.

    rlpost ls [GROUP...] [--config-dir DIR]
    rlpost validate [--config-dir DIR] [--no-local-checks] FILE.yaml | OVERRIDE...
    rlpost show [--config-dir DIR] model=... recipe=... hardware=... [--only KEY]
    rlpost plan [--config-dir DIR] model=... recipe=... hardware=...   # launch.py mode=plan
    rlpost new model --from-hf DIR [--name NAME] [--out PATH]
    rlpost new recipe NAME --from BASE [KEY=VALUE...]
    rlpost new hardware NAME [--nodes N]                                 # from this machine
    rlpost run ...                                                       # python launch.py ...
    rlpost status RUN_DIR                  # how each launch ended; what run.resume=auto does
    rlpost cluster up --hostfile FILE | status | down | wait             # a Ray cluster over ssh
    rlpost slurm model=... recipe=... hardware=... --run-dir DIR [--out FILE]  # sbatch script
    rlpost kuberay model=... recipe=... hardware=... --image IMAGE [--pvc PVC]  # a RayJob
    rlpost import slime SCRIPT.sh [--out DIR] [--slime-dir DIR] [--env NAME=VALUE]
                                  [--gpus-per-node N] [--name NAME]     # configs from slime
    rlpost import slime --table                                         # slime flag -> key

Every user error exits 2 with its message and no traceback; an exception rlpost did not
expect (a bug of rlpost's) exits 4 with its traceback once and a line saying so. None of
these commands imports torch, ray, transformers, megatron or sglang except `run` when it
trains.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from rlpost.errors import Issue, UserError, did_you_mean, run_command
from rlpost.streams import guard_std_streams

if TYPE_CHECKING:
    from rlpost.cli.target import Target
    from rlpost.config.sources import SourceMap
    from rlpost.schema import RunConfig


@dataclass(frozen=True)
class Verb:
    """A subcommand: its help line, its arguments and what it does."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _verb(module: ModuleType) -> Verb:
    return Verb(module.HELP, module.add_arguments, module.run)


def _plan_arguments(parser: argparse.ArgumentParser) -> None:
    from rlpost.cli.target import add_target_arguments

    add_target_arguments(parser)


EVAL_PLAN_FORMATS = ("table", "json")


def _composed(target: Target, overrides: list[str]) -> tuple[RunConfig, SourceMap] | None:
    """The config the command line composes to, or None where it does not compose (the
    launch then reports why, as for any plan)."""
    from rlpost.config.loader import compose_run_config

    try:
        return compose_run_config(
            overrides, config_dir=target.config_dir, config_name=target.config_name
        )
    except UserError:
        return None


def _plan(args: argparse.Namespace) -> int:
    """launch.py mode=plan; given mode=eval, the plan of that evaluation (its sets, its
    memory and time), which a mode=plan appended after it would replace by training's, as
    plan.format says (table or json: the evaluation itself reads no plan.format, so the
    verb takes it off the overrides)."""
    from rlpost.cli import launch
    from rlpost.cli.target import target_from_args
    from rlpost.config.overrides import last_value, refuse_sweeps

    target = target_from_args(args)
    refuse_sweeps(
        target.overrides,
        "rlpost plan prints one run's plan",
        "python launch.py -m mode=plan {token} prints each job's plan (it runs nothing), or "
        "give one value",
    )
    # plan.format is the verb's: the evaluation reads none
    overrides = [a for a in target.overrides if a.lstrip("+").partition("=")[0] != "plan.format"]
    composed = None
    mode = last_value(target.overrides, "mode")
    if mode is None:  # an experiment file or a group file may set it
        composed = _composed(target, overrides)
        mode = composed[0].mode if composed else None
    if mode != "eval":  # the verb's mode=plan stands for the command line's (mode=train)
        argv = [a for a in target.launcher_argv() if a.lstrip("+").partition("=")[0] != "mode"]
        launch.main([*argv, "mode=plan"])
        return 0
    from rlpost.cli.planning import plan_run
    from rlpost.config.loader import compose_run_config
    from rlpost.plan import render_plan

    form = last_value(target.overrides, "plan.format") or "table"
    if form not in EVAL_PLAN_FORMATS:
        raise UserError(
            [
                Issue(
                    "plan.format",
                    f"an evaluation's plan prints as {' or '.join(EVAL_PLAN_FORMATS)}",
                    f"plan.format={EVAL_PLAN_FORMATS[0]} or plan.format={EVAL_PLAN_FORMATS[1]}"
                    + (" (slime's arguments are a training run's)" if form == "script" else ""),
                    value=form,
                )
            ],
            title="command-line error",
        )
    cfg, sources = composed or compose_run_config(
        overrides, config_dir=target.config_dir, config_name=target.config_name
    )
    cfg, plan = plan_run(cfg, sources)
    print(render_plan(plan, form))
    return 0


def _new_arguments(parser: argparse.ArgumentParser) -> None:
    from rlpost.cli import new_hardware, new_model, new_recipe

    kinds = parser.add_subparsers(dest="kind", required=True, metavar="{model,recipe,hardware}")
    for name, module in (("model", new_model), ("recipe", new_recipe), ("hardware", new_hardware)):
        sub = kinds.add_parser(
            name,
            help=module.HELP,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(sub)
        sub.set_defaults(handler=module.run)


def _new(args: argparse.Namespace) -> int:
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


def verbs() -> dict[str, Verb]:
    from rlpost.cli import catalog, cluster, import_slime, run_status, schedulers, show, validate

    return {
        "ls": _verb(catalog),
        "validate": _verb(validate),
        "show": _verb(show),
        "plan": Verb("print the plan (python launch.py ... mode=plan)", _plan_arguments, _plan),
        "new": Verb(
            "write a model YAML from an HF config, a recipe that extends another, or a "
            "hardware profile of this machine",
            _new_arguments,
            _new,
        ),
        "run": Verb("launch: exactly `python launch.py ARGS`", lambda p: None, lambda a: 0),
        "status": _verb(run_status),
        "cluster": _verb(cluster),
        "slurm": Verb(schedulers.SLURM_HELP, schedulers.add_slurm_arguments, schedulers.slurm),
        "kuberay": Verb(
            schedulers.KUBERAY_HELP, schedulers.add_kuberay_arguments, schedulers.kuberay
        ),
        "import": _verb(import_slime),
    }


def build_parser(table: dict[str, Verb]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlpost", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="verb", required=True, metavar="COMMAND")
    for name, verb in table.items():
        verb.add_arguments(sub.add_parser(name, help=verb.help, description=verb.help))
    return parser


# Free tokens (overrides, KEY=VALUE) may follow options in any order; argparse stops filling
# a positional list at the first option, so the rest arrives as "unknown" and is added here.
FREE_TOKENS = ("items", "changes")


def _options(parser: argparse.ArgumentParser, verb: str) -> list[str]:
    """The option strings `verb`'s own parser takes."""
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        if isinstance(action, argparse._SubParsersAction) and verb in action.choices:
            return sorted(action.choices[verb]._option_string_actions)
    return []


def parse(parser: argparse.ArgumentParser, args: Sequence[str]) -> argparse.Namespace:
    parsed, extra = parser.parse_known_args(args)
    field = next((name for name in FREE_TOKENS if hasattr(parsed, name)), None)
    flags = [token for token in extra if token.startswith("-")]
    if flags and field is not None:  # a verb of overrides given slime's `--lr 1e-6`
        from rlpost.config.flags import FlagOwner, flag_issues

        owner = FlagOwner.verb(parsed.verb)
        issues = flag_issues(args, _options(parser, parsed.verb), owner)
        raise UserError(issues, "command-line error")
    if flags or (extra and field is None):
        parser.error(f"unrecognized arguments: {' '.join(flags or extra)}")
    if field is not None:
        setattr(parsed, field, [*getattr(parsed, field), *extra])
    return parsed


def _launches(argv: Sequence[str]) -> bool:
    """`rlpost run ...`, or launcher arguments given directly (`rlpost model=x mode=plan`)."""
    first = argv[0]
    return first == "run" or "=" in first or first in ("-m", "--multirun", "-cd", "--config-dir")


def _unknown_verb(word: str, table: dict[str, Verb]) -> UserError:
    return UserError(
        [
            Issue(
                key="COMMAND",
                value=word,
                message=f"rlpost has no command '{word}'.{did_you_mean(word, table)}",
                fix=f"use one of: {', '.join(table)} (rlpost --help explains each)",
            )
        ],
        title="command-line error",
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Run one verb; exits with its status (2 on a user error, without a traceback; 4 on an
    exception nothing expected, a defect of rlpost's: errors.run_command). A
    reader that leaves early (`rlpost show | head`) stops nothing: the verb finishes,
    printing to /dev/null, and keeps its status (rlpost.streams)."""
    args = list(sys.argv[1:] if argv is None else argv)
    guard_std_streams()
    if args and _launches(args):
        from rlpost.cli import launch

        launch.main(args[1:] if args[0] == "run" else args)
        return
    table = verbs()

    def run_verb() -> int:
        if args and not args[0].startswith("-") and args[0] not in table:
            raise _unknown_verb(args[0], table)
        parsed = parse(build_parser(table), args)
        return table[parsed.verb].run(parsed)

    run_command(f"rlpost {args[0]}" if args and args[0] in table else "rlpost", run_verb)


if __name__ == "__main__":
    main()
