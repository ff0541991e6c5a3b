"""The real sglang-router in front of two CPU engine processes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import rlpost
from rlpost.backends.cpu_engine.engine import EngineSettings
from rlpost.backends.cpu_engine.server import BackgroundServer
from rlpost.runtime.rollout.client import EngineClient, FinishKind, GenerateResult
from rlpost.runtime.router import Router, RouterSettings, free_port, http_json

PROMPT = [40, 41, 42, 43]
REPO_ROOT = Path(rlpost.__file__).resolve().parent.parent
Cluster = tuple[Router, list[str], subprocess.Popen[bytes]]


def start_engine(model_dir: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [
        sys.executable, "-m", "rlpost.backends.cpu_engine", "--model-path", str(model_dir),
        "--host", "127.0.0.1", "--port", str(port), "--num-threads", "1", "--batch-wait-ms", "20",
    ]  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)


def wait_healthy(url: str, process: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"engine {url} exited with {process.returncode}"
        try:
            if http_json("GET", f"{url}/health", timeout_s=2)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"engine {url} not healthy after {timeout_s} s")


@pytest.fixture(scope="module")
def cluster(tiny_lm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two engines behind the router: a separate process (so that it can be killed) and one
    in this process (which has torch imported already, so it starts fast)."""
    logs = tmp_path_factory.mktemp("router_logs")
    port = free_port()
    process = start_engine(tiny_lm_dir, port, logs / "engine.log")
    threads = torch.get_num_threads()
    local = BackgroundServer(EngineSettings(model_path=str(tiny_lm_dir), num_threads=1))
    router = Router(RouterSettings(log_path=str(logs / "router.log"), request_timeout_s=60))
    urls = [f"http://127.0.0.1:{port}"]
    try:
        router.start()
        urls.append(local.start())
        wait_healthy(urls[0], process)
        for url in urls:
            router.add_worker(url)
        router.wait_ready(2, timeout_s=60)
        yield router, urls, process
    finally:
        router.stop()
        local.stop()
        torch.set_num_threads(threads)
        if process.poll() is None:
            process.terminate()
            process.wait(10)


def served(url: str) -> int:
    return int(http_json("GET", f"{url}/server_info")[1]["internal_states"][0]["num_served_reqs"])


def test_settings_reject_unknown_policy() -> None:
    with pytest.raises(ValueError, match="round_robin"):
        RouterSettings(policy="fastest")


def test_round_robin_spreads_requests_over_both_engines(cluster: Cluster) -> None:
    router, urls, _ = cluster
    before = [served(u) for u in urls]
    params = {"max_new_tokens": 3, "temperature": 0.0}

    async def scenario() -> list[GenerateResult]:
        async with EngineClient(router.url) as client:
            assert sorted(await client.worker_urls()) == sorted(urls)
            results = [await client.generate(PROMPT, params) for _ in range(8)]
            assert {await client.get_weight_version(u) for u in urls} == {"default"}
            await client.abort_all()
            return results

    results = asyncio.run(scenario())
    assert all(r.finish_reason is not FinishKind.ABORT for r in results)
    assert len({tuple(r.output_ids) for r in results}) == 1
    gained = [served(u) - b for u, b in zip(urls, before, strict=True)]
    assert gained == [4, 4]


def test_control_calls_are_not_forwarded_by_the_router(cluster: Cluster) -> None:
    router, _, _ = cluster
    assert http_json("POST", f"{router.url}/abort_request", {"abort_all": True})[0] == 404
    assert http_json("GET", f"{router.url}/get_weight_version")[0] == 404


def test_router_retries_on_the_other_engine_after_a_kill(cluster: Cluster) -> None:
    router, urls, process = cluster
    params = {"max_new_tokens": 150, "temperature": 0.0, "ignore_eos": True}
    survivor_before = served(urls[1])

    async def scenario() -> list[GenerateResult]:
        # One attempt per request: any recovery below is the router's own retry.
        async with EngineClient(router.url, max_attempts=1) as client:
            tasks = [asyncio.create_task(client.generate(PROMPT, params)) for _ in range(8)]
            deadline = time.monotonic() + 30
            while await client.num_requests(urls[:1]) == 0:
                assert time.monotonic() < deadline, "no request reached the first engine"
                await asyncio.sleep(0.01)
            os.kill(process.pid, signal.SIGKILL)
            return await asyncio.gather(*tasks)

    results = asyncio.run(scenario())
    process.wait(10)
    assert all(r.finish_reason is FinishKind.LENGTH for r in results)
    assert all(len(r.output_ids) == 150 for r in results)
    # Round-robin gave the survivor 4 of the 8; it also ran what the killed engine had.
    assert served(urls[1]) - survivor_before > 4
    assert router.remove_worker(urls[0])
    deadline = time.monotonic() + 10
    while [w.url for w in router.workers()] != [urls[1]]:
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_a_router_killed_while_it_starts_is_a_fault_one_that_fails_is_not(
    tmp_path: Path,
) -> None:
    """SIGKILL before the router answers: a restart may well succeed (the run restarts from
    its checkpoint). A router that exits by itself at start-up fails the same way again."""
    from rlpost.runtime.failures import killed_while_starting
    from rlpost.runtime.router import RouterError

    router = Router(RouterSettings(log_path=str(tmp_path / "router.log"), startup_timeout_s=60))
    killer_done: list[int] = []

    def kill_once_started() -> None:
        deadline = time.monotonic() + 30
        while router._process is None and time.monotonic() < deadline:
            time.sleep(0.001)
        if router._process is not None:
            os.kill(router._process.pid, signal.SIGKILL)
            killer_done.append(router._process.pid)

    killer = threading.Thread(target=kill_once_started)
    killer.start()
    try:
        with pytest.raises(RouterError) as killed:
            router.start()
    finally:
        killer.join()
        router.stop()
    assert killer_done, "the router process never appeared"
    assert killed.value.killed and killed.value.returncode == -signal.SIGKILL
    assert killed_while_starting(killed.value) == "router"

    refused = RouterError("sglang-router exited with code 2 at startup", returncode=2)
    assert not refused.killed and killed_while_starting(refused) is None


def test_a_request_on_an_engine_that_shuts_down_is_answered_by_another(
    cluster: Cluster, tiny_lm_dir: Path
) -> None:
    """An engine stopped from outside (SIGTERM: serve's stop event, the same shut_down as
    here) answers its open requests 503; the router re-sends them to another engine and the
    client gets a whole answer, not the stopped engine's partial output."""
    router, _, _ = cluster
    params = {"max_new_tokens": 150, "temperature": 0.0, "ignore_eos": True}
    leaving = BackgroundServer(EngineSettings(model_path=str(tiny_lm_dir), num_threads=1))
    try:
        leaving_url = leaving.start()
        router.add_worker(leaving_url)
        deadline = time.monotonic() + 30
        while not any(w.url == leaving_url and w.is_healthy for w in router.workers()):
            assert time.monotonic() < deadline, "the engine did not join the router"
            time.sleep(0.1)

        async def scenario() -> list[GenerateResult]:
            # One attempt per request: any recovery below is the router's own retry.
            async with EngineClient(router.url, max_attempts=1) as client:
                tasks = [asyncio.create_task(client.generate(PROMPT, params)) for _ in range(6)]
                deadline = time.monotonic() + 30
                while await client.num_requests([leaving_url]) == 0:
                    assert time.monotonic() < deadline, "no request reached the engine"
                    await asyncio.sleep(0.01)
                await asyncio.to_thread(leaving.stop)
                return await asyncio.gather(*tasks)

        results = asyncio.run(scenario())
        assert all(r.finish_reason is FinishKind.LENGTH for r in results)
        assert all(len(r.output_ids) == 150 for r in results)
    finally:
        leaving.stop()
        if leaving.port:
            router.remove_worker(leaving.url)
