"""Planning: pure functions from a validated RunConfig to a frozen Plan.

Imports only the standard library, pydantic and rlpost.schema/errors, so `mode=plan` stays
fast and runs anywhere.
"""

from rlpost.plan.plan import Plan, build_plan
from rlpost.plan.render import render_plan
from rlpost.plan.slime_args import render_slime_args, slime_arg_groups

__all__ = ["Plan", "build_plan", "render_plan", "render_slime_args", "slime_arg_groups"]
