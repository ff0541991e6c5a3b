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
from pathlib import Path

import psutil

from rlpost.types import Sample

TARGETS = {"engine_server": "rlpost.backends.cpu_engine", "engine_actor": "ray::EngineActor"}
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
