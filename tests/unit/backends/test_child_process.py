"""A child started by start_child is the command itself and dies with the process that started
it, whichever thread started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rlpost
from rlpost.backends.child_process import start_child

REPO_ROOT = Path(rlpost.__file__).resolve().parent.parent
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux prctl")

# Starts a sleeping child from a thread that ends at once, prints its pid, waits to be killed.
PARENT = """
import sys, threading, time
from rlpost.backends.child_process import start_child
children = []
starter = threading.Thread(target=lambda: children.append(start_child(["sleep", "60"])))
starter.start()
starter.join()
print(children[0].pid, flush=True)
time.sleep(60)
"""


def is_gone(pid: int) -> bool:
    """Exited (a zombie not yet reaped by its new parent counts as exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def test_the_child_is_the_command_with_its_own_pid_and_options(tmp_path: Path) -> None:
    proc = start_child(
        [sys.executable, "-c", "import os; print(os.getpid(), os.getsid(0), os.getcwd())"],
        stdout=subprocess.PIPE,
        cwd=tmp_path,
        start_new_session=True,
    )
    out, _ = proc.communicate(timeout=30)
    pid, sid, cwd = out.decode().split()
    assert int(pid) == proc.pid and int(sid) == proc.pid
    assert Path(cwd) == tmp_path
    assert proc.returncode == 0


def test_popen_errors_reach_the_caller(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        start_child(["sleep", "1"], cwd=tmp_path / "missing")


@linux_only
def test_child_dies_with_a_sigkilled_parent() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdout=subprocess.PIPE, env=env, text=True
    )
    child_pid = None
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        time.sleep(0.2)  # its starting thread has ended; the child must not have gone with it
        assert not is_gone(child_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 5
        while not is_gone(child_pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert is_gone(child_pid), f"child {child_pid} outlived its SIGKILLed parent"
    finally:
        parent.kill()
        parent.wait()
        if child_pid is not None and not is_gone(child_pid):
            os.kill(child_pid, signal.SIGKILL)
