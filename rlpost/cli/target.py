"""What `rlpost validate/show/plan` compose: overrides, or a YAML file, plus a config dir.

    rlpost validate model=qwen3-8b recipe=grpo_dapo hardware=h100x8
    rlpost validate my_configs/recipe/my_grpo.yaml hardware=a100x4   # a group file, in context
    rlpost validate my_configs/run.yaml                               # a primary config

A file inside a group folder (model/, recipe/, hardware/, layout/) is chosen for its group,
with its grandparent as the config dir; any other file is a primary config (its folder is the
config dir and its stem the config name), as `--config-dir D --config-name NAME` would give.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rlpost.config.overrides import search_roots
from rlpost.config.sources import PRIMARY_CONFIG, ConfigRoot, display_path, find_config
from rlpost.errors import Issue, Location, UserError

GROUPS = ("model", "recipe", "hardware", "layout")
YAML_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class Target:
    """A composition request: Hydra overrides, a config dir and the primary config's name."""

    overrides: tuple[str, ...]
    config_dir: str | None = None
    config_name: str = PRIMARY_CONFIG

    def roots(self) -> list[ConfigRoot]:
        return search_roots(self.config_dir)

    def launcher_argv(self) -> list[str]:
        """The same request as `python launch.py` arguments."""
        argv = ["--config-dir", self.config_dir] if self.config_dir else []
        if self.config_name != PRIMARY_CONFIG:
            argv += ["--config-name", self.config_name]
        return [*argv, *self.overrides]


def add_config_dir_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config-dir",
        "-cd",
        metavar="DIR",
        help="a folder of your own model/, recipe/, hardware/ (and layout/) YAMLs, searched "
        "after rlpost's shipped conf/",
    )


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_dir_argument(parser)
    parser.add_argument(
        "--config-name", "-cn", metavar="NAME", help="primary config (default: config)"
    )
    parser.add_argument(
        "items",
        nargs="*",
        metavar="FILE.yaml|OVERRIDE",
        help="a YAML file and/or Hydra overrides such as model=qwen3-8b recipe.optim.lr=1e-6",
    )


def _file_error(path: str, message: str, fix: str) -> UserError:
    return UserError(
        [Issue(key="FILE", value=path, message=message, fix=fix, location=Location(file=path))],
        title="command-line error",
    )


def _shadowing(group: str, file: Path, config_dir: str) -> None:
    """Hydra searches conf/ first: a user file named like a shipped one is never loaded."""
    shipped = find_config(search_roots()[:1], f"{group}/{file.stem}")
    if shipped is not None and Path(str(shipped)).resolve() != file.resolve():
        raise _file_error(
            str(file),
            f"rlpost ships {display_path(shipped)} under the same name, and Hydra searches "
            f"the shipped configs before {config_dir}, so this file would never be loaded",
            f"rename it (and its `name:`), e.g. {group}/my_{file.stem}.yaml; to build on the "
            f"shipped one, start it with `defaults: [{file.stem}, _self_]`",
        )


def _from_file(file: Path, config_dir: str | None, rest: Sequence[str]) -> Target:
    if not file.is_file():
        raise _file_error(str(file), "no such file", "give the path of a YAML config file")
    group = file.parent.name
    folder = str(file.parent.parent if group in GROUPS else file.parent)
    if config_dir and Path(config_dir).resolve() != Path(folder).resolve():
        raise _file_error(
            str(file),
            f"the file implies the config dir {folder}, but --config-dir is {config_dir}",
            "drop --config-dir (the file's folder is used), or pass the file as an override",
        )
    if group in GROUPS:
        _shadowing(group, file, folder)
        return Target((f"{group}={file.stem}", *rest), config_dir=folder)
    _primary_shadowing(file)
    return Target(tuple(rest), config_dir=folder, config_name=file.stem)


def _primary_shadowing(file: Path) -> None:
    """A primary config named like a shipped one (a run's own config.yaml is) would be read
    from conf/ instead, and the command would report on the shipped config."""
    shipped = find_config(search_roots()[:1], file.stem)
    if shipped is not None and Path(str(shipped)).resolve() != file.resolve():
        copy = f"{file.resolve().parent.name or 'my'}_{file.stem}.yaml"
        fix = f"copy it under another name and pass the copy (cp {file} {copy})"
        if _is_run_dir(file.parent):
            fix += f"; for how the run's launches ended, rlpost status {file.parent}"
        raise _file_error(
            str(file),
            f"rlpost ships {display_path(shipped)} under the same name, and Hydra searches "
            "the shipped configs first, so that file would be read in place of this one",
            fix,
        )


def _is_run_dir(folder: Path) -> bool:
    """A folder a launch wrote its launches.jsonl in, as `rlpost status` asks of its RUN_DIR."""
    from rlpost.runtime.rundir import LAUNCHES_FILE

    return (folder / LAUNCHES_FILE).is_file()


def _run_dir_error(folder: str) -> UserError:
    """A run directory where a config or override was expected: compose what it ran with, or
    ask `rlpost status` how its launches went."""
    config = Path(folder) / "config.yaml"
    copy = f"{Path(folder).resolve().name or 'my'}_config.yaml"
    return _file_error(
        folder,
        "this is a run directory, and the command composes a config from a YAML file "
        "and overrides, not from a run's folder",
        f"for how the run's launches ended and what run.resume=auto would do next, rlpost "
        f"status {folder}; for the config it ran with, copy it under another name and pass "
        f"the copy (cp {config} {copy})",
    )


def resolve_target(
    items: Sequence[str], config_dir: str | None = None, config_name: str | None = None
) -> Target:
    """Split `items` into at most one YAML file and overrides; see the module docstring."""
    for item in items:
        if "=" not in item and _is_run_dir(Path(item).expanduser()):
            raise _run_dir_error(item)
    files = [item for item in items if item.endswith(YAML_SUFFIXES) and "=" not in item]
    rest = [item for item in items if item not in files]
    if len(files) > 1:
        raise _file_error(files[1], "only one YAML file can be composed at a time", "pass one file")
    if files and config_name:
        raise _file_error(
            files[0], "a FILE and --config-name both name the primary config", "pass one of them"
        )
    if files:
        return _from_file(Path(files[0]), config_dir, rest)
    return Target(tuple(rest), config_dir=config_dir, config_name=config_name or PRIMARY_CONFIG)


def target_from_args(args: argparse.Namespace) -> Target:
    return resolve_target(args.items, args.config_dir, args.config_name)
