"""The decoding thread: a queue of waiting rows, batches taken between runs, control jobs
run at safe points, abort by rid prefix, and pause/continue.

Control jobs (weight updates, memory release) run on the decoding thread itself, so they
never overlap a forward pass: between batches, or between steps while paused in place.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from rlpost.backends.cpu_engine.generator import BatchGenerator
from rlpost.backends.cpu_engine.row import FinishReason, Row
from rlpost.backends.cpu_engine.sampling import RequestError

logger = logging.getLogger(__name__)
T = TypeVar("T")
SHUTTING_DOWN = "the engine is shutting down"


@dataclass(frozen=True)
class Load:
    num_running: int
    num_waiting: int
    num_tokens: int
    num_served: int


class Scheduler:
    """Admits waiting rows into batches of at most `max_batch_size` and decodes them."""

    def __init__(
        self, generator: BatchGenerator, max_batch_size: int, batch_wait_s: float = 0.005
    ) -> None:
        self._generator = generator
        self._max_batch_size = max_batch_size
        # A short wait before starting a small batch lets requests that arrive together
        # (a rollout sends hundreds at once) share one batch instead of queueing behind it.
        self._batch_wait_s = batch_wait_s
        self._cond = threading.Condition()
        self._waiting: deque[Row] = deque()
        self._running: list[Row] = []
        self._jobs: deque[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = deque()
        self._admitting = True
        self._hold_in_place = False
        self._stopping = False
        self._num_served = 0
        self._thread = threading.Thread(target=self._loop, name="cpu-engine-decode", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Take no more work and finish every row with an abort carrying status_code 503
        (SHUTTING_DOWN): its request is answered 503, which the router sends to another
        engine, not a partial output that reads as if someone had asked for the abort."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self.abort(None, SHUTTING_DOWN, status_code=503)
        self._thread.join(timeout_s)
        for _, future in self._jobs:
            future.cancel()

    def submit(self, rows: list[Row]) -> None:
        with self._cond:
            if self._stopping:
                raise RequestError(SHUTTING_DOWN, status=503)
            self._waiting.extend(rows)
            self._cond.notify_all()

    def abort(self, rid_prefix: str | None, message: str, status_code: int | None = None) -> int:
        """Abort rows whose rid starts with `rid_prefix` (all rows when None). Waiting rows
        finish at once; running rows finish at the next step with their partial output.
        An abort asked for has no `status_code`; one with a status_code is an error answer."""

        def matches(row: Row) -> bool:
            return rid_prefix is None or row.rid.startswith(rid_prefix)

        reason = FinishReason("abort", message=message, status_code=status_code)
        with self._cond:
            dropped = [r for r in self._waiting if matches(r)]
            self._waiting = deque(r for r in self._waiting if not matches(r))
            flagged = [r for r in self._running if r.finish is None and matches(r)]
            for row in flagged:
                row.abort = reason
            self._cond.notify_all()
        for row in dropped:
            row.finish_with(reason, self._generator.weight_version)
        return len(dropped) + len(flagged)

    def pause(self, mode: str) -> None:
        """Stop admitting rows. "abort" also aborts every row and returns once the running
        batch has drained; "in_place" and "retract" hold the running batch between
        two steps. Blocks until the decoding thread is at a safe point."""
        with self._cond:
            self._admitting = False
            self._hold_in_place = mode != "abort"
        if mode == "abort":
            self.abort(None, "aborted by pause_generation")
        self.call(lambda: None).result()

    def resume(self) -> None:
        with self._cond:
            self._admitting = True
            self._hold_in_place = False
            self._cond.notify_all()

    def call(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run `fn` on the decoding thread at the next safe point."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._cond:
            if self._stopping:
                raise RequestError(SHUTTING_DOWN, status=503)
            self._jobs.append((fn, future))
            self._cond.notify_all()
        return future

    @property
    def is_idle(self) -> bool:
        with self._cond:
            return not self._waiting and not any(r.finish is None for r in self._running)

    @property
    def is_paused(self) -> bool:
        return not self._admitting

    def load(self) -> Load:
        with self._cond:
            running = [r for r in self._running if r.finish is None]
            return Load(
                num_running=len(running),
                num_waiting=len(self._waiting),
                num_tokens=sum(r.num_tokens for r in running)
                + sum(len(r.prompt_ids) for r in self._waiting),
                num_served=self._num_served,
            )

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._stopping or self._jobs or (self._waiting and self._admitting)):
                    self._cond.wait()
                if self._stopping:
                    return
            self._run_jobs()
            batch = self._take_batch()
            if batch:
                self._decode(batch)

    def _take_batch(self) -> list[Row]:
        with self._cond:
            short = 0 < len(self._waiting) < self._max_batch_size
        if short and self._batch_wait_s > 0:
            time.sleep(self._batch_wait_s)
        return self._admit(0)

    def _admit(self, num_running: int) -> list[Row]:
        """Rows to add to a batch of `num_running`; none while paused or a job waits (a
        pending weight update lets the batch drain instead of growing)."""
        with self._cond:
            self._running = [r for r in self._running if r.finish is None]
            if not self._admitting or self._jobs or self._stopping:
                return []
            count = min(len(self._waiting), self._max_batch_size - num_running)
            taken = [self._waiting.popleft() for _ in range(max(0, count))]
            self._running.extend(taken)
            self._num_served += len(taken)
        if taken:
            logger.debug("admitted %d rows next to %d running", len(taken), num_running)
        return taken

    def _decode(self, batch: list[Row]) -> None:
        start = time.perf_counter()
        served = self._num_served
        try:
            self._generator.run(batch, self._between_steps, self._admit)
            logger.debug(
                "decoded %d rows in %.3f s",
                self._num_served - served + len(batch),
                time.perf_counter() - start,
            )
        except Exception as exc:  # a failed batch must not take the engine down with it
            logger.exception("decoding failed")
            with self._cond:
                failed = list(self._running)
            for row in failed:
                if not row.done.done():
                    row.done.set_exception(exc)
        finally:
            with self._cond:
                self._running = []

    def _between_steps(self) -> None:
        if not self._hold_in_place:
            return
        while True:
            self._run_jobs()
            with self._cond:
                all_aborted = all(r.abort is not None for r in self._running)
                if not self._hold_in_place or self._stopping or all_aborted:
                    return
                if not self._jobs:
                    self._cond.wait(timeout=0.5)

    def _run_jobs(self) -> None:
        while True:
            with self._cond:
                if not self._jobs:
                    return
                fn, future = self._jobs.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)
