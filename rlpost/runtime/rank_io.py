"""What a train rank reads, for the driver to tell a long load from a hung rank.

A rank starting (its model from a torch_dist folder) or loading a checkpoint on resume can
take longer than trainer.collective_timeout_s on a large model and a slow shared file system
(GLM-4.5's checkpoint with its optimizer state is about 78 GB per rank on 64 GPUs, 14 bytes a
parameter). While it runs, a `ReadMeter` thread in the rank looks at the files its process has
open under the folders being loaded (`/proc/self/fd`) and where each stands
(`/proc/self/fdinfo`: the offset a read moves) and, for a file it reads through a memory map
(safetensors, `torch.load(mmap=True)`: no offset moves), how much of the map is resident
(`/proc/self/smaps`: each page read is paged in), and writes how many of its looks found that
changed to a file of its own in the run directory, which every node sees
(`Cluster.check_shared`). The driver sums the files (`reads_seen`) and counts the timeout from
their last change (`rank_calls.await_ranks`), as it counts a save's from its last written
byte. A rank stuck in a read, or done reading and stuck in a collective, changes nothing. The
process's own read counter (`rchar`) would not do: an idle Ray worker reads some 100 kB/s of
its own. Where /proc is not there, nothing is written.

Stdlib only: the driver imports it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["READS_DIR", "ReadMeter", "load_metered", "reads_seen"]

READS_DIR = ".reads"  # under the run directory: one file per rank
METER_S = 2.0  # how often a rank's meter looks
FDS = "/proc/self/fd"
MAPS, SMAPS = "/proc/self/maps", "/proc/self/smaps"


def _offset(fd: str) -> int:
    with open(f"/proc/self/fdinfo/{fd}", "rb") as f:
        for line in f.read().splitlines():
            if line.startswith(b"pos:"):
                return int(line.split()[1])
    return -1


def open_reads(roots: Iterable[str]) -> frozenset[tuple[str, int]] | None:
    """(path, offset) of each file this process has open under one of `roots` (real
    paths), or None without /proc."""
    try:
        fds = os.listdir(FDS)
    except OSError:
        return None
    found = set()
    prefixes = tuple(root.rstrip("/") + "/" for root in roots)
    for fd in fds:
        with contextlib.suppress(OSError, ValueError):  # closed while looked at
            target = os.readlink(f"{FDS}/{fd}")
            if target.startswith(prefixes):
                found.add((target, _offset(fd)))
    return frozenset(found | mapped_reads(prefixes))


def mapped_reads(prefixes: tuple[str, ...]) -> set[tuple[str, int]]:
    """("<addresses> <path>", resident kB) of each memory map of a file under `prefixes`.
    /proc/self/maps (small) is looked at first; smaps (some 10 ms to read in a process that
    has imported torch) only when it maps such a file."""
    try:
        with open(MAPS, encoding="utf-8", errors="replace") as f:
            if not any(prefix in f.read() for prefix in prefixes):
                return set()
        found = set()
        current = None
        with open(SMAPS, encoding="utf-8", errors="replace") as f:
            for line in f:
                head = line.split(None, 1)[0] if line.strip() else ""
                if "-" in head and not head.endswith(":"):  # a map: addresses ... path
                    parts = line.rstrip("\n").split(None, 5)
                    path = parts[5] if len(parts) == 6 else ""
                    current = f"{parts[0]} {path}" if path.startswith(prefixes) else None
                elif current is not None and head == "Rss:":
                    found.add((current, int(line.split()[1])))
        return found
    except (OSError, ValueError, IndexError):
        return set()


class ReadMeter:
    """While open, looks every METER_S seconds at the files this process reads under
    `roots` and writes how many looks found them changed to `folder/rank_<rank>`."""

    def __init__(
        self, folder: str | Path, rank: int, roots: Iterable[str], every_s: float | None = None
    ) -> None:
        self.folder = Path(folder)
        self.path = self.folder / f"rank_{rank}"
        self.roots = [os.path.realpath(root) for root in roots]
        self.every_s = METER_S if every_s is None else every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rlpost-read-meter", daemon=True)

    def __enter__(self) -> ReadMeter:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        last: frozenset[tuple[str, int]] | None = frozenset()
        changes = 0
        while not self._stop.wait(self.every_s):
            now = open_reads(self.roots)
            if now is None:
                return
            if now != last:
                last, changes = now, changes + 1
                self._write(changes)

    def _write(self, value: int) -> None:
        staging = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        # a full disk or a vanished run directory must not fail the load being metered
        with contextlib.suppress(OSError):
            self.folder.mkdir(parents=True, exist_ok=True)  # not before a load lasts a look
            staging.write_text(str(value), encoding="utf-8")
            os.replace(staging, self.path)


def reads_seen(folder: str | Path) -> int:
    """The sum of what every rank's meter wrote to `folder` (0 where there is nothing):
    it changes while some rank's reads move."""
    total = 0
    with contextlib.suppress(OSError):
        for path in Path(folder).glob("rank_*"):
            with contextlib.suppress(OSError, ValueError):
                total += int(path.read_text(encoding="utf-8"))
    return total


def metered(
    folder: str, rank: int, roots: Iterable[str], fn: Callable[..., Any], *args: Any
) -> Any:
    """`fn(*args)` with this rank's reads under `roots` metered to `folder`."""
    with ReadMeter(folder, rank, roots):
        return fn(*args)


def load_metered(trainer: Any, checkpoint: str, rank: int, folder: str) -> bool:
    """`run_state.load_rank_state` on a rank (through `on_trainer`), its reads of the
    checkpoint metered."""
    from rlpost.runtime.run_state import load_rank_state

    return bool(metered(folder, rank, [checkpoint], load_rank_state, trainer, checkpoint, rank))
