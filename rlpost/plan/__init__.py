"""Planning: pure functions from a validated RunConfig to a frozen Plan.

Imports only the standard library, pydantic and rlpost.schema/errors, so `mode=plan` stays
fast and runs anywhere.
"""

from dataclasses import replace

from rlpost.plan.plan import Plan, build_plan
from rlpost.plan.render import render_plan
from rlpost.plan.slime_args import render_slime_args, slime_arg_groups
from rlpost.schema import RunConfig


def plan_config(cfg: RunConfig) -> tuple[RunConfig, Plan]:
    """The plan of a config; with `layout.search` (layout=auto) the searched layout is written
    into the config first, and the plan carries the search."""
    if not cfg.layout.search:
        return cfg, build_plan(cfg)
    from rlpost.plan.choice import choose_layout, searched_keys

    chosen, search = choose_layout(cfg)
    plan = build_plan(chosen)
    assert search.chosen is not None
    derived = tuple(dict.fromkeys(plan.derived + searched_keys(cfg, search.chosen)))
    return chosen, replace(plan, search=search, derived=derived)


__all__ = [
    "Plan",
    "build_plan",
    "plan_config",
    "render_plan",
    "render_slime_args",
    "slime_arg_groups",
]
