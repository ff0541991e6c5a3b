"""Runs' resolved configs side by side, only the keys that differ.

    python tools/config_diff.py runs/a runs/b
    python tools/config_diff.py runs/a/ckpt/rollout_20 runs/a     # what changed on resume
    python tools/config_diff.py runs/multirun/2026-11-21/10-00-00/*   # a sweep's jobs

Each argument is a run directory or checkpoint (their config.yaml) or a YAML file; a key is
shown when any two of them differ in it. Of more than two paths (a glob over a sweep's
folder), the sweep's own files (multirun.yaml, the summaries) and folders without a
config.yaml are skipped with a note. Exits 0 when the configs are the same, 1 when they
differ (like diff), 2 when one cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rlpost.config.search_path import load_yaml_file
from rlpost.errors import UserError, run_command
from rlpost.plan.table import render_table
from rlpost.runtime.config_changes import MISSING, diff_configs, flatten
from rlpost.runtime.rundir import config_as_today
from rlpost.schema import RunConfig
from rlpost.schema.base import local_path_keys

CONFIG_FILE = "config.yaml"
SWEEP_FILES = ("multirun.yaml", "summary.json", "summary.txt")  # beside a sweep's job folders


def read_config(path: Path) -> dict[str, Any]:
    file = path / CONFIG_FILE if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"{path} has no {CONFIG_FILE} (give a run directory or a YAML)")
    data = load_yaml_file(file)  # a key written twice is refused, as rlpost refuses it
    if not isinstance(data, dict):
        raise ValueError(f"{file} does not hold a config mapping")
    if "defaults" in data:  # Hydra composes it: its keys are not the run's resolved values
        raise ValueError(
            f"{file} is a config to compose (it has a defaults list), not a resolved config; "
            "give a run directory or checkpoint, or save the resolved config with "
            f"`rlpost show {file} > resolved.yaml` and compare that"
        )
    return data


def _cell(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def render_diff(configs: list[dict[str, Any]], names: list[str]) -> tuple[str, int]:
    """The keys in which any config differs from the first, a column per config; and how
    many keys that is."""
    paths = frozenset(local_path_keys(RunConfig))
    keys = sorted({c.key for other in configs[1:] for c in diff_configs(configs[0], other, paths)})
    if not keys:
        return "", 0
    flat = [flatten(config) for config in configs]
    rows = [[key, *(_cell(f.get(key, MISSING)) for f in flat)] for key in keys]
    return render_table(["key", *names], rows), len(keys)


def the_runs(paths: list[Path]) -> list[Path]:
    """`paths`, less a sweep's own files and folders without a config when more than two are
    given (a glob over a sweep's folder), said on stderr."""
    if len(paths) <= 2:
        return paths
    skipped = [
        p
        for p in paths
        if p.name in SWEEP_FILES or (p.is_dir() and not (p / CONFIG_FILE).is_file())
    ]
    if skipped:
        names = ", ".join(map(str, skipped))
        print(f"config_diff: skipping {names}: no run's config", file=sys.stderr)
    return [p for p in paths if p not in skipped]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", metavar="run")
    args = parser.parse_args(argv)
    runs = the_runs(args.runs)
    if len(runs) < 2:
        given = ", ".join(map(str, args.runs))
        print(
            f"config_diff: {given}: fewer than two configs to compare\n"
            "  fix: give two or more run directories, checkpoints or YAML files",
            file=sys.stderr,
        )
        return 2
    try:
        configs = [read_config(run) for run in runs]
    except UserError as exc:
        print(exc.render(), file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        print(f"config_diff: {exc}", file=sys.stderr)
        return 2
    configs = [config_as_today(c) for c in configs]  # written by other versions: alike
    table, count = render_diff(configs, [str(run) for run in runs])
    if not count:
        print("the resolved configs are the same")
        return 0
    print(table)
    print(f"{count} key(s) differ")
    return 1


if __name__ == "__main__":
    run_command("config_diff", main)
