"""`rlpost cluster down` stops its own cluster and no other Ray on the machine.

`ray stop` would end them all: a concurrent `cluster down` once SIGTERMed the raylet and then
the GCS of a training run's local Ray on the same machine (rlpost.cli.ray_processes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlpost.cli.ray_processes import cluster_processes, stop
from rlpost.runtime.gcs import read_gcs_nodes

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
OURS, OTHER = "127.0.0.5", "127.0.0.6"
LOCAL_SSH = "sh -c 'exec sh -c \"$1\"'"  # `ssh HOST COMMAND` on this machine


def rlpost(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlpost.cli.main", *argv],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


def cluster_up(address: str, tmp_path: Path) -> tuple[str, Path]:
    from rlpost.backends.ports import free_port

    port = free_port(address)
    hostfile, state = tmp_path / f"hosts-{address}", tmp_path / f"cluster-{address}.json"
    hostfile.write_text(f"{address} slots=1\n")
    up = rlpost(
        "cluster", "up", "--hostfile", str(hostfile), "--kind", "cpu", "--port", str(port),
        "--ssh", LOCAL_SSH, "--no-dashboard", "--state", str(state),
    )  # fmt: skip
    assert up.returncode == 0, up.stdout + up.stderr
    return f"{address}:{port}", state


def test_cluster_down_leaves_another_ray_on_the_machine_running(tmp_path: Path) -> None:
    other, _ = cluster_up(OTHER, tmp_path)
    try:
        ours, state = cluster_up(OURS, tmp_path)
        raylets, rest, gcs = cluster_processes(ours)
        assert len(raylets) == 1 and len(gcs) == 1 and rest, (raylets, rest, gcs)
        theirs = {p.pid for group in cluster_processes(other) for p in group}
        assert theirs and not theirs & {p.pid for group in (raylets, rest, gcs) for p in group}

        down = rlpost("cluster", "down", "--state", str(state))
        assert down.returncode == 0, down.stdout + down.stderr
        assert not any(p.is_running() for p in [*raylets, *rest, *gcs])
        assert cluster_processes(ours) == [[], [], []]
        assert [n.alive for n in read_gcs_nodes(other)] == [True]  # the other Ray runs on
    finally:
        stop(cluster_processes(other))
