"""What the peers' tables share: a row (a peer's key or flag and rlpost's answer), the value
conversions more than one peer needs, and the Issue a row gives.

A peer is another trainer whose users bring their habits to the launcher: verl's and NeMo-RL's
keys (Hydra/OmegaConf overrides), slime's, OpenRLHF's and TRL's flags. Each table answers a
key with rlpost's key and the override to write, the value converted where the two count
differently, or says that rlpost has no such setting, what it does instead, and to drop it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlpost.config.override_values import hydra_value, shell_value
from rlpost.errors import Issue, Location

Line = Mapping[str, Any]  # the peer's keys on this command line and their values
Pairs = tuple[tuple[str, Any], ...]
# (the value, the line) -> the (key, value) pairs to write; () to drop the key; None when the
# value cannot be converted from what the line says (the row's `how` says how to compute it)
Convert = Callable[[Any, Line], Pairs | None]
HIDDEN = "***"


@dataclass(frozen=True)
class PeerRow:
    """One of a peer's keys (or flags: `aliases` are its other spellings) and rlpost's answer:
    its key (None: rlpost has none), what differs, and `convert`, which turns the peer's value
    into the overrides to write."""

    name: str
    key: str | None
    note: str
    convert: Convert | None = None
    how: str = ""  # the fix where `convert` cannot convert the value
    example: Any = None  # a value from the peer's scripts that converts to a valid override
    aliases: tuple[str, ...] = ()
    secret: bool = False  # the value is a credential: never shown

    def pairs(self, value: Any, line: Line) -> Pairs | None:
        if self.key is None:
            return ()
        return ((self.key, value),) if self.convert is None else self.convert(value, line)


def choice(key: str, choices: Mapping[Any, Any]) -> Convert:
    """The peer's value through `choices`; a value with no counterpart converts to nothing."""
    return lambda value, line: ((key, choices[value]),) if value in choices else None


def switch(key: str, on: Any = True, off: Any = None) -> Convert:
    """A peer's boolean as rlpost's value `on`; false writes `off`, or drops the key."""
    return lambda value, line: ((key, on),) if value else (() if off is None else ((key, off),))


def every(key: str) -> Convert:
    """A frequency in rollouts, <= 0 for never; rlpost's intervals: null for never."""
    return lambda value, line: ((key, value if value > 0 else None),)


def untruncated(off: Any) -> Convert:
    """top_p / top_k for rollouts: rlpost samples them untruncated (the trainer scores the
    full softmax), so only the no-cut value converts."""
    return lambda value, line: () if value in (off, None) else None


def static_micro_batch(value: Any, line: Line) -> Pairs:
    train = "recipe.train"
    return (
        (f"{train}.use_dynamic_batch_size", False),
        (f"{train}.max_tokens_per_gpu", None),
        (f"{train}.micro_batch_size", value),
    )


def token_cap(value: Any, line: Line) -> Pairs:
    return (
        ("recipe.train.use_dynamic_batch_size", True),
        ("recipe.train.max_tokens_per_gpu", value),
    )


def recompute(value: Any, line: Line) -> Pairs:
    return (("layout.train.recompute.granularity", "full" if value else "none"),)


def written(pairs: Pairs) -> str:
    """The pairs as overrides on a shell's command line."""
    return " ".join(f"{key}={shell_value(value)}" for key, value in pairs)


def overrides(pairs: Pairs) -> list[str]:
    """The pairs as the launcher's overrides (unquoted for the shell)."""
    return [f"{key}={hydra_value(value)}" for key, value in pairs]


@dataclass(frozen=True)
class Reading:
    """What one peer's row makes of a key or flag: the message's clauses and the fix."""

    peer: str
    what: str  # "rlpost's key for it is K (note)", or "rlpost has no setting for it: ..."
    fix: str


def read_row(peer: str, row: PeerRow, value: Any, line: Line) -> Reading:
    """The reading of `row` given `value` (HIDDEN for a credential's: never converted)."""
    if row.key is None:
        return Reading(peer, f"rlpost has no setting for it: {row.note}", "drop it")
    pairs = None if value == HIDDEN else row.pairs(value, line)
    note = f" ({row.note})" if row.note else ""
    if pairs is None:
        fix = row.how or f"write {row.key}=VALUE"
    elif not pairs:
        fix = "drop it: with this value (and the rest of this command line) it changes nothing"
    else:
        fix = f"write {written(pairs)}"
    return Reading(peer, f"rlpost's key for it is {row.key}{note}", fix)


def readings_issue(
    name: str, kind: str, readings: Sequence[Reading], shown: Any, token: str, tail: str = ""
) -> Issue:
    """One Issue for `name` (a key or flag, `kind`) as one or more peers read it: where every
    peer's reading gives the same fix, one answer naming them all; else each reading."""
    where = Location(override=token)
    peers = " and ".join(dict.fromkeys(r.peer for r in readings))
    head = f"{name} is {peers}'s {kind}{tail}"
    if len({r.fix for r in readings}) == 1:
        first = readings[0]
        joint = "; " if first.what.startswith("rlpost's key") else ", and "
        return Issue(
            key=name,
            value=shown,
            message=f"{head}{joint}{first.what}",
            fix=first.fix,
            location=where,
        )
    each = "; ".join(f"as {r.peer}'s, {r.what}" for r in readings)
    fix = "; ".join(f"as {r.peer}'s: {r.fix}" for r in readings)
    return Issue(
        key=name,
        value=shown,
        message=f"{head}, and they read it differently: {each}",
        fix=f"{fix} (whichever you meant)",
        location=where,
    )
