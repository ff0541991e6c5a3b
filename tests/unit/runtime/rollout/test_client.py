"""The rollout HTTP client against a real CPU engine (standing in for router and worker)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from rlpost.runtime.rollout.client import (
    EngineClient,
    EngineRequestError,
    FinishKind,
    GenerateResult,
    parse_generate_response,
)
from rlpost.runtime.router import free_port, http_json

T = TypeVar("T")
PROMPT = [40, 41, 42, 43]
GREEDY = {"max_new_tokens": 5, "temperature": 0.0, "ignore_eos": True}
LONG = {"max_new_tokens": 240, "temperature": 0.0, "ignore_eos": True}


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def client_for(url: str, **kwargs: Any) -> EngineClient:
    return EngineClient(url, worker_urls=[url], **kwargs)


async def until_running(client: EngineClient, url: str, count: int) -> None:
    deadline = time.monotonic() + 20
    while await client.num_requests([url]) < count:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)


def test_generate_parses_the_sglang_answer(url: str) -> None:
    async def scenario() -> list[GenerateResult]:
        async with client_for(url, max_concurrency=3) as client:
            return await asyncio.gather(*(client.generate(PROMPT, GREEDY) for _ in range(8)))

    results = run(scenario())
    first = results[0]
    assert first.finish_reason is FinishKind.LENGTH and first.finish_reason == "length"
    assert len(first.output_ids) == len(first.output_logprobs) == first.completion_tokens == 5
    assert first.prompt_tokens == 4 and first.weight_version == "default"
    assert all(r.output_ids == first.output_ids for r in results)


def test_a_batch_answers_each_prompt_in_order_and_names_it_after_the_rid(url: str) -> None:
    prompts = [PROMPT, PROMPT[:2], [7, 8, 9]]

    async def scenario() -> list[list[GenerateResult]]:
        # 4 batches of 3 against 3 slots: each holds every slot in turn, none waits forever
        async with client_for(url, max_concurrency=3) as client:
            batches = (client.generate_batch(prompts, GREEDY, rid=f"b{i}") for i in range(4))
            return list(await asyncio.gather(*batches))

    answers = run(scenario())
    for i, batch in enumerate(answers):
        assert [r.prompt_tokens for r in batch] == [4, 2, 3]
        assert [r.rid for r in batch] == [f"b{i}_{j}" for j in range(3)]
        assert all(len(r.output_ids) == len(r.output_logprobs) == 5 for r in batch)
    assert answers[0][0].output_ids == answers[3][0].output_ids  # greedy: same prompt, same text


def test_a_dead_router_fails_after_bounded_retries() -> None:
    dead = f"http://127.0.0.1:{free_port()}"

    async def scenario() -> None:
        async with EngineClient(dead, max_attempts=3, backoff_s=0.01) as client:
            await client.generate(PROMPT, GREEDY)

    with pytest.raises(EngineRequestError, match="failed 3 times"):
        run(scenario())


def test_a_request_is_not_retried_once_the_router_is_known_to_be_gone() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    asked = []

    def gone() -> str:
        asked.append(1)
        return "the sglang-router process exited"

    async def scenario() -> None:
        async with EngineClient(dead, max_attempts=60, backoff_s=10.0, gone=gone) as client:
            await client.generate(PROMPT, GREEDY)

    with pytest.raises(EngineRequestError, match="and the sglang-router process exited"):
        run(scenario())
    assert asked == [1]  # after the first attempt, before any wait


def test_a_rejected_request_is_not_retried(url: str) -> None:
    async def scenario() -> None:
        async with client_for(url, max_attempts=5, backoff_s=10.0) as client:
            await client.generate(PROMPT, {"max_new_tokens": 2, "bogus": 1})

    start = time.monotonic()
    with pytest.raises(EngineRequestError, match="bogus") as info:
        run(scenario())
    assert info.value.status == 400 and time.monotonic() - start < 5


def test_unavailable_engine_is_retried_until_it_recovers(url: str) -> None:
    async def scenario() -> GenerateResult:
        async with client_for(url, max_attempts=20, backoff_s=0.05, max_backoff_s=0.1) as client:
            http_json("POST", f"{url}/release_memory_occupation", {"tags": ["weights"]})
            task = asyncio.create_task(client.generate(PROMPT, GREEDY))
            await asyncio.sleep(0.3)
            assert not task.done()
            await asyncio.to_thread(
                http_json, "POST", f"{url}/resume_memory_occupation", {"tags": ["weights"]}
            )
            return await task

    assert run(scenario()).finish_reason is FinishKind.LENGTH


def test_abort_all_returns_partial_results(url: str) -> None:
    async def scenario() -> list[GenerateResult]:
        async with client_for(url) as client:
            tasks = [asyncio.create_task(client.generate(PROMPT, LONG)) for _ in range(3)]
            await until_running(client, url, 3)
            await client.abort_all()
            assert await client.num_requests([url]) == 0
            return await asyncio.gather(*tasks)

    results = run(scenario())
    assert all(r.finish_reason is FinishKind.ABORT and r.abort_message for r in results)
    assert all(len(r.output_ids) < LONG["max_new_tokens"] for r in results)


def test_weight_sync_sequence(url: str, tiny_lm_dir: Path) -> None:
    async def scenario() -> tuple[GenerateResult, str]:
        async with client_for(url) as client:
            running = asyncio.create_task(client.generate(PROMPT, LONG))
            await until_running(client, url, 1)
            await client.pause(mode="in_place")
            flushing = asyncio.create_task(client.flush_cache(attempts=200, interval_s=0.02))
            await asyncio.sleep(0.2)
            assert not flushing.done()  # refused (400) while the request is held in place
            await client.update_weights_from_disk(str(tiny_lm_dir), weight_version="7")
            await client.continue_generation()
            await flushing
            return await running, await client.get_weight_version(url)

    result, version = run(scenario())
    assert result.finish_reason is FinishKind.LENGTH and result.weight_version == "7"
    assert version == "7"


def test_update_weights_failure_raises(url: str, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with client_for(url) as client:
            await client.update_weights_from_disk(str(tmp_path / "missing"))

    with pytest.raises(EngineRequestError, match="not a directory"):
        run(scenario())


def test_wait_healthy(url: str) -> None:
    async def scenario() -> None:
        async with client_for(url) as client:
            await client.wait_healthy([url], timeout_s=10)
            with pytest.raises(EngineRequestError, match="not healthy"):
                await client.wait_healthy([f"http://127.0.0.1:{free_port()}"], timeout_s=0.3)

    run(scenario())


def test_parse_handles_lists_and_rejects_garbage() -> None:
    item = {
        "text": "x",
        "output_ids": [3, 4],
        "meta_info": {
            "finish_reason": {"type": "stop", "matched": 4},
            "output_token_logprobs": [[-0.5, 3, None], [-0.25, 4, None]],
            "prompt_tokens": 2,
            "completion_tokens": 2,
            "weight_version": "3",
        },
    }
    results = parse_generate_response([item, item])
    assert len(results) == 2 and results[0].finish_matched == 4
    assert results[0].output_logprobs == [-0.5, -0.25] and results[0].weight_version == "3"
    with pytest.raises(EngineRequestError):
        parse_generate_response({"detail": "oops"})
