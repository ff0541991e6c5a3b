"""Two launches on one machine: each one's engines answer only its own key.

Real engine processes (started as a run starts them, the key in their environment), the
real sglang-router, and the rollout client that rollout, weight sync and the engine pool use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlpost.backends.engine_key import ENGINE_KEY_ENV, new_engine_key
from rlpost.backends.sglang.launch import EngineSpec
from rlpost.backends.sglang.process import EngineProcess, free_port
from rlpost.runtime.rollout.client import EngineClient, EngineRequestError
from rlpost.runtime.router import Router, RouterSettings

PROMPT = [40, 41, 42, 43]
GREEDY = {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True}
Launch = tuple[str, str, EngineProcess]  # key, url, process


def start_engine(model_dir: Path, logs: Path, name: str) -> Launch:
    spec = EngineSpec(
        index=0, backend="cpu", model_path=str(model_dir), host="127.0.0.1",
        port=free_port("127.0.0.1"), seed=0, log_path=str(logs / f"{name}.log"),
        startup_timeout_s=120, num_threads=1,
    )  # fmt: skip
    key = new_engine_key()
    process = EngineProcess(spec, {ENGINE_KEY_ENV: key})
    return key, process.start(), process  # start() health-checks with the key


@pytest.fixture(scope="module")
def launches(tiny_lm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Launch]]:
    logs = tmp_path_factory.mktemp("engine_key_logs")
    started: list[Launch] = []
    try:
        for name in ("a", "b"):
            started.append(start_engine(tiny_lm_dir, logs, name))
        yield started
    finally:
        for _, _, process in started:
            process.stop()


def test_a_launch_cannot_drive_another_launchs_engine(
    launches: list[Launch], tiny_lm_dir: Path
) -> None:
    (key_a, url_a, _), (key_b, url_b, _) = launches
    assert key_a != key_b

    async def check() -> None:
        async with EngineClient(url_a, worker_urls=[url_a], key=key_a) as a:
            # Its own engine serves it.
            assert len((await a.generate_on(url_a, PROMPT, GREEDY)).output_ids) == 4
            assert await a.health_status(url_a, "/health", 10) == 200
            # The other launch's engine refuses generation, control calls and weight
            # updates, and fails its health check (the engine pool's test of an engine).
            assert await a.health_status(url_b, "/health", 10) == 401
            with pytest.raises(EngineRequestError) as refused:
                await a.generate_on(url_b, PROMPT, GREEDY)
            assert refused.value.status == 401
            for call in (
                a.pause(worker_urls=[url_b]),
                a.continue_generation(worker_urls=[url_b]),
                a.update_weights_from_disk(str(tiny_lm_dir), "v9", worker_urls=[url_b]),
                a.get_weight_version(url_b),
            ):
                with pytest.raises(EngineRequestError):
                    await call
        async with EngineClient(url_b, worker_urls=[url_b], key=key_b) as b:
            assert await b.get_weight_version(url_b) == "default"  # nothing reached it

    asyncio.run(check())


def test_the_key_stays_off_command_lines_and_logs(launches: list[Launch]) -> None:
    for key, _, process in launches:
        pid = process.pid()
        assert pid is not None
        assert key not in Path(f"/proc/{pid}/cmdline").read_text()
        assert key not in Path(process.spec.log_path).read_text()


def test_the_router_with_the_key_routes_to_keyed_engines(
    launches: list[Launch], tmp_path: Path
) -> None:
    key, url, _ = launches[0]
    log = tmp_path / "router.log"
    settings = RouterSettings(log_path=str(log), request_timeout_s=60, engine_key=key)
    assert key not in repr(settings)
    with Router(settings) as router:
        router.add_worker(url)
        router.wait_ready(1, timeout_s=60)
        assert router._process is not None
        assert key not in Path(f"/proc/{router._process.pid}/cmdline").read_text()

        async def check() -> None:
            async with EngineClient(router.url, key=key) as client:
                results = await client.generate_batch([PROMPT] * 3, GREEDY)
                assert [len(r.output_ids) for r in results] == [4, 4, 4]
            async with EngineClient(router.url, max_attempts=1) as keyless:
                with pytest.raises(EngineRequestError):
                    await keyless.generate_batch([PROMPT], GREEDY)

        asyncio.run(check())
    assert key not in log.read_text()
