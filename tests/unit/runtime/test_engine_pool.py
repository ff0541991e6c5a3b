"""The engine pool over two real CPU engine processes behind the real router: health checks,
restarts of a hung engine, and memory release/resume (the colocated path, on CPU)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from rlpost.backends.sglang.launch import EngineSpec
from rlpost.backends.sglang.process import free_port
from rlpost.runtime.engine_pool import EnginePool, HealthSettings, LocalEngine
from rlpost.runtime.rollout.client import EngineClient, EngineRequestError, FinishKind
from rlpost.runtime.router import Router, RouterSettings

T = TypeVar("T")
PROMPT = [40, 41, 42, 43]
GREEDY = {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True}
RELEASE = (("kv_cache",), ("cuda_graph",), ("weights",))


def engine(index: int, model_dir: Path, logs: Path) -> LocalEngine:
    spec = EngineSpec(
        index=index, backend="cpu", model_path=str(model_dir), host="127.0.0.1",
        port=free_port("127.0.0.1"), seed=index, log_path=str(logs / f"engine_{index}.log"),
        startup_timeout_s=120, num_threads=1,
    )  # fmt: skip
    return LocalEngine(spec, stop_grace_s=2)


async def catch_up(client: EngineClient, url: str) -> None:
    """What the session does for a restarted engine, reduced to its version label."""
    await client.post(url, "/update_weight_version", {"new_version": "7"})


@dataclass
class Rig:
    loop: asyncio.AbstractEventLoop
    pool: EnginePool
    client: EngineClient
    router: Router

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)


@pytest.fixture(scope="module")
def rig(tiny_lm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """Two engines in a pool, the router and a client, on one event loop in a thread (the
    pool's locks and the client's connections belong to one loop)."""
    logs = tmp_path_factory.mktemp("pool_logs")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    health = HealthSettings(enabled=True, interval_s=0.2, timeout_s=2.0, first_wait_s=0.0)
    pool = EnginePool([engine(i, tiny_lm_dir, logs) for i in range(2)], health)
    router = Router(RouterSettings(log_path=str(logs / "router.log"), request_timeout_s=60))

    async def connect() -> EngineClient:
        urls = await pool.start()
        router.start()
        for url in urls:
            router.add_worker(url)
        await asyncio.to_thread(router.wait_ready, 2)
        client = EngineClient(router.url, worker_urls=urls)
        pool.connect(router, client, lambda url: catch_up(client, url))
        return client

    rig = Rig(loop, pool, None, router)  # type: ignore[arg-type]
    try:
        rig.client = rig.run(connect())
        yield rig
    finally:
        router.stop()
        rig.run(pool.stop())
        if rig.client is not None:
            rig.run(rig.client.close())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def test_a_hung_engine_is_restarted_caught_up_and_registered_again(rig: Rig) -> None:
    pool, client = rig.pool, rig.client
    before = len(pool.restarts)

    async def scenario() -> None:
        assert await pool.check() == []  # both healthy: nothing happens
        hung_pid = await pool.engines[1].pid()
        assert hung_pid is not None
        os.kill(hung_pid, signal.SIGSTOP)  # alive but answering nothing: hung
        pool.start_monitor(asyncio.get_running_loop())
        async with asyncio.timeout(90):
            while len(pool.restarts) == before:
                await asyncio.sleep(0.1)
        await pool.stop_monitor()
        (restart,) = pool.restarts[before:]
        assert restart.index == 1 and "no answer" in restart.reason
        assert await pool.engines[1].pid() != hung_pid
        # back in the router and in the client's control list, at the others' version
        assert sorted(await client.worker_urls()) == sorted(pool.urls)
        workers = {w.url.rstrip("/"): w.is_healthy for w in rig.router.workers()}
        assert workers == dict.fromkeys(pool.urls, True)
        assert await client.get_weight_version(pool.urls[1]) == "7"
        results = [await client.generate(PROMPT, GREEDY) for _ in range(4)]
        assert all(r.output_ids for r in results)

    rig.run(scenario())


def test_released_engines_stay_out_of_generation_until_resumed(rig: Rig) -> None:
    pool, client = rig.pool, rig.client

    async def scenario() -> None:
        url = pool.urls[0]
        async with pool.exclusive():
            await pool.release_memory(RELEASE)
        assert pool.released
        with pytest.raises(EngineRequestError, match="503"):
            await client.generate_on(url, PROMPT, GREEDY)
        # released engines are only checked for being alive: no restart
        assert await pool.check() == []
        async with pool.exclusive():
            await pool.resume_memory([("weights",)], done=False)
            assert (await client.generate_on(url, PROMPT, GREEDY)).output_ids
            await pool.resume_memory([("kv_cache",), ("cuda_graph",)], done=True)
        assert not pool.released
        # a released engine whose process died is found and restarted
        async with pool.exclusive():
            await pool.release_memory(RELEASE)
        dead = await pool.engines[0].pid()
        assert dead is not None
        os.kill(dead, signal.SIGKILL)
        while await pool.engines[0].alive():
            await asyncio.sleep(0.02)
        (restart,) = await pool.check()
        assert restart.index == 0 and "exited" in restart.reason
        # it comes back with its memory; the other one is still released until resumed
        assert (await client.generate_on(pool.urls[0], PROMPT, GREEDY)).output_ids
        async with pool.exclusive():
            await pool.resume_memory([("weights",), ("kv_cache",), ("cuda_graph",)], done=True)
        assert (await client.generate_on(pool.urls[1], PROMPT, GREEDY)).output_ids

    rig.run(scenario())


def test_the_requests_of_an_engine_stopped_for_a_restart_are_answered_by_the_other(
    rig: Rig,
) -> None:
    """Stopping an engine (SIGTERM) answers its open requests 503, which the router sends to
    the other engine: each comes back whole, and nothing counts as an abort rlpost asked for,
    so an engine's own abort while it restarts another is still told apart."""
    pool, client = rig.pool, rig.client
    params = {"max_new_tokens": 200, "temperature": 0.0, "ignore_eos": True}

    async def scenario() -> None:
        leaving = pool.urls[0]
        tasks = [asyncio.create_task(client.generate(PROMPT, params)) for _ in range(4)]
        async with asyncio.timeout(30):
            while await client.num_requests([leaving]) == 0:
                await asyncio.sleep(0.01)
        # held between two steps until it stops, so they are running when it does
        await client.post(leaving, "/pause_generation", {"mode": "in_place"})
        mark = client.abort_mark()
        async with pool.exclusive():
            assert await pool.restart(0, "stopped for a test") is not None
        results = await asyncio.gather(*tasks)
        assert all(r.finish_reason is FinishKind.LENGTH for r in results)
        assert all(len(r.output_ids) == 200 for r in results)
        assert not client.asked_abort_since(mark)

    rig.run(scenario())


def test_an_engine_in_a_crash_loop_is_given_up_after_its_restarts(
    tiny_lm_dir: Path, tmp_path: Path
) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_lm_dir, model)
    health = HealthSettings(enabled=True, timeout_s=2.0, first_wait_s=0.0, max_restarts=1)
    pool = EnginePool([engine(0, model, tmp_path)], health)

    async def scenario() -> None:
        (url,) = await pool.start()
        async with EngineClient(url, worker_urls=[url]) as client:
            pool.connect(None, client)  # type: ignore[arg-type]  # no router to keep
            model.rename(tmp_path / "moved")  # from now on every start dies at load
            pid = await pool.engines[0].pid()
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            assert await pool.heal() == []  # the restart failed: out of service, counted
            assert pool.exhausted is None and not pool.serving_urls
            assert await pool.heal() == []  # one restart allowed: now it is given up
            assert list(pool.given_up) == [0]
            assert "its last restart failed: EngineStartError" in pool.given_up[0]
            assert pool.exhausted is not None
            assert "engine.max_restarts_per_engine=1" in pool.exhausted
            starts = pool.engines[0].process.starts  # type: ignore[attr-defined]
            assert await pool.heal() == []  # never tried again
            assert pool.engines[0].process.starts == starts  # type: ignore[attr-defined]
        await pool.stop()

    asyncio.run(scenario())


async def _kill_when_started(local: LocalEngine) -> int:
    """SIGKILL the engine's process as soon as it exists (it is then loading)."""
    while (pid := local.process.pid()) is None or not local.process.is_alive():
        await asyncio.sleep(0.005)
    os.kill(pid, signal.SIGKILL)
    return pid


def test_an_engine_killed_while_starting_or_in_its_grace_is_started_again(
    tiny_lm_dir: Path, tmp_path: Path
) -> None:
    """A dead engine never answers, so its first-wait grace does not shield it."""
    health = HealthSettings(enabled=True, timeout_s=2.0, first_wait_s=300.0, max_restarts=2)
    local = engine(0, tiny_lm_dir, tmp_path)
    pool = EnginePool([local], health)

    async def scenario() -> None:
        starting = asyncio.create_task(pool.start())
        killed = await _kill_when_started(local)
        (url,) = await starting
        assert local.process.starts == 2 and await local.pid() != killed
        async with EngineClient(url, worker_urls=[url]) as client:
            pool.connect(None, client)  # type: ignore[arg-type]  # no router to keep
            assert await pool.dead() == {}
            assert await pool.check() == []  # in its grace and alive: left alone
            pid = await local.pid()
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            while await local.alive():
                await asyncio.sleep(0.02)
            assert "server process is gone" in (await pool.dead())[0]
            (restart,) = await pool.check()  # still in its grace, but dead: restarted
            assert restart.index == 0 and "exited" in restart.reason
            assert (await client.generate_on(pool.urls[0], PROMPT, GREEDY)).output_ids
        await pool.stop()

    asyncio.run(scenario())


def test_without_fault_tolerance_an_engine_killed_while_starting_fails_the_start(
    tiny_lm_dir: Path, tmp_path: Path
) -> None:
    """Nothing restarts it: the start fails, saying the engine was killed (a fault the run's
    own restarts can mend, rlpost.runtime.failures)."""
    from rlpost.backends.sglang.process import EngineStartError
    from rlpost.runtime.failures import killed_while_starting

    local = engine(0, tiny_lm_dir, tmp_path)
    pool = EnginePool([local], HealthSettings())

    async def scenario() -> None:
        starting = asyncio.create_task(pool.start())
        await _kill_when_started(local)
        with pytest.raises(EngineStartError) as failed:
            await starting
        assert failed.value.killed and killed_while_starting(failed.value)
        assert local.process.starts == 1
        await pool.stop()

    asyncio.run(scenario())
    assert not killed_while_starting(EngineStartError("exited with 1", returncode=1))
