"""The real loop on the embedded CPU default: Ray, the router, engine servers, the trainer.

While it runs, every listening socket of every process of the default run (Ray's GCS,
raylet, workers and agents, the router, the engine servers, the train ranks) is listed with
psutil: a one-node run listens on loopback only. Any socket off loopback fails the test
unless LISTENERS_OFF_LOOPBACK names it, as the README's "Secrets and sockets" does, with the
reason.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rlpost.runtime.rollout_dump import dump_path, read_rollout

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = (
    "rollout_id",
    "rollout/reward_mean",
    "rollout/num_samples",
    "train/loss",
    "train/entropy",
    "perf/step_time_s",
    "perf/rollout_tokens_per_s",
    "perf/memory_vs_plan",  # each run checks the plan (rlpost.backends.step_perf)
    "perf/train_time_vs_plan",
)

pytestmark = pytest.mark.integration

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


def start(hydra_dir: Path, *overrides: str) -> subprocess.Popen[str]:
    """A launch whose run directory is left to Hydra (run.dir unset): `hydra_dir`."""
    command = [
        sys.executable, str(ROOT / "launch.py"), f"hydra.run.dir={hydra_dir}",
        "run.progress=false", *overrides,
    ]  # fmt: skip
    return subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(proc: subprocess.Popen[str], timeout_s: float = 300) -> tuple[str, str]:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    return out, err


def read_metrics(run_dir: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_two_launches_at_once_the_default_and_an_async_decoupled_run_both_finish(
    tmp_path: Path,
) -> None:
    """Started in the same moment with the same default run directory: the second takes
    <dir>-2, and each has its own Ray cluster, ports and files. One is the colocated
    default (rollouts, training, eval); the other runs decoupled, one step off (async:
    rollout N+1 is generated while rollout N trains)."""
    shared = tmp_path / "run"
    # the default's KL weighs nothing (kl_loss_coef 0): logged every 2nd rollout on request
    default = start(
        shared,
        "recipe.rollout.num_rollout=3",
        "recipe.eval.interval=2",
        "recipe.algo.kl_metric_interval=2",
    )
    decoupled = start(
        shared,
        "layout.colocate=false",
        "layout.train.num_gpus=1",
        "layout.rollout.num_gpus=1",
        "recipe.loop.mode=async",
        "recipe.rollout.num_rollout=3",
        "recipe.eval.interval=null",
        "recipe.eval.datasets=[]",
        "tracking.tensorboard=false",
        "run.dump_rollouts=true",
    )
    with ThreadPoolExecutor(2) as pipes:  # their output read while the sockets are listed
        finished = [pipes.submit(finish, launch) for launch in (default, decoupled)]
        listening = listeners_while_running(default)
        (default_out, _), (decoupled_out, _) = (f.result() for f in finished)
    check_loopback_only(listening)
    dirs = {
        out.rsplit("run directory: ", 1)[1].strip(): out for out in (default_out, decoupled_out)
    }
    assert set(dirs) == {str(shared), f"{shared}-2"}, list(dirs)
    default_dir = Path(next(d for d, out in dirs.items() if out is default_out))
    decoupled_dir = Path(next(d for d, out in dirs.items() if out is decoupled_out))

    records = read_metrics(default_dir)
    assert [r["rollout_id"] for r in records] == [0, 1, 2]
    for record in records:
        assert set(REQUIRED) <= set(record), set(REQUIRED) - set(record)
        assert record["rollout/num_samples"] == 64
        assert 0.0 <= record["rollout/reward_mean"] <= 1.0
        assert record["train/optimizer_steps"] == 1
        # fp32 engines and an fp32 trainer on the same weights agree on every token (the
        # figure FP8 rollout is compared with: tests/integration/test_fp8_rollout.py)
        assert record["train/rollout_logprob_abs_diff"] < 1e-4
    assert ["train/kl" in r for r in records] == [True, False, True]
    assert records[2]["train/kl"] > 0.0  # the policy has moved from the reference
    # eval before training (logged with rollout 0), after rollout 2 (interval) and at the end
    assert all("eval/arith/accuracy" in records[i] for i in (0, 1, 2))
    assert "eval accuracy" in default_out
    assert (default_dir / "tensorboard").is_dir() and (default_dir / "config.yaml").is_file()
    # the engines serve the last pushed weights: only the newest version is kept on disk
    assert sorted(p.name for p in (default_dir / "weights").iterdir()) == ["v3"]
    # each train rank's log under the run's logs: its own process's, to its last step
    placed = json.loads((default_dir / "placement.json").read_text())["processes"]
    ranks = [p for p in placed if p["role"] == "train"]
    assert len(ranks) == 2
    for rank in ranks:
        text = (default_dir / "logs" / f"train_rank_{rank['rank']}.log").read_text()
        assert f"train rank {rank['rank']} starts (pid {rank['pid']} on " in text, text
        assert "trainer built" in text and text.count("a train step on 64 samples") == 3, text

    records = read_metrics(decoupled_dir)
    assert [r["rollout_id"] for r in records] == [0, 1, 2]
    for record in records:
        assert record["rollout/num_samples"] == 64 and math.isfinite(record["train/loss"])
        assert "train/kl" not in record  # the reference is neither loaded nor run
        assert record["rollout/staleness_max"] <= 1
    assert records[0]["rollout/staleness_max"] == 0  # nothing was trained before it
    assert any(r["rollout/staleness_max"] == 1 for r in records)  # generated during a step
    # run.dump_rollouts: each rollout's samples as trained, one line each (rollout_dump.py)
    for record in records:
        samples = read_rollout(dump_path(decoupled_dir, int(record["rollout_id"])))
        assert len(samples) == record["rollout/num_samples"]
        assert [s["group_index"] for s in samples] == sorted(s["group_index"] for s in samples)
        for s in samples:
            assert s["reward"] is not None and s["status"] in ("completed", "truncated")
            assert len(s["response_ids"]) == len(s["rollout_logprobs"]) == len(s["loss_mask"])
        tokens = sum(sum(s["loss_mask"]) for s in samples)
        assert tokens == record["rollout/response_tokens"]
    assert not (default_dir / "rollouts").exists()  # off by default


def listeners_while_running(launch: subprocess.Popen[str]) -> dict[tuple[str, int], str]:
    """Every listening socket of the launch's processes, listed once a second until it ends
    (Ray's monitor and dashboard start their servers seconds after Ray does)."""
    seen: dict[tuple[str, int], str] = {}
    while launch.poll() is None:
        seen |= listeners(launch.pid)
        time.sleep(1)
    return seen


def check_loopback_only(seen: dict[tuple[str, int], str]) -> None:
    names = list(seen.values())
    missing = [what for what, part in EXPECTED.items() if not any(part in n for n in names)]
    assert not missing, f"no listening {missing} seen: {sorted(seen)}"
    outside = {
        f"{host}:{port}": name[:120]
        for (host, port), name in seen.items()
        if not is_loopback(host) and not name.startswith(tuple(LISTENERS_OFF_LOOPBACK))
    }
    assert not outside, f"{len(outside)} of {len(seen)} listening sockets off loopback: {outside}"
