"""Hooks that put a fault at a fixed point of a run's loop, imported by dotted path.

The point is a reward: when the run first asks for the reward of group KILL_AT_GROUP (a
group's index counts the groups drawn since the run began, so it names one moment of one
rollout), the hook SIGKILLs the process KILL_TARGET names and waits until it is gone. A
marker file (KILL_MARKER) records that it was done, so the rollout a restart redoes is left
alone. The hook runs in the driver, the launch's own process: everything the run started
descends from it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import psutil

from rlpost.types import Sample

TARGETS = {"engine_server": "rlpost.backends.cpu_engine", "engine_actor": "ray::EngineActor"}
TRAIN_RANK = "ray::TrainActor"
# A file size limit the torch trainer's state (model and Adam: 36 MB for the tiny model)
# cannot fit under, while the weights alone (12 MB: HF exports, weight updates) still can.
SMALL_FILE_BYTES = 20 << 20
_lock = threading.Lock()


def length_reward_with_a_kill(sample: Sample) -> float:
    """The response's length in characters (rlpost_test_hooks.length_reward), after the
    kill when this sample is the point."""
    if sample.group_index == int(os.environ["KILL_AT_GROUP"]):
        with _lock:  # the group's samples are scored in parallel threads: one kills
            marker = Path(os.environ["KILL_MARKER"])
            if not marker.exists():
                victim = _find(TARGETS[os.environ.get("KILL_TARGET", "engine_server")])
                marker.write_text(f"{victim.pid}\n")
                victim.send_signal(signal.SIGKILL)
                victim.wait(timeout=60)
    return float(len(sample.response_text))


def _find(name: str) -> psutil.Process:
    for process in sorted(psutil.Process().children(recursive=True), key=lambda p: p.pid):
        try:
            if name in " ".join(process.cmdline()):
                return process
        except psutil.Error:
            continue
    raise RuntimeError(f"no process of this run has {name!r} in its command line")


def length_reward_with_a_refused_save_and_a_kill(sample: Sample) -> float:
    """length_reward_with_a_kill, and a full disk for one save: when the run first asks for
    the reward of group REFUSE_AT_GROUP, the train ranks' file size limit drops to
    SMALL_FILE_BYTES, so that the next checkpoint save fails with EFBIG (an OSError: Python
    ignores SIGXFSZ), as on a full disk; once that save's staging folder REFUSED_STAGING has
    come and gone (the run discarded it), the limit is lifted and the next save succeeds."""
    if sample.group_index == int(os.environ["REFUSE_AT_GROUP"]):
        with _lock:
            marker = Path(f"{os.environ['KILL_MARKER']}.refused")
            if not marker.exists():
                marker.write_text("")
                ranks = _all(TRAIN_RANK)
                _limit_file_size(ranks, SMALL_FILE_BYTES)
                staging = Path(os.environ["REFUSED_STAGING"])
                threading.Thread(target=_lift_after, args=(staging, ranks), daemon=True).start()
    return length_reward_with_a_kill(sample)


def _limit_file_size(ranks: list[psutil.Process], limit: int | None) -> None:
    for rank in ranks:
        try:
            _, hard = rank.rlimit(psutil.RLIMIT_FSIZE)
            rank.rlimit(psutil.RLIMIT_FSIZE, (hard if limit is None else limit, hard))
        except psutil.Error:
            continue


def _lift_after(staging: Path, ranks: list[psutil.Process]) -> None:
    while not staging.exists():
        time.sleep(0.01)
    while staging.exists():
        time.sleep(0.01)
    _limit_file_size(ranks, None)


def _all(name: str) -> list[psutil.Process]:
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if name in " ".join(process.cmdline()):
                found.append(process)
        except psutil.Error:
            continue
    return found
