"""Two runs' resolved configs side by side, only the keys that differ.

    python tools/config_diff.py runs/a runs/b
    python tools/config_diff.py runs/a/ckpt/rollout_20 runs/a     # what changed on resume

Each argument is a run directory or checkpoint (their config.yaml) or a YAML file. Exits 0
when the configs are the same, 1 when they differ (like diff), 2 when one cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from rlpost.errors import run_command
from rlpost.plan.table import render_table
from rlpost.runtime.config_changes import Change, diff_configs
from rlpost.runtime.rundir import config_as_today
from rlpost.schema import RunConfig
from rlpost.schema.base import local_path_keys

CONFIG_FILE = "config.yaml"


def read_config(path: Path) -> dict[str, Any]:
    file = path / CONFIG_FILE if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"{path} has no {CONFIG_FILE} (give a run directory or a YAML)")
    data = yaml.safe_load(file.read_text(encoding="utf-8"))
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


def render_diff(changes: list[Change], name_a: str, name_b: str) -> str:
    rows = [[c.key, _cell(c.before), _cell(c.after)] for c in changes]
    return render_table(["key", name_a, name_b], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    args = parser.parse_args(argv)
    try:
        a, b = read_config(args.run_a), read_config(args.run_b)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        print(f"config_diff: {exc}", file=sys.stderr)
        return 2
    a, b = config_as_today(a), config_as_today(b)  # written by other versions: alike
    changes = diff_configs(a, b, frozenset(local_path_keys(RunConfig)))
    if not changes:
        print("the resolved configs are the same")
        return 0
    print(render_diff(changes, str(args.run_a), str(args.run_b)))
    print(f"{len(changes)} key(s) differ")
    return 1


if __name__ == "__main__":
    run_command("config_diff", main)
