"""A run asked to stop: SIGTERM, what a scheduler's time limit or preemption, `docker stop`,
Kubernetes or `kill` sends before it kills.

`run.on_sigterm: save` (the default): the run takes no new rollout, writes a checkpoint of
every rollout it has finished and ends. While the trainer waits for generation the save
starts at once (the rollout being generated is generated again on resume: its groups are in
the checkpoint as prompts to draw first); while a rollout trains, the run lets it finish (its
evaluation too, when one is due: the rollout's record holds it), skips the weight push
nothing needs any more, logs it and saves it (the run's last rollout ends the run as usual).
`stop`: the run ends at once (as Ctrl-C does) and keeps the checkpoints it has. A second
SIGTERM always ends it at once; a save cut short leaves a `tmp-` folder that resuming
ignores. Either way the launch exits with status 143 (128 + SIGTERM, what a shell reports
for a process SIGTERM ended) and says how to continue.

The handler is the event loop's (`loop.add_signal_handler`), installed again once Ray has
started: Ray's driver installs a handler of its own that prints a stack dump and dies.
Around it, for the whole launch (its preflight, the start of each attempt, between restarts),
SIGTERM raises Terminated, which the launcher reports the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from rlpost.runtime.progress import status

EXIT_STOPPED = 128 + signal.SIGTERM


class Terminated(BaseException):
    """SIGTERM outside the train loop's own handling: the launch ends where it is."""


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise Terminated


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Inside, SIGTERM raises Terminated in the main thread (its default would end the process
    with no word); elsewhere, and in other threads, nothing changes."""
    try:
        before = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


class HeldSignals:
    """Ctrl-C and SIGTERM held while code that must not be cut short runs (a sweep's own
    steps between its jobs: Hydra composing the next job's config, the summary written after
    one; a KeyboardInterrupt in the middle of composing a config left it broken, which Hydra
    reported as its own error and exit 1), and raised once the launch's own code runs again
    (`release`): KeyboardInterrupt, or Terminated for SIGTERM. A signal the process ignores
    (SIG_IGN, as for a command started in the background) stays ignored."""

    def __init__(self) -> None:
        self.pending: int | None = None  # the first signal held
        self._before: dict[int, Any] = {}

    def hold(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            before = signal.getsignal(sig)
            if before == self._record:  # already held
                continue
            self._before[sig] = before
            if before is not signal.SIG_IGN:
                signal.signal(sig, self._record)

    def release(self) -> None:
        """The handlers from before `hold` again; a signal held meanwhile is raised now."""
        pending = self.restore()
        if pending == signal.SIGINT:
            raise KeyboardInterrupt
        if pending == signal.SIGTERM:
            raise Terminated

    def restore(self) -> int | None:
        """The handlers from before `hold` again, raising nothing: the signal held meanwhile,
        if any (the launch is ending: it has said how)."""
        if threading.current_thread() is not threading.main_thread():
            return None
        for sig, before in self._before.items():
            signal.signal(sig, before)
        self._before.clear()
        pending, self.pending = self.pending, None
        return pending

    def _record(self, signum: int, frame: FrameType | None) -> None:
        if self.pending is None:
            self.pending = signum


class StopRequested(Exception):
    """Raised where a train step stops for the signal before taking its batch."""


class Stopped(Exception):
    """The loop has stopped for the signal: `done` rollouts are finished, and the checkpoint
    it saved for them (None: nothing new to save, or the disk refused it). `waiting`: what
    of the last rollout the resumed run does first (its evaluation, its HF export), if any."""

    def __init__(self, done: int, saved: Path | None, waiting: tuple[str, ...] = ()) -> None:
        super().__init__(f"stopped after rollout {done}")
        self.done, self.saved, self.waiting = done, saved, waiting


class StopSignal:
    """SIGTERM for one launch: the first asks the train loop to save and stop (`save`, once
    the loop accepts it) or cancels the launch's task (`stop`, before the loop runs, or a
    second SIGTERM)."""

    def __init__(self, on_sigterm: Literal["save", "stop"]) -> None:
        self.on_sigterm = on_sigterm
        self.received = 0
        self.requested = asyncio.Event()
        self._accepting = False
        self._wake: list[Callable[[], None]] = []
        self._task: asyncio.Task[object] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._before: Any = None  # the handler SIGTERM had, given back by uninstall

    @property
    def signalled(self) -> bool:
        return self.received > 0

    def install(self) -> None:
        """Handle SIGTERM in this event loop, cancelling the current task when it must end at
        once. Again after Ray starts (its handler replaces this one). Only the main thread
        can; elsewhere SIGTERM keeps its default."""
        loop = asyncio.get_running_loop()
        self._task = self._task or asyncio.current_task()
        if self._loop is None:
            self._before = signal.getsignal(signal.SIGTERM)
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            loop.add_signal_handler(signal.SIGTERM, self._on_signal)
            self._loop = loop

    def uninstall(self) -> None:
        """SIGTERM's handler as it was before `install` (Python's view of it)."""
        if self._loop is not None:
            with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
                self._loop.remove_signal_handler(signal.SIGTERM)
                signal.signal(signal.SIGTERM, self._before or signal.SIG_DFL)
            self._loop = None

    def accept(self, wake: Callable[[], None]) -> None:
        """The train loop runs: a first SIGTERM now asks it to save and stop, and `wake`
        ends the wait it may be in (for generation)."""
        self._accepting = True
        self._wake.append(wake)

    def _on_signal(self) -> None:
        self.received += 1
        if self.received == 1 and self.on_sigterm == "save" and self._accepting:
            status(
                "SIGTERM: saving a checkpoint of every finished rollout, then stopping "
                "(SIGTERM again: stop at once)"
            )
            self.requested.set()
            for wake in self._wake:
                wake()
            return
        if self.received == 1 and self.on_sigterm == "save":
            # nothing trained since this attempt began: its checkpoint holds all there is
            status("SIGTERM while the run starts: nothing new to save; stopping at once")
        else:
            status("SIGTERM: stopping at once")
        if self._task is not None:
            self._task.cancel()
