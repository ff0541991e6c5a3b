"""An episode's own time: how long one call of a generate function has run besides waiting on
the engines.

`recipe.rollout.episode_timeout_s` bounds what nothing else bounds: the tools, environments
and whatever else a generate function awaits. Its requests to the engines are not counted:
each has `engine.request_timeout_s` and the engines' health checks, and a request may wait
long for reasons that are no hang (a free request slot in a large rollout, a weight update
pausing the engines). The clock travels with the episode's task (a context variable, which
tasks the episode starts inherit), and the group's client stops it around each request.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar


class EpisodeClock:
    """Seconds an episode ran outside its engine requests (overlapping requests of one
    episode count once)."""

    def __init__(self) -> None:
        self._own_s = 0.0
        self._since = time.monotonic()
        self._requests = 0

    def own_s(self) -> float:
        running = 0.0 if self._requests else time.monotonic() - self._since
        return self._own_s + running

    @contextlib.contextmanager
    def engine_request(self) -> Iterator[None]:
        """Around a request to the engines: its time is not the episode's own."""
        if self._requests == 0:
            self._own_s += time.monotonic() - self._since
        self._requests += 1
        try:
            yield
        finally:
            self._requests -= 1
            if self._requests == 0:
                self._since = time.monotonic()


EPISODE: ContextVar[EpisodeClock | None] = ContextVar("rlpost_episode", default=None)
"""The clock of the episode the running task belongs to (None outside a timed episode)."""


def engine_request() -> contextlib.AbstractContextManager[None]:
    """Around a request to the engines, in whichever episode makes it."""
    clock = EPISODE.get()
    return clock.engine_request() if clock is not None else contextlib.nullcontext()
