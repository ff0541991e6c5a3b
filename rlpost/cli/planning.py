"""A composed run's plan, with each refusal located where its key was set: what the launcher,
`rlpost validate`, the sweep check and the schedulers' scripts share."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from rlpost.config.diagnostics import attach_locations
from rlpost.config.sources import SourceMap
from rlpost.errors import UserError
from rlpost.schema import RunConfig

if TYPE_CHECKING:
    from rlpost.plan import Plan


def plan_run(cfg: RunConfig, sources: SourceMap) -> tuple[RunConfig, Plan]:
    """The config (with the searched layout written in, for layout=auto) and its plan, with
    each planning Issue located where its key was set."""
    from rlpost.plan import plan_config

    with located(sources):
        return plan_config(cfg)


@contextlib.contextmanager
def located(sources: SourceMap) -> Iterator[None]:
    """Every Issue of a UserError raised inside gets the place its key was set."""
    try:
        yield
    except UserError as exc:
        issues = attach_locations(exc.issues, sources)
        raise UserError(issues, title=exc.title, note=exc.note) from None
