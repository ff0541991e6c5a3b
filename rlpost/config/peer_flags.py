"""The peers' flags on a launch's command line (OpenRLHF's, TRL's, and slime's spelt with
underscores): whose a flag is, and the Issue that answers it with rlpost's key.

TRL's parser takes a field with underscores or hyphens, OpenRLHF's with underscores, slime's
with hyphens, so a flag is looked up by its name with underscores in OpenRLHF's and TRL's
tables, and with hyphens in slime's. Where more than one reads it (--rollout_batch_size:
OpenRLHF's and slime's --rollout-batch-size), one answer where the fixes agree, each reading
where they differ (--advantage_estimator group_norm).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from rlpost.config import openrlhf_flags, trl_flags
from rlpost.config.peer_rows import HIDDEN, PeerRow, Reading, read_row, readings_issue
from rlpost.errors import Issue


def _index(table: Sequence[PeerRow]) -> dict[str, PeerRow]:
    return {name: row for row in table for name in (row.name, *row.aliases)}


# (the peer, its flags, whether its parser takes them with hyphens too)
PEERS: tuple[tuple[str, dict[str, PeerRow], bool], ...] = (
    ("OpenRLHF", _index(openrlhf_flags.TABLE), False),
    ("TRL", _index(trl_flags.TABLE), True),
)


def canonical(flag: str) -> str:
    """--rollout-batch-size and --rollout_batch_size alike: rollout_batch_size."""
    return flag.lstrip("-").replace("-", "_")


def value_of(values: Sequence[str]) -> Any:
    """A flag's values as one value: none is a switch (true), several a list."""
    try:
        read = [yaml.safe_load(v) for v in values]
    except yaml.YAMLError:
        read = list(values)
    return True if not read else read[0] if len(read) == 1 else read


def peer_rows(flag: str) -> list[tuple[str, PeerRow]]:
    """The peers whose parser takes `flag` as written (a hyphenated one: TRL's only)."""
    name, hyphenated = canonical(flag), "-" in flag.lstrip("-")
    return [
        (peer, rows[name])
        for peer, rows, hyphens in PEERS
        if name in rows and (hyphens or not hyphenated)
    ]


def flag_line(flags: Sequence[tuple[str, list[str]]]) -> dict[str, Any]:
    """The peers' flags on the command line by their rows' first names, with their values."""
    line: dict[str, Any] = {}
    for flag, values in flags:
        for _, row in peer_rows(flag):
            line[row.name] = value_of(values)
    return line


def _slime_reading(issue: Issue) -> Reading:
    what = issue.message.split("not flags", 1)[-1].lstrip(",; ").removeprefix("and ")
    return Reading("slime", what, issue.fix)


def peer_flag_issue(
    flag: str, values: list[str], token: str, line: dict[str, Any], slime: Issue | None
) -> Issue | None:
    """The Issue for a flag the peers read (`slime`: slime's reading of its hyphenated
    spelling, if any), or None where no peer has it."""
    found = peer_rows(flag)
    if not found:
        return None
    secret = any(row.secret for _, row in found)
    shown = HIDDEN if secret and values else value_of(values)
    given = None if not values else HIDDEN if shown == HIDDEN else " ".join(values)
    if shown == HIDDEN:
        token = f"{flag} {HIDDEN}"
    readings = [read_row(peer, row, shown, line) for peer, row in found]
    if slime is not None:
        readings.append(_slime_reading(slime))
    tail = "; rlpost takes Hydra overrides (key=value), not flags"
    return readings_issue(flag, "flag", readings, given, token, tail=tail)
