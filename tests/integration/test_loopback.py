"""A one-node run listens on loopback only: every listening socket of every process of a run.

The run is the CPU default (Ray's GCS, raylet, workers and agents, the router, the engine
servers, the train ranks), listed with psutil once it trains. Any socket off loopback fails
the test unless LISTENERS_OFF_LOOPBACK names it, as the README's "Secrets and sockets" does,
with the reason.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
# process name (start of its command line) -> why it may listen off loopback; the README
# lists the same. A CPU run has none: NCCL's bootstrap and SGLang's ports are GPU-only.
LISTENERS_OFF_LOOPBACK: dict[str, str] = {}
# what a default run must show before its sockets count (else the test proves nothing)
EXPECTED = {
    "gcs": "gcs_server",
    "raylet": "raylet/raylet",
    "driver": "launch.py",
    "train rank": "ray::TrainActor",
    "engine actor": "ray::EngineActor",
    "engine server": "rlpost.backends.cpu_engine",
    "router": "sglang::router",
}


def is_loopback(host: str) -> bool:
    address = ipaddress.ip_address(host.split("%", 1)[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def run_processes(root: int) -> set[int]:
    """The launch, its session, and every descendant (engine servers have sessions of
    their own)."""
    import psutil

    found = {root}
    for process in psutil.process_iter(["pid"]):
        with contextlib.suppress(OSError):
            if os.getsid(process.info["pid"]) == root:
                found.add(process.info["pid"])
    while True:
        more = {
            p.info["pid"]
            for p in psutil.process_iter(["pid", "ppid"])
            if p.info["ppid"] in found and p.info["pid"] not in found
        }
        if not more:
            return found
        found |= more


def listeners(root: int) -> dict[tuple[str, int], str]:
    """(address, port) -> the command line of the process listening there."""
    import psutil

    found = {}
    for pid in run_processes(root):
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)
            name = " ".join(process.cmdline())
            for conn in process.net_connections("inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found[(conn.laddr.ip, conn.laddr.port)] = name
    return found


def test_a_one_node_run_listens_on_loopback_only(tmp_path: Path) -> None:
    pytest.importorskip("psutil")
    run_dir = tmp_path / "run"
    log = tmp_path / "run.log"
    command = [
        sys.executable,
        str(ROOT / "launch.py"),
        "recipe.rollout.num_rollout=1000",
        "run.progress=false",
        f"run.dir={run_dir}",
        f"hydra.run.dir={tmp_path / 'hydra'}",
    ]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    with log.open("w") as out:
        proc = subprocess.Popen(
            command, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    seen: dict[tuple[str, int], str] = {}
    try:
        deadline = time.monotonic() + 300
        # trained once (metrics written): every server has started; then a few more looks,
        # for Ray's processes that start their servers late (monitor, dashboard: seconds
        # after Ray starts, and training starts some 15 s after that)
        while not (run_dir / "metrics.jsonl").is_file():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            seen |= listeners(proc.pid)
            time.sleep(1)
        for _ in range(5):
            seen |= listeners(proc.pid)
            time.sleep(1)
    finally:
        for pid in run_processes(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=60)
    names = list(seen.values())
    missing = [what for what, part in EXPECTED.items() if not any(part in n for n in names)]
    assert not missing, f"no listening {missing} seen: {sorted(seen)}"
    outside = {
        f"{host}:{port}": name[:120]
        for (host, port), name in seen.items()
        if not is_loopback(host) and not name.startswith(tuple(LISTENERS_OFF_LOOPBACK))
    }
    assert not outside, f"{len(outside)} of {len(seen)} listening sockets off loopback: {outside}"
