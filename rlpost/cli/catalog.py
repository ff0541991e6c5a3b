"""`rlpost ls`: every model, recipe, hardware profile and layout on the search path.

    model
      glm4-9b       shipped        GLM-Z1-9B-0414 (GLM-4 9B dense; qkv bias, ...)
      my-model      my_configs     Qwen3-8B fine-tuned on ...
    recipe
      my_grpo       my_configs     grpo_dapo with 4k responses (extends grpo_dapo)

A description is the file's `description:` (under `layout:` for layouts), else its first
comment line. A user file named like a shipped one is flagged: Hydra searches conf/ first and
never loads it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from rlpost.cli.target import GROUPS, add_config_dir_argument
from rlpost.config.overrides import search_roots
from rlpost.config.search_path import primary_searchpath
from rlpost.config.sources import CONF_DIR, PRIMARY_CONFIG, ConfigRoot, display_path
from rlpost.errors import Issue, UserError, did_you_mean

HELP = "list the models, recipes, hardware profiles and layouts, shipped and your own"
SHIPPED = "shipped"


@dataclass(frozen=True)
class ConfigEntry:
    """One config file: its group and name, where it lives, and what it is."""

    group: str
    name: str
    origin: str
    description: str
    shadowed: bool = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_dir_argument(parser)
    parser.add_argument(
        "--config-name",
        "-cn",
        metavar="NAME",
        help="primary config whose hydra.searchpath adds folders (default: config)",
    )
    parser.add_argument("groups", nargs="*", metavar="GROUP", help=f"any of {', '.join(GROUPS)}")


def _leading_comment(text: str) -> str:
    """The first sentence of the comment block a file opens with."""
    block: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped.startswith("#"):
            if block or stripped:
                break
            continue
        if "@package" not in stripped:
            block.append(stripped.lstrip("#").strip())
    paragraph = " ".join(block)
    end = paragraph.find(". ")
    return paragraph[: end + 1] if end >= 0 else paragraph


def _extends(data: dict[str, Any]) -> str:
    bases = [
        str(item)
        for item in data.get("defaults") or []
        if isinstance(item, str) and item != "_self_"
    ]
    return f"extends {', '.join(bases)}" if bases else ""


def describe(text: str, group: str) -> str:
    """One line about a config file's content."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return f"(not valid YAML: {str(exc).splitlines()[0]})"
    data = data if isinstance(data, dict) else {}
    section: dict[str, Any] = data[group] if isinstance(data.get(group), dict) else data
    own = section.get("description") or data.get("description") or _leading_comment(text)
    extends = _extends(data)
    if own and extends:
        return f"{own} ({extends})"
    return str(own or extends or "(no description)")


def _origin(root: ConfigRoot) -> str:
    if root.scheme == "file" and root.path == str(CONF_DIR.resolve()):
        return SHIPPED
    return display_path(root.path) if root.scheme == "file" else f"{root.scheme}://{root.path}"


def list_configs(roots: Sequence[ConfigRoot], groups: Sequence[str] = GROUPS) -> list[ConfigEntry]:
    """Every config in `groups`, in search-path order within each group, names sorted."""
    entries = []
    for group in groups:
        seen: set[str] = set()
        for root in roots:
            for name in sorted(root.options(group)):
                found = root.find(f"{group}/{name}")
                text = found.read_text(encoding="utf-8") if found is not None else ""
                entries.append(
                    ConfigEntry(group, name, _origin(root), describe(text, group), name in seen)
                )
                seen.add(name)
    return entries


def render(entries: Sequence[ConfigEntry], groups: Sequence[str]) -> str:
    name_width = max((len(e.name) for e in entries), default=0)
    origin_width = max((len(e.origin) for e in entries), default=0)
    lines = []
    for group in groups:
        lines.append(group)
        members = [e for e in entries if e.group == group]
        if not members:
            lines.append(f"  (none: add {group}/<name>.yaml to a config dir)")
        for e in members:
            note = "  [never loaded: a shipped config has this name]" if e.shadowed else ""
            lines.append(
                f"  {e.name.ljust(name_width)}  {e.origin.ljust(origin_width)}  "
                f"{e.description}{note}"
            )
    return "\n".join(lines)


def _check_groups(groups: Sequence[str]) -> None:
    issues = [
        Issue(
            key="GROUP",
            value=group,
            message=f"no config group '{group}'.{did_you_mean(group, GROUPS)}",
            fix=f"use any of: {', '.join(GROUPS)}",
        )
        for group in groups
        if group not in GROUPS
    ]
    if issues:
        raise UserError(issues, title="command-line error")


def run(args: argparse.Namespace) -> int:
    from rlpost.config.search_path import check_config_dir, check_config_name

    groups = list(args.groups) or list(GROUPS)
    _check_groups(groups)
    check_config_dir(args.config_dir)
    base = search_roots(args.config_dir)
    check_config_name(args.config_name, base)
    roots = search_roots(
        args.config_dir, searchpath=primary_searchpath(base, args.config_name or PRIMARY_CONFIG)
    )
    print(render(list_configs(roots, groups), groups))
    return 0
