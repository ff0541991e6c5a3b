"""`rlpost show`: the resolved run config as YAML, each value commented with where it was set.

    model:
      name: qwen3-4b                 # conf/model/qwen3-4b.yaml:1
    recipe:
      rollout:
        temperature: 0.8             # my_configs/recipe/my_grpo.yaml:11
        top_p: 1.0                   # conf/recipe/grpo_dapo.yaml:19
    trainer:
      backend: auto                  # default

Values are the validated ones (interpolations resolved, schema defaults filled in); the
comment is the YAML file and line that set each, `command line: ...` for an override, or
`default` for the schema's own value. In a mode=eval config, a value only training reads
(rlpost.schema.training_only) says so: `# conf/recipe/grpo_dapo.yaml:40; unread by mode=eval`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any

from rlpost.cli.target import add_target_arguments, target_from_args
from rlpost.cli.yaml_text import keyed_block_lines
from rlpost.config.loader import compose_run_config
from rlpost.config.overrides import refuse_sweeps
from rlpost.config.sources import SourceMap
from rlpost.errors import Issue, UserError
from rlpost.schema import RunConfig
from rlpost.schema.training_only import training_only

HELP = "print the resolved config, each value with the file and line (or override) that set it"
COMMENT_COLUMN_MAX = 56


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    parser.add_argument("--only", metavar="KEY", help="show one section only, e.g. recipe.rollout")


def _subtree(data: Mapping[str, Any], key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise UserError(
                [
                    Issue(
                        key="--only",
                        value=key,
                        message=f"the resolved config has no section '{key}'",
                        fix=f"use one of: {', '.join(data)} (or a dotted key inside one)",
                    )
                ],
                title="command-line error",
            )
        node = node[part]
    return node


UNREAD_BY_EVAL = "unread by mode=eval"


def annotate(
    data: Mapping[str, Any],
    sources: SourceMap,
    base: str = "",
    unread: Callable[[str], bool] = lambda path: False,
) -> list[str]:
    """Block YAML lines of `data`, with `# source` on every line that holds a value, and
    `; unread by mode=eval` where `unread` says so of the value's dotted path."""

    def comment(path: str) -> str:
        where = str(sources.get(path))
        return f"{where}; {UNREAD_BY_EVAL}" if unread(path) else where

    lines = keyed_block_lines(data, base)
    width = min(max((len(text) for text, _ in lines), default=0), COMMENT_COLUMN_MAX) + 2
    return [
        f"{text.ljust(max(width, len(text) + 2))}# {comment(path)}" if path is not None else text
        for text, path in lines
    ]


def render(run: RunConfig, sources: SourceMap, only: str | None = None) -> str:
    data = run.model_dump(mode="json")

    def unread(path: str) -> bool:
        return run.mode == "eval" and training_only(path) is not None

    if only:
        base, _, leaf = only.rpartition(".")
        return "\n".join(annotate({leaf: _subtree(data, only)}, sources, base, unread))
    return "\n".join(annotate(data, sources, unread=unread))


def run(args: argparse.Namespace) -> int:
    target = target_from_args(args)
    refuse_sweeps(
        target.overrides,
        "rlpost show prints one run's config",
        "show one value at a time ({first}); python launch.py -m mode=plan {token} checks "
        "and plans every job",
    )
    config, sources = compose_run_config(
        target.overrides, config_dir=target.config_dir, config_name=target.config_name
    )
    print(render(config, sources, args.only))
    return 0
