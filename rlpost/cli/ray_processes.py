"""Stop one Ray cluster's processes on this machine, and nothing else.

`ray stop` ends every Ray process on the machine it runs on: other people's clusters, and
the local Ray of any training run there. Seen on a shared machine: a `ray stop` for one
cluster SIGTERMed a training run's raylet (its train ranks reported dead, "its owner has
died") and, nine seconds later, the GCS of the Ray the run had just restarted (its driver
exited after 60 s: "Failed to connect to GCS within 60 seconds").

A cluster's processes are found by the GCS address they were given: the raylets, the
dashboard, the autoscaler monitor and the log monitor carry `--gcs-address=HOST:PORT`; the
workers and agents (which rename themselves `ray::...`) are the raylets' descendants; the
GCS carries its raylets' `--session-name`. They are stopped in `ray stop`'s order: raylets,
then the rest, then the GCS, each with SIGTERM and SIGKILL after a grace period.

Run as a script with this machine's Python (`python - GCS_ADDRESS [GRACE_S] < this file`),
so that a node where rlpost is not importable runs it too; needs psutil (a Ray dependency).
"""

from __future__ import annotations

import importlib.util
import os
import sys

try:
    import psutil
except ImportError:  # Ray ships its own copy
    spec = importlib.util.find_spec("ray")
    assert spec is not None and spec.origin is not None, "neither psutil nor Ray is installed"
    sys.path.append(os.path.join(os.path.dirname(spec.origin), "thirdparty_files"))
    import psutil

GRACE_S = 10.0


def _args(process: psutil.Process) -> list[str]:
    try:
        args: list[str] = process.cmdline()
    except psutil.Error:
        return []
    return args


def cluster_processes(gcs_address: str) -> list[list[psutil.Process]]:
    """This cluster's processes here, in the order they are stopped: raylets, everything
    else, the GCS."""
    given = f"--gcs-address={gcs_address}"
    raylets, others, sessions = [], [], set()
    for process in psutil.process_iter():
        args = _args(process)
        if given not in args:
            continue
        if args and args[0].endswith("/raylet"):
            raylets.append(process)
            sessions |= {a for a in args if a.startswith("--session-name=")}
        else:
            others.append(process)
    for raylet in raylets:
        try:
            others += raylet.children(recursive=True)
        except psutil.Error:
            continue
    gcs = [
        p
        for p in psutil.process_iter()
        if (args := _args(p)) and args[0].endswith("/gcs_server") and sessions & set(args)
    ]
    return [raylets, _unique(others, raylets), gcs]


def _unique(processes: list[psutil.Process], seen: list[psutil.Process]) -> list[psutil.Process]:
    pids = {p.pid for p in seen}
    unique = []
    for process in processes:
        if process.pid not in pids:
            pids.add(process.pid)
            unique.append(process)
    return unique


def stop(groups: list[list[psutil.Process]], grace_s: float = GRACE_S) -> int:
    """SIGTERM each group in turn, SIGKILL what outlives `grace_s`; the number stopped."""
    stopped = 0
    for group in groups:
        for process in group:
            try:
                process.terminate()
            except psutil.Error:
                continue
        _, alive = psutil.wait_procs(group, timeout=grace_s / len(groups))
        for process in alive:
            try:
                process.kill()
            except psutil.Error:
                continue
        psutil.wait_procs(alive, timeout=2)
        stopped += len(group)
    return stopped


def main(argv: list[str]) -> int:
    address, grace_s = argv[0], float(argv[1]) if len(argv) > 1 else GRACE_S
    count = stop(cluster_processes(address), grace_s)
    print(f"stopped {count} process(es) of the Ray cluster at {address}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
