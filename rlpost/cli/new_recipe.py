"""`rlpost new recipe NAME --from BASE KEY=VALUE...`: a recipe holding only its differences.

    rlpost new recipe my_grpo --from grpo_dapo rollout.max_response_len=4096 optim.lr=2e-6 \\
        --config-dir my_configs                   # -> my_configs/recipe/my_grpo.yaml

The file starts with `defaults: [BASE, _self_]`, so everything else stays BASE's and follows
it when BASE changes. Keys are checked against the schema (did-you-mean on a typo), values
equal to BASE's are dropped, and the merged recipe is validated before anything is written.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlpost.cli.new_model import (
    add_output_arguments,
    check_name,
    output_path,
    use_line,
    write_text,
)
from rlpost.cli.yaml_text import block_lines, scalar_text
from rlpost.config.overrides import search_roots
from rlpost.config.sources import SourceMap, group_options
from rlpost.errors import Issue, Location, UserError, did_you_mean

HELP = "write a recipe that extends another one with only the differences"
DESCRIPTION_MAX = 100


@dataclass(frozen=True)
class Change:
    """One KEY=VALUE, relative to the recipe section."""

    key: str
    value: Any
    token: str


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the new recipe's name")
    parser.add_argument(
        "--from", dest="base", required=True, metavar="BASE", help="recipe to extend"
    )
    parser.add_argument(
        "changes", nargs="*", metavar="KEY=VALUE", help="recipe keys to change, e.g. optim.lr=2e-6"
    )
    parser.add_argument("--description", help="one line (default: BASE plus the changes)")
    add_output_arguments(parser, "recipe")


def _command_line_error(issues: Sequence[Issue]) -> UserError:
    return UserError(issues, title="command-line error")


def _check_base(base: str, config_dir: str | None) -> None:
    options = group_options(search_roots(config_dir), "recipe")
    if base in options:
        return
    raise _command_line_error(
        [
            Issue(
                key="--from",
                value=base,
                message=f"no recipe '{base}' on the search path.{did_you_mean(base, options)}",
                fix=f"choose one of: {', '.join(options)}",
                location=Location(override=f"--from {base}"),
            )
        ]
    )


def parse_changes(tokens: Sequence[str]) -> list[Change]:
    """KEY=VALUE tokens (KEY relative to recipe, or starting with 'recipe.'), schema-checked."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from rlpost.config.keys import find_unknown

    parser, issues = OverridesParser.create(), []
    changes: list[Change] = []
    for token in tokens:
        where = Location(override=token)
        try:
            parsed = parser.parse_override(token.lstrip("+"))
        except HydraException as exc:
            issues.append(
                Issue(
                    token,
                    f"cannot parse it: {str(exc).splitlines()[0]}",
                    "write KEY=VALUE, e.g. optim.lr=2e-6",
                    location=where,
                )
            )
            continue
        key = parsed.key_or_group.removeprefix("recipe.")
        if parsed.is_delete() or parsed.is_sweep_override():
            issues.append(
                Issue(
                    key,
                    "a recipe file can only set values",
                    "write KEY=VALUE (null to clear a value)",
                    location=where,
                )
            )
            continue
        unknown = find_unknown(f"recipe.{key}")
        if unknown is not None:
            issues.append(
                Issue(
                    unknown.path,
                    unknown.describe(),
                    unknown.fix(),
                    value=parsed.value(),
                    location=where,
                )
            )
            continue
        earlier = next((c for c in changes if c.key == key), None)
        if earlier is not None:  # the last wins, as on the launcher's command line
            changes.remove(earlier)
            if earlier.value != parsed.value():
                print(
                    f"rlpost: note: {key} is given twice, {earlier.token} and then {token}: "
                    "the recipe holds the last",
                    file=sys.stderr,
                )
        changes.append(Change(key, parsed.value(), token))
    if issues:
        raise _command_line_error(issues)
    return changes


def _compose_base(base: str, config_dir: str | None) -> Any:
    """The composed run config with `recipe=base` (other groups at their defaults)."""
    import yaml
    from hydra import compose
    from hydra.errors import HydraException

    from rlpost.config.resolvers import register_resolvers
    from rlpost.config.search_path import composition_issues, hydra_session

    register_resolvers()
    with hydra_session(config_dir):
        try:
            return compose("config", overrides=[f"recipe={base}"])
        except (HydraException, OSError, yaml.YAMLError) as exc:
            raise UserError(composition_issues(exc, search_roots(config_dir))) from None


def _differences(cfg: Any, changes: Sequence[Change]) -> list[Change]:
    """The changes whose value is not already the base's."""
    from omegaconf import OmegaConf

    from rlpost.config.diagnostics import value_at

    base = OmegaConf.to_container(cfg.recipe, resolve=False)
    return [c for c in changes if value_at(base, c.key) != c.value]


class _RecipeErrors:
    """A recipe ValidationError seen from the run config's root (locations under 'recipe')."""

    def __init__(self, exc: Any) -> None:
        self.exc = exc

    def errors(self) -> list[Any]:
        return [{**err, "loc": ("recipe", *err["loc"])} for err in self.exc.errors()]


def validate_merged(cfg: Any, name: str, description: str, changes: Sequence[Change]) -> None:
    """The base with `changes` applied must validate as a recipe."""
    from omegaconf import OmegaConf
    from pydantic import ValidationError

    from rlpost.config.diagnostics import issues_from_validation_error
    from rlpost.schema import RecipeConfig

    for change in [Change("name", name, ""), Change("description", description, ""), *changes]:
        OmegaConf.update(cfg, f"recipe.{change.key}", change.value, force_add=True)
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    try:
        RecipeConfig.model_validate(data["recipe"])
    except ValidationError as exc:
        where = {f"recipe.{c.key}": Location(override=c.token) for c in changes}
        issues = issues_from_validation_error(_RecipeErrors(exc), data, SourceMap(where))  # type: ignore[arg-type]
        raise UserError(issues) from None


def nest(changes: Sequence[Change]) -> dict[str, Any]:
    """Dotted keys as nested mappings, in the order given."""
    tree: dict[str, Any] = {}
    for change in changes:
        *parents, leaf = change.key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = change.value
    return tree


def default_description(base: str, changes: Sequence[Change]) -> str:
    if not changes:
        return f"a copy of {base}"
    text = f"{base} with " + ", ".join(f"{c.key}={scalar_text(c.value)}" for c in changes)
    return text if len(text) <= DESCRIPTION_MAX else text[: DESCRIPTION_MAX - 3] + "..."


def render_recipe_yaml(
    name: str, base: str, description: str, changes: Sequence[Change], show: str | None = None
) -> str:
    """`show`: the command that shows the recipe whole (use_line), where its file is known."""
    show = show or f"rlpost show --config-dir <dir> recipe={name} model=... hardware=..."
    lines = [
        f"# {name}: only what differs from {base}; every other value is {base}'s (see them",
        f"# with `{show}`).",
        "defaults:",
        f"  - {base}",
        "  - _self_",
        "",
        *block_lines({"name": name, "description": description}),
    ]
    tree = nest(changes)
    for section, values in tree.items():
        lines += ["", *block_lines({section: values})]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    from rlpost.config.search_path import check_config_dir

    name = check_name(args.name, "recipe")
    # A config dir not there yet holds no base to read: it is made for the file written, as
    # `rlpost new model` and `rlpost new hardware` make theirs (a file there is refused).
    reads = args.config_dir if args.config_dir and Path(args.config_dir).exists() else None
    check_config_dir(reads)
    _check_base(args.base, reads)
    changes = parse_changes(args.changes)
    cfg = _compose_base(args.base, reads)
    kept = _differences(cfg, changes)
    description = args.description or default_description(args.base, kept)
    validate_merged(cfg, name, description, kept)
    path = output_path(args.out, args.config_dir, "recipe", name)
    # the model and hardware it is shown with (the run's defaults may not fit the recipe)
    show = f"{use_line(path, 'recipe', 'rlpost show')} model=... hardware=..." if path else None
    write_text(path, render_recipe_yaml(name, args.base, description, kept, show), args.force)
    if path is not None:
        dropped = len(changes) - len(kept)
        note = f" ({dropped} change(s) equal to {args.base}'s were left out)" if dropped else ""
        print(f"wrote {path}: {description}{note}")
        print(f"see it whole: {show}")
    return 0
