"""A killed launch's leftovers: recorded by the launch, ended by the next one (real processes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlpost.runtime import leftovers

pytestmark = pytest.mark.skipif(not leftovers.supported(), reason="needs Linux's /proc")

# A "driver" that starts a grandchild in a session of its own (as Ray's agents and engine
# servers run), records its processes once the grandchild runs its own command (recorded
# mid-exec, its command line reads empty), says the grandchild's pid, then waits to be killed.
DRIVER = textwrap.dedent(
    """
    import subprocess, sys, time
    from pathlib import Path
    from rlpost.runtime.leftovers import record_processes
    child = subprocess.Popen(
        [sys.executable, "-c", "print('up', flush=True); import time; time.sleep(120)"],
        start_new_session=True, stdout=subprocess.PIPE, text=True,
    )
    assert child.stdout.readline() == "up\\n"
    record_processes(Path(sys.argv[1]))
    print(child.pid, flush=True)
    time.sleep(120)
    """
)


def alive(pid: int) -> bool:
    stat = leftovers._stat(pid)
    return stat is not None and stat[2] != "Z"


@pytest.fixture()
def killed_launch(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A run directory whose launch was SIGKILLed and left its grandchild running."""
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert driver.stdout is not None
    orphan = int(driver.stdout.readline())
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    assert alive(orphan)
    yield tmp_path, orphan
    if alive(orphan):
        os.kill(orphan, signal.SIGKILL)


def test_the_next_launch_ends_what_a_killed_one_left_running(
    killed_launch: tuple[Path, int],
) -> None:
    run_dir, orphan = killed_launch
    assert [p.pid for p in leftovers.still_running(run_dir)] == [orphan]
    ended = leftovers.end_leftovers(run_dir)
    assert [p.pid for p in ended] == [orphan]
    assert "time.sleep(120)" in ended[0].name
    deadline = time.monotonic() + 5
    while alive(orphan) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(orphan)
    assert not (run_dir / leftovers.RECORD_FILE).exists()
    assert leftovers.end_leftovers(run_dir) == []  # nothing twice


def test_a_reused_pid_or_another_boot_is_never_touched(killed_launch: tuple[Path, int]) -> None:
    run_dir, orphan = killed_launch
    path = run_dir / leftovers.RECORD_FILE
    record = json.loads(path.read_text())
    pid, start, name = record["processes"][0]
    # the same pid, started at another time: another process now holds the pid
    path.write_text(json.dumps({**record, "processes": [[pid, start + 1, name]]}))
    assert leftovers.end_leftovers(run_dir) == []
    assert alive(orphan)
    # the right process, recorded before a reboot
    path.write_text(json.dumps({**record, "boot_id": "another-boot"}))
    assert leftovers.end_leftovers(run_dir) == []
    assert alive(orphan)


def test_the_launch_itself_and_its_ancestors_are_never_ended(tmp_path: Path) -> None:
    """A record naming this process (say, a launch restarted in place) leaves it alone."""
    me = leftovers._stat(os.getpid())
    assert me is not None
    parent = leftovers._stat(os.getppid())
    assert parent is not None
    record = {
        "boot_id": leftovers.BOOT_ID.read_text().strip(),
        "driver": 1,
        "processes": [[os.getpid(), me[1], "me"], [os.getppid(), parent[1], "parent"]],
    }
    (tmp_path / leftovers.RECORD_FILE).write_text(json.dumps(record))
    assert leftovers.end_leftovers(tmp_path) == []


def test_an_unreadable_record_names_nothing(tmp_path: Path) -> None:
    (tmp_path / leftovers.RECORD_FILE).write_text("{not json")
    assert leftovers.still_running(tmp_path) == []


def test_recording_is_best_effort(tmp_path: Path) -> None:
    """No run directory, or one that cannot be written: nothing recorded, nothing raised."""
    leftovers.record_processes(tmp_path / "missing")
    assert not (tmp_path / "missing").exists()
    unwritable = Path("/proc/self")  # a directory no one, root included, can create files in
    leftovers.record_processes(unwritable)
    assert not (unwritable / leftovers.RECORD_FILE).exists()
