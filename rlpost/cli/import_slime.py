"""`rlpost import slime SCRIPT.sh`: a slime launch script as rlpost configs.

    rlpost import slime scripts/run-glm4-9B.sh --out imported/ [--slime-dir ~/slime]

Lets bash evaluate the script with every command it runs recorded instead (nothing external
runs: `pkill`, `ray`, `pip` and `python3` only leave a record), takes the `train.py` /
`train_async.py` arguments it would have started, writes recipe/ and layout/ YAML (model/ and
hardware/ when no shipped one matches) under --out, composes and plans them, and prints the
command that launches them, every flag it did not import (with the reason and the nearest
rlpost key), and the job's environment. A sourced model script missing beside the script is
read from --slime-dir when given, else stands for rlpost's own model of that name.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from rlpost.errors import Issue, Location, UserError
from rlpost.interop.shell import DEFAULT_GPUS_PER_NODE

if TYPE_CHECKING:
    from rlpost.interop.slime_import import Imported

HELP = "write rlpost configs from a slime launch script (scripts/run-*.sh)"
USAGE = "rlpost import slime SCRIPT.sh [--out DIR] [--slime-dir DIR] (or --table for the flags)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", choices=["slime"], help="the framework the script is for")
    parser.add_argument("script", type=Path, nargs="?", help="the launch script (bash)")
    parser.add_argument(
        "--table", action="store_true", help="print the flag -> key table (markdown) and exit"
    )
    parser.add_argument("--out", type=Path, default=Path("imported"), help="where to write")
    parser.add_argument("--slime-dir", type=Path, help="a slime checkout, for sourced files")
    parser.add_argument("--name", help="recipe and layout name (default: the script's)")
    parser.add_argument(
        "--gpus-per-node",
        type=int,
        default=DEFAULT_GPUS_PER_NODE,
        help=f"the GPUs `nvidia-smi` shows the script (default {DEFAULT_GPUS_PER_NODE})",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a variable the script reads (MASTER_ADDR=127.0.0.1 and NODE_RANK=0 are given)",
    )


def run(args: argparse.Namespace) -> int:
    from rlpost.config.loader import compose_run_config
    from rlpost.interop.slime_import import import_slime
    from rlpost.plan import plan_config

    if args.table:
        from rlpost.interop.slime_flags import flag_table

        print(flag_table(), end="")
        return 0
    if args.script is None:
        raise UserError(
            [Issue("SCRIPT", "the slime launch script to import is missing", f"name it: {USAGE}")],
            title="import error",
        )
    if not args.script.is_file():
        raise UserError(
            [
                Issue(
                    "SCRIPT", f"{args.script} is not a file", f"give a slime launch script: {USAGE}"
                )
            ],
            title="import error",
        )
    bad = [item for item in args.env if "=" not in item]
    if bad:
        raise UserError(
            [Issue("--env", f"{bad[0]!r} is not NAME=VALUE", "give --env NAME=VALUE")],
            title="import error",
        )
    env = dict(item.split("=", 1) for item in args.env)
    imported = import_slime(
        args.script, args.slime_dir, args.name, gpus_per_node=args.gpus_per_node, env=env
    )
    overrides = [*imported.overrides(), *imported.extra_overrides()]
    # composed and planned from a folder of its own first: a refused import writes nothing
    with tempfile.TemporaryDirectory(prefix="rlpost-import-") as staging:
        imported.write(Path(staging))
        try:
            cfg, _ = compose_run_config(overrides, config_dir=Path(staging))
            _, plan = plan_config(cfg)
        except UserError as exc:
            raise refused(exc, Path(staging), args.out, args.script, imported) from None
    written = imported.write(args.out)
    for path in written:
        print(f"wrote {path}")
    print(
        f"\nentry point: {'async loop' if cfg.recipe.loop.mode == 'async' else 'sync loop'}; "
        f"plan: {plan.placement.train_gpus} train GPUs, TP{plan.parallel.tp} PP"
        f"{plan.parallel.pp} CP{plan.parallel.cp} EP{plan.parallel.ep} DP{plan.parallel.dp}, "
        f"{plan.engine.num_engines} engine(s) of {plan.engine.gpus_per_engine}"
    )
    print("launch it with:")
    print(f"  python launch.py --config-dir {args.out} {' '.join(overrides)}")
    if imported.unmapped:
        print(f"\n{len(imported.unmapped)} flag(s) not imported:")
        for u in imported.unmapped:
            value = f" {' '.join(u.values)}" if u.values else ""
            print(f"  {u.flag}{value}: {u.reason} (nearest: {u.nearest})")
    if imported.model_notes:
        print("\nMODEL_ARGS that differ from rlpost's export and build the same network:")
        for d in imported.model_notes:
            print(f"  {d.flag}: {d.reason}")
    for note in imported.cluster_notes:
        print(note)
    if imported.environment:
        print(
            f"\n{len(imported.environment)} variable(s) of the job's environment not imported: "
            "rlpost has no config key for environment variables, so neither the configs "
            "written nor their export (mode=slime_args) carry them; export what you need "
            "where rlpost's Ray cluster starts:"
        )
        for name, value, note in imported.environment:
            print(f"  {name}={value}: {note}")
    if imported.skipped:
        print(f"\n{len(imported.skipped)} command(s) of the script recorded, not run:")
        for line in imported.skipped:
            print(f"  {line[:160]}")
    return 0


def refused(
    error: UserError, staging: Path, out: Path, script: Path, imported: Imported
) -> UserError:
    """The refusal of the imported configs, said of the script: each issue names what set
    the refused key to the value imported (a flag and its value, an --eval-config set or
    default), and what else set it that slime overrules, where the import knows it, at the
    script; the files it would have written are named where --out would have held them."""

    def moved(text: str) -> str:
        return text.replace(str(staging), str(out))

    issues = []
    for issue in error.issues:
        origin = imported.origin(issue.key)
        message, fix = moved(issue.message), moved(issue.fix)
        location = issue.location
        if origin is None:
            if location is not None and location.file is not None:
                location = dataclasses.replace(location, file=moved(location.file))
            issues.append(dataclasses.replace(issue, message=message, fix=fix, location=location))
            continue
        beside = f"; {origin.beside}" if origin.beside else ""
        issues.append(
            Issue(
                origin.source,
                f"imported as {issue.key}: {message}{beside}",
                f"change {origin.named()} (in rlpost's terms: {fix})",
                issue.value if origin.value is None else origin.value,
                Location(file=str(script)),
            )
        )
    note = f"{script} imports to configs rlpost refuses: nothing was written to {out}"
    return UserError(issues, title="import error", note=note)
