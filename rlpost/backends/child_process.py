"""Server processes that die with the process that started them, even when it is SIGKILLed.

On Linux the child asks the kernel for SIGKILL when its parent dies (PR_SET_PDEATHSIG).
Two details of that mechanism shape this module:

- The kernel's "parent" is the *thread* that forked the child. Servers are often started
  from executor threads (`asyncio.to_thread`) that may end while the server should run
  on, so every fork happens on one daemon thread that lives as long as the process.
- The child sets the signal on itself in a short Python prelude that then execs the real
  command (same pid, same session). A `preexec_fn` would run Python between fork and exec,
  which can deadlock in a process with other threads (Ray workers, executors).

Elsewhere (macOS) the command starts as given and nothing ties it to this process.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

PARENT_DEATH_SIGNAL = signal.SIGKILL

# argv: parent pid, signal, command...; exits instead when the parent is already gone (it
# died before prctl took effect, so the signal will never come).
_PRELUDE = """import ctypes, os, sys
parent, sig = int(sys.argv[1]), int(sys.argv[2])
PR_SET_PDEATHSIG = 1
if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
    sys.exit(f"prctl(PR_SET_PDEATHSIG) failed: errno {ctypes.get_errno()}")
if os.getppid() != parent:
    sys.exit(f"parent {parent} exited before {sys.argv[3]} started")
os.execvp(sys.argv[3], sys.argv[3:])
"""

_Request = tuple[list[str], dict[str, Any], "Future[subprocess.Popen[Any]]"]


def ties_to_parent() -> bool:
    return sys.platform.startswith("linux")


def tied_command(command: Sequence[str], parent_pid: int) -> list[str]:
    """`command` behind the prelude: `-I -S` keeps its start to a few milliseconds and
    independent of the environment, which reaches the real command unchanged."""
    sig = str(int(PARENT_DEATH_SIGNAL))
    return [sys.executable, "-I", "-S", "-c", _PRELUDE, str(parent_pid), sig, *command]


class _Forker:
    """The one long-lived thread that forks children, so that their parent thread only ends
    with the process."""

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def popen(self, command: list[str], kwargs: dict[str, Any]) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="rlpost-fork", daemon=True)
                self._thread.start()
        done: Future[subprocess.Popen[Any]] = Future()
        self._requests.put((command, kwargs, done))
        return done.result()

    def _serve(self) -> None:
        while True:
            command, kwargs, done = self._requests.get()
            try:
                done.set_result(subprocess.Popen(command, **kwargs))
            except BaseException as exc:  # handed to the caller, who raises it
                done.set_exception(exc)


_forker = _Forker()


def _reset_after_fork() -> None:
    # A forked child has none of the parent's threads, and the lock may have been held.
    global _forker
    _forker = _Forker()


os.register_at_fork(after_in_child=_reset_after_fork)


def start_child(command: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[bytes]:
    """`subprocess.Popen(command, **popen_kwargs)` whose process gets SIGKILL when this
    process dies (Linux); `pid` is the command's own."""
    if not ties_to_parent():
        return subprocess.Popen(list(command), **popen_kwargs)
    return _forker.popen(tied_command(command, os.getpid()), popen_kwargs)
