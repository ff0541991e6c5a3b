"""Awaiting one call on every train rank as a whole: a rank whose process died, or one that
does not answer within trainer.collective_timeout_s (counted from the call's last progress
where it reports some), is a RunFault that names it, instead of a driver that waits forever
on a rank stuck in a collective. Another actor's call (the reward model actor's start) is
awaited the same way, named as itself and bounded by its own key (`Awaited`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlpost.runtime.failures import RunFault, cured_by_restart, death_cause

__all__ = ["PROGRESS_POLL_S", "RANK_GRACE_S", "TRAIN_RANKS", "Awaited", "await_ranks"]

# After one rank fails, how long the others get to answer before they count as missing.
RANK_GRACE_S = 10.0


async def _awaited(ref: Any) -> Any:
    return await ref


PROGRESS_POLL_S = 5.0
"""How often a call that reports progress (`await_ranks`) is looked at."""


@dataclass(frozen=True)
class Awaited:
    """Who answers the calls awaited, as a failure names them: `part`, the RunFault's
    component; `key`, the setting whose value bounds the wait; `names`, each call's (none:
    "<part>(s) [i, ...]" by rank); `fix`, what to do when one does not answer in time;
    `logs`, each one's log under the run's logs (`actor_log`), named when it has died."""

    part: str = "train rank"
    key: str = "trainer.collective_timeout_s"
    names: tuple[str, ...] = ()
    fix: str = ""
    logs: tuple[Path, ...] = ()

    def these(self, indices: list[int]) -> str:
        if self.names:
            return " and ".join(self.names[i] for i in indices)
        return f"{self.part}(s) {indices}"

    def one(self, index: int) -> str:
        return self.names[index] if self.names else f"rank {index}"

    def logs_of(self, indices: list[int]) -> str:
        """What a fault adds after naming `indices`: the path of each one's log that exists."""
        logs = [str(self.logs[i]) for i in indices if i < len(self.logs) and self.logs[i].exists()]
        if not logs:
            return ""
        return f"; its log: {logs[0]}" if len(indices) == 1 else f"; their logs: {', '.join(logs)}"


TRAIN_RANKS = Awaited()


async def await_ranks(
    what: str,
    refs: Sequence[Awaitable[Any]],
    timeout: float,
    progress: Callable[[], int] | None = None,
    who: Awaited = TRAIN_RANKS,
) -> list[Any]:
    """Await one call on every rank, in rank order. A rank whose process died is a RunFault;
    when the others finish (or fail) and a rank still has not answered within `timeout`, it
    is named as the one that did not arrive. `progress`: a figure that changes while the
    call makes progress (the bytes a save has written); the timeout then counts from its
    last change, so a long save that keeps writing is not cut off and a stalled one is.
    `who`: whom the calls went to (the train ranks unless said), as the RunFault names them,
    and the key that `timeout` is the value of."""
    if not refs:  # no rank to ask (an evaluation of the engines' own weights has none)
        return []
    tasks = [asyncio.ensure_future(_awaited(ref)) for ref in refs]
    done, pending = await _wait_while_progressing(tasks, timeout, progress)
    failed = [t for t in done if t.exception() is not None]
    if failed and pending:  # the others are probably stuck in a collective with it
        more, pending = await asyncio.wait(pending, timeout=RANK_GRACE_S)
        done |= more
    for task in pending:
        task.cancel()
    missing = [rank for rank, t in enumerate(tasks) if t in pending]
    errors: dict[int, BaseException] = {
        rank: exc for rank, t in enumerate(tasks) if t in done and (exc := t.exception())
    }
    dead = [rank for rank, exc in errors.items() if cured_by_restart(exc)]
    if dead:
        raise RunFault(
            f"{who.these(dead)} died during {what} ({death_cause(errors[dead[0]])})"
            f"{who.logs_of(dead)}",
            component=who.part,
        ) from errors[dead[0]]
    if missing:
        reason = f"; {who.one(min(errors))} failed: {errors[min(errors)]}" if errors else ""
        since = " of its last progress" if progress is not None else ""
        fix = f"; {who.fix}" if who.fix else ""
        raise RunFault(
            f"{who.these(missing)} did not arrive: {what} did not finish within "
            f"{who.key}={timeout:g} s{since}{reason}{fix}",
            component=who.part,
        )
    if errors:
        first = min(errors)
        raise errors[first]
    return [t.result() for t in tasks]


async def _wait_while_progressing(
    tasks: list[asyncio.Task[Any]], timeout: float, progress: Callable[[], int] | None
) -> tuple[set[asyncio.Task[Any]], set[asyncio.Task[Any]]]:
    """asyncio.wait for every task (or the first exception), with `timeout` counted from the
    last change of `progress` (read off the event loop: a slow file system must not stall
    it)."""
    if progress is None:
        return await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_EXCEPTION)
    done: set[asyncio.Task[Any]] = set()
    pending: set[asyncio.Task[Any]] = set(tasks)
    seen, quiet_since = await asyncio.to_thread(progress), time.monotonic()
    while True:
        left = timeout - (time.monotonic() - quiet_since)
        finished, pending = await asyncio.wait(
            pending, timeout=max(0.0, min(PROGRESS_POLL_S, left)),
            return_when=asyncio.FIRST_EXCEPTION,
        )  # fmt: skip
        done |= finished
        if not pending or any(t.exception() is not None for t in finished):
            return done, pending
        now = await asyncio.to_thread(progress)
        if now != seen:
            seen, quiet_since = now, time.monotonic()
        elif time.monotonic() - quiet_since >= timeout:
            return done, pending
