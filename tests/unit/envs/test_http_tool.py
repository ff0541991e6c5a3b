"""The HTTP tool environment against a local service: answers, retries on transient failures
with backoff, no retry on a refused request, timeouts, and an error text the model can read
when the service fails for good; then whole episodes against a real CPU engine serving the
shipped model, the tool answering over HTTP."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from aiohttp import web
from transformers import AutoTokenizer

from rlpost.backends.cpu_engine.engine import EngineSettings
from rlpost.backends.cpu_engine.server import BackgroundServer
from rlpost.envs.calculator import calculate
from rlpost.envs.http_tool import ToolService, call_service, check_settings, generate
from rlpost.runtime.rollout.client import EngineClient
from rlpost.runtime.rollout.context import ContextFactory
from rlpost.runtime.rollout.manager import GroupRunner, SamplingSettings
from rlpost.types import Sample, SampleStatus

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MODEL = Path(__file__).resolve().parents[3] / "rlpost" / "assets" / "qwen3-tiny"


@asynccontextmanager
async def service(handler: Handler) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/tool", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}/tool"
    finally:
        await runner.cleanup()


def call(handler: Handler, **settings: Any) -> str:
    return timed_call(handler, **settings)[0]


def timed_call(handler: Handler, **settings: Any) -> tuple[str, float]:
    """The tool's answer, and how long the call took (the service's shutdown left out)."""

    async def scenario() -> tuple[str, float]:
        async with service(handler) as url:
            tool = ToolService.from_settings({"url": url, "backoff_s": 0.01, **settings})
            started = time.monotonic()
            answer = await call_service(tool, {"query": "q", "top_k": 3})
            return answer, time.monotonic() - started

    return asyncio.run(scenario())


def test_the_service_answers_with_every_extra_setting_in_the_request() -> None:
    seen: list[dict[str, Any]] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(await request.json())
        return web.json_response({"result": "42"})

    assert call(handler) == "42"
    assert seen == [{"query": "q", "top_k": 3}]


def test_transient_failures_are_retried_with_backoff() -> None:
    stamps: list[float] = []

    async def flaky(request: web.Request) -> web.Response:
        stamps.append(time.monotonic())
        if len(stamps) <= 2:
            return web.Response(status=503, text="warming up")
        return web.json_response({"result": "ok"})

    assert call(flaky, max_retries=3, backoff_s=0.05) == "ok"
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    assert len(stamps) == 3 and gaps[1] >= 0.09  # the second wait is doubled


def test_a_refused_request_is_not_retried_and_the_model_reads_why() -> None:
    calls = 0

    async def refuses(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        return web.Response(status=400, text="query too long")

    answer = call(refuses, max_retries=3)
    assert calls == 1
    assert answer.startswith("error: the tool service failed (HTTP 400: query too long")


def test_a_service_that_hangs_times_out_each_attempt() -> None:
    async def hangs(request: web.Request) -> web.Response:
        await asyncio.sleep(1.5)
        return web.json_response({"result": "late"})

    answer, seconds = timed_call(hangs, timeout_s=0.2, max_retries=1)
    assert answer == "error: the tool service failed (TimeoutError)"
    # two attempts of 0.2 s and one short backoff; one attempt left to hang takes 1.5 s
    assert 0.4 <= seconds < 1.5


def test_settings_are_checked_before_anything_starts() -> None:
    problems = check_settings({"url": "search:8000", "timeout_s": 0, "max_retries": -1})
    assert [name for name, _, _ in problems] == ["url", "timeout_s", "max_retries"]
    assert check_settings({"url": "http://127.0.0.1:1/x"}) == []


# ---- whole episodes ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine_url() -> Iterator[str]:
    threads = torch.get_num_threads()
    server = BackgroundServer(EngineSettings(model_path=str(MODEL), num_threads=1))
    yield server.start()
    server.stop()
    torch.set_num_threads(threads)


def test_episodes_call_the_tool_over_http_and_train_only_the_policy_turns(
    engine_url: str,
) -> None:
    """The shipped model writes <calc>a*b</calc> for a product; here a calculator service
    answers over HTTP (its first answer to each call after a 503)."""
    tokenizer = AutoTokenizer.from_pretrained(MODEL, local_files_only=True)
    queries: list[dict[str, Any]] = []

    async def calculator(request: web.Request) -> web.Response:
        body = await request.json()
        queries.append(body)
        if len(queries) % 2:
            return web.Response(status=503)
        return web.json_response({"result": calculate(body["query"])})

    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 23*47?"}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer.encode(text, add_special_tokens=False)

    async def scenario() -> list[Sample]:
        async with service(calculator) as url, EngineClient(engine_url) as client:
            settings = {"url": url, "open_tag": "<calc>", "close_tag": "</calc>"}
            settings |= {"backoff_s": 0.01, "max_retries": 2}
            contexts = ContextFactory(tokenizer=tokenizer, max_turns=2, settings=settings)
            runner = GroupRunner(client, zero, generate, "rlpost.envs.http_tool.generate", contexts)
            group = [Sample(0, i, "p", list(ids)) for i in range(4)]
            params = SamplingSettings(max_new_tokens=56, temperature=0.3).to_sglang()
            return await runner.run(group, params, runner.client_for(group))

    group = asyncio.run(scenario())
    answered = [s for s in group if s.turns == 2]
    assert answered, [s.response_text for s in group]
    for sample in answered:
        assert sample.status is SampleStatus.COMPLETED
        assert "<|im_start|>tool\n1081<|im_end|>" in sample.response_text
        masked = [t for t, m in zip(sample.response_ids, sample.loss_mask, strict=True) if not m]
        assert tokenizer.decode(masked).startswith("\n<|im_start|>tool\n1081")
    assert {q["query"] for q in queries} == {"23*47"}
    assert all(q["turn"] == 1 and q["evaluation"] is False for q in queries)


async def zero(samples: list[Sample]) -> list[float]:
    return [0.0] * len(samples)
