"""Grading in worker processes, with a time limit that really stops a grader.

A thread cannot be stopped, and sympy can hold the GIL for minutes inside one C call
(`\\boxed{9^{9^{9^{9}}}}` does), freezing the event loop with it: a timeout around a thread
never fires. So rule-based graders run in small worker processes (`worker.py`), one job at
a time each; a worker that runs past the limit is killed and replaced, and no other job is
touched. Workers are plain subprocesses rather than multiprocessing children, so nothing
re-imports the user's main module and any event loop or thread may use the pool.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import os
import subprocess
import sys
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

from rlpost.rewards.errors import RewardError

logger = logging.getLogger(__name__)


class GraderProcess:
    """One worker process; `call` blocks until its reply (run it off the event loop)."""

    def __init__(self) -> None:
        env = dict(os.environ)
        # The worker must import the same rlpost as this process, installed or not.
        paths = [p for p in sys.path if p] + env.get("PYTHONPATH", "").split(os.pathsep)
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "rlpost.rewards.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
            bufsize=1,
            # out of the terminal's process group: Ctrl-C is the launch's to handle (it ends
            # the pool), not the worker's to die of with a traceback, while it imports or
            # waits between a sweep's jobs; its stdin's end still ends it
            start_new_session=True,
        )
        try:
            self._read()  # {"ready": true}: the imports are done
        except BrokenPipeError:
            if self.process.wait() < 0:  # killed while it started: another may start fine
                raise
            raise RewardError(
                f"a grading worker ({sys.executable} -m rlpost.rewards.worker) exited while "
                "starting; its error is printed above"
            ) from None

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        stdin: IO[str] = self.process.stdin  # type: ignore[assignment]
        stdin.write(json.dumps(request) + "\n")
        stdin.flush()
        return self._read()

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()

    def close(self) -> None:
        if self.alive():
            self.process.stdin.close()  # type: ignore[union-attr]
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()

    def _read(self) -> dict[str, Any]:
        line = self.process.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise BrokenPipeError(f"grading worker {self.process.pid} exited")
        reply: dict[str, Any] = json.loads(line)
        return reply


class GradingPool:
    """Up to `max_workers` grading processes, started on demand and reused."""

    def __init__(self, max_workers: int | None = None) -> None:
        self.max_workers = max_workers or default_grading_workers()
        self.restarts = 0
        self._idle: list[GraderProcess] = []
        self._lock = threading.Lock()
        self._threads = ThreadPoolExecutor(4 * self.max_workers, thread_name_prefix="rlpost-grade")
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]
        self._slots = weakref.WeakKeyDictionary()

    async def run(
        self, grader: str, response: str, label: str, *, timeout_s: float
    ) -> float | None:
        """Grader `grader` (a name in answers.GRADERS) on one sample; None past `timeout_s`."""
        loop = asyncio.get_running_loop()
        request = {"grader": grader, "response": response, "label": label}
        async with self._slot(loop):
            for attempt in range(2):
                try:
                    # Starting a worker (~1-2 s of imports) does not count against the limit.
                    worker = await loop.run_in_executor(self._threads, self._checkout)
                except BrokenPipeError:  # killed while it started: once more
                    if attempt:
                        raise self._died_twice(grader) from None
                    continue
                call = loop.run_in_executor(self._threads, worker.call, request)
                try:
                    reply = await asyncio.wait_for(call, timeout_s)
                except TimeoutError:
                    logger.warning(
                        "grader %r ran past %.1f s on a %d-character response; scoring it as "
                        "failed and replacing its worker",
                        grader,
                        timeout_s,
                        len(response),
                    )
                    self._replace(worker)
                    return None
                except BrokenPipeError:
                    self._replace(worker)  # died under us (OOM killer?): once more
                    if attempt:
                        raise self._died_twice(grader) from None
                    continue
                self._checkin(worker)
                if "error" in reply:
                    raise RewardError(f"grader {grader!r} failed: {reply['error']}")
                return float(reply["reward"])
        raise AssertionError("unreachable")

    @staticmethod
    def _died_twice(grader: str) -> RewardError:
        return RewardError(
            f"grading workers died twice running grader {grader!r}; "
            "check the machine's memory (each worker imports sympy)"
        )

    def start(self) -> None:
        """Start all workers now rather than on first use."""
        started = list(self._threads.map(lambda _: self._checkout(), range(self.max_workers)))
        for worker in started:
            self._checkin(worker)

    def shutdown(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.close()

    def _slot(self, loop: asyncio.AbstractEventLoop) -> asyncio.Semaphore:
        # A job's clock should start when a worker is free, not while it queues.
        with self._lock:
            if loop not in self._slots:
                self._slots[loop] = asyncio.Semaphore(self.max_workers)
            return self._slots[loop]

    def _checkout(self) -> GraderProcess:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.alive():
                    return worker
        return GraderProcess()

    def _checkin(self, worker: GraderProcess) -> None:
        with self._lock:
            if len(self._idle) < self.max_workers and worker.alive():
                self._idle.append(worker)
                return
        worker.close()

    def _replace(self, worker: GraderProcess) -> None:
        worker.kill()
        with self._lock:
            self.restarts += 1


def default_grading_workers() -> int:
    """One worker per core, at most 4: grading is a small part of a rollout's time."""
    return max(1, min(4, os.cpu_count() or 1))


_POOL: GradingPool | None = None
_POOL_LOCK = threading.Lock()


def grading_pool() -> GradingPool:
    """The process-wide pool, created on first use."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = GradingPool()
            atexit.register(shutdown_grading_pool)
        return _POOL


def shutdown_grading_pool() -> None:
    global _POOL
    with _POOL_LOCK:
        pool, _POOL = _POOL, None
    if pool is not None:
        pool.shutdown()
