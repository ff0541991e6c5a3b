"""`layout=auto`'s choice: the fastest candidate that plans in full, written into the run's
config, and the keys the search filled in."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rlpost.errors import Issue, UserError
from rlpost.plan.candidates import Candidate, LayoutSearch, layout_overrides
from rlpost.plan.checks import generic_model_issues
from rlpost.plan.fsdp import FSDP_OFFLOAD_KEY
from rlpost.plan.nothing_fits import nothing_fits
from rlpost.plan.reference import shipped_reference
from rlpost.plan.search import search_layout
from rlpost.plan.search_space import with_adam
from rlpost.schema import RunConfig


def searched_keys(cfg: RunConfig, chosen: Candidate) -> tuple[str, ...]:
    """The key paths the search filled in: null in the layout (and where Adam runs)."""
    data: Any = cfg.model_dump()
    found = []
    for path in layout_overrides(chosen):
        node = data
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is None or path in ("recipe.optim.cpu_offload", FSDP_OFFLOAD_KEY):
            found.append(path)
    return tuple(found)


def _set(data: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value


def apply_choice(cfg: RunConfig, chosen: Candidate) -> RunConfig:
    """The run's config with the chosen layout written into it (and Adam where chosen)."""
    data = with_adam(cfg, chosen.train.cpu_offload).model_dump()
    for path, value in layout_overrides(chosen).items():
        _set(data, path, value)
    return RunConfig.model_validate(data)


def choose_layout(cfg: RunConfig) -> tuple[RunConfig, LayoutSearch]:
    """The config with the fastest layout that plans written in, and the search; UserError
    when nothing fits (saying what would)."""
    from rlpost.plan.plan import build_plan

    unsearchable = generic_model_issues(cfg)  # no layout changes which trainer builds the model
    if unsearchable:
        raise UserError(unsearchable, title="planning error")
    search = search_layout(cfg, shipped_reference(cfg))
    refused: list[Issue] = []
    for candidate in search.ranked:
        try:
            chosen = apply_choice(cfg, candidate)
            build_plan(chosen)
        except UserError as exc:  # a rule that reads both sides at once
            refused.extend(exc.issues)
            continue
        except ValueError as exc:  # the config refuses the combination
            refused.append(Issue("layout", f"{candidate.describe()}: {exc}", "", "auto"))
            continue
        if candidate is not search.chosen:
            search = replace(search, chosen=candidate)
        return chosen, search
    if refused:
        raise UserError(refused, title="planning error")
    raise nothing_fits(search)
