"""What a killed launch left running, ended by the next launch of the same run.

A launch that dies without its cleanup (SIGKILL, the OOM killer, a lost terminal) takes
most of its processes with it: engine servers die with their actors (child_process), and
Ray's workers with their raylet. Ray's own agents do not: the dashboard and runtime-env
agents of a dead local cluster wait for its GCS to come back, and exit only a minute or
more later. Meanwhile they hold memory and CPU that the resumed run needs.

So each session writes down the processes it runs on this machine (the driver's
descendants, each by pid and start time), and a launch that takes the run directory over
ends the ones still running before it starts anything. The run directory's lock is held by
then: whoever wrote the record is gone. A process counts as the recorded one only when its
start time matches (pids are reused) and the machine has not rebooted since (boot id).
Processes on other nodes, and clusters the run joined (`run.ray_address`), are never
touched: they are not the driver's descendants.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

RECORD_FILE = ".processes.json"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
GRACE_S = 2.0


@dataclass(frozen=True)
class Proc:
    pid: int
    start: int  # clock ticks after boot (/proc/<pid>/stat, field 22)
    name: str


def supported() -> bool:
    return sys.platform.startswith("linux") and BOOT_ID.is_file()


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, start time, state) of a live process, None when there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    # after the name: state, ppid, ... starttime is field 22 of the whole line
    return int(fields[1]), int(fields[19]), fields[0]


def _name(pid: int) -> str:
    """The command's first three words: what it is, never its arguments (a server's
    command line may hold a key)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    words = raw.decode(errors="replace").split("\0")
    return " ".join(Path(words[0]).name.split() + words[1:3]).strip()[:80] or "?"


def descendants(root: int) -> list[Proc]:
    """Every live process below `root` (not `root` itself), each with its start time."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = _stat(int(entry.name))
        if stat is not None:
            children.setdefault(stat[0], []).append(int(entry.name))
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        stat = _stat(pid)
        if stat is not None:
            found.append(Proc(pid, stat[1], _name(pid)))
        todo += children.get(pid, [])
    return sorted(found, key=lambda p: p.pid)


def record_processes(run_dir: Path) -> None:
    """Write down this process's descendants as the run's (see the module). Best effort: a
    run directory that is missing or cannot be written (a full disk) records nothing, and
    the run goes on."""
    if not supported() or not run_dir.is_dir():
        return
    record = {
        "boot_id": BOOT_ID.read_text().strip(),
        "driver": os.getpid(),
        "processes": [[p.pid, p.start, p.name] for p in descendants(os.getpid())],
    }
    path = run_dir / RECORD_FILE
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(json.dumps(record) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def still_running(run_dir: Path) -> list[Proc]:
    """The recorded processes that are still the ones recorded and still running."""
    path = run_dir / RECORD_FILE
    if not supported() or not path.is_file():
        return []
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if record["boot_id"] != BOOT_ID.read_text().strip():
            return []
        recorded = [Proc(int(p), int(start), str(name)) for p, start, name in record["processes"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []  # an unreadable record names nothing safely
    mine = {os.getpid(), *_ancestors(os.getpid())}
    alive = []
    for proc in recorded:
        stat = _stat(proc.pid)
        if stat is not None and stat[1] == proc.start and stat[2] != "Z" and proc.pid not in mine:
            alive.append(proc)
    return alive


def end_leftovers(run_dir: Path) -> list[Proc]:
    """End what the run's previous launch left running (SIGTERM, SIGKILL after GRACE_S);
    returns them. Call only while holding the run directory's lock."""
    left = still_running(run_dir)
    _signal(left, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and _alive(left):
        time.sleep(0.05)
    _signal(_alive(left), signal.SIGKILL)
    (run_dir / RECORD_FILE).unlink(missing_ok=True)
    return left


def _alive(procs: Iterable[Proc]) -> list[Proc]:
    out = []
    for proc in procs:
        stat = _stat(proc.pid)
        if stat is not None and stat[1] == proc.start and stat[2] != "Z":
            out.append(proc)
    return out


def _signal(procs: Iterable[Proc], sig: signal.Signals) -> None:
    for proc in procs:
        try:
            os.kill(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            continue


def _ancestors(pid: int) -> list[int]:
    out = []
    while pid > 1:
        stat = _stat(pid)
        if stat is None:
            break
        pid = stat[0]
        out.append(pid)
    return out
