"""GroupRunner against a real CPU engine: which aborted answers the loop generates again (those
rlpost asked for) and which stop the run (an engine's own), and the episode time limit."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from rlpost.runtime.rollout.client import EngineClient
from rlpost.runtime.rollout.context import GenerateContext
from rlpost.runtime.rollout.manager import (
    EngineAbortedSampleError,
    EpisodeTimeoutError,
    GenerateHook,
    GroupRunner,
    SamplingSettings,
)
from rlpost.runtime.router import http_json
from rlpost.types import Sample, SampleStatus

PROMPT = [40, 41, 42, 43]
GROUP = 4
HOOK = "tests.unit.runtime.rollout.test_manager.episode"


def group_of(size: int = GROUP) -> list[Sample]:
    return [
        Sample(group_index=7, index=i, prompt="p", prompt_ids=list(PROMPT)) for i in range(size)
    ]


def long_params() -> dict[str, Any]:
    """Responses that take a while: each runs to its budget."""
    return {**SamplingSettings(max_new_tokens=240, temperature=1.0).to_sglang(), "ignore_eos": True}


async def zero_reward(samples: list[Sample]) -> list[float]:
    return [0.0] * len(samples)


async def until_running(client: EngineClient, url: str, count: int) -> None:
    deadline = time.monotonic() + 20
    while await client.num_requests([url]) < count:
        assert time.monotonic() < deadline, "the group's requests never ran"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("group_requests", [False, True], ids=["per-sample", "group"])
def test_an_abort_rlpost_did_not_ask_for_stops_the_run_naming_the_engines_message(
    url: str, group_requests: bool
) -> None:
    """The engine answers the group's requests aborted while rlpost asked for no abort (no
    weight update, no stop: here an abort_request sent past rlpost, as an engine refusing a
    request answers): the run stops, naming the engine's message, the samples and the group,
    where the loop sent the requests again without end."""

    async def scenario() -> EngineAbortedSampleError:
        async with EngineClient(url, worker_urls=[url]) as client:
            runner = GroupRunner(client, zero_reward, group_requests=group_requests)
            group = group_of()
            task = asyncio.create_task(runner.run(group, long_params(), runner.client_for(group)))
            await until_running(client, url, GROUP)
            await asyncio.to_thread(http_json, "POST", f"{url}/abort_request", {"abort_all": True})
            with pytest.raises(EngineAbortedSampleError) as raised:
                await asyncio.wait_for(task, 60)
            return raised.value

    error = asyncio.run(scenario())
    message = str(error)
    assert "on its own: 'aborted by abort_request'" in message
    assert "of group 7" in message
    assert "recipe.rollout.max_response_len" in message  # what to do
    named = message[message.index("sample(s) [") + len("sample(s) [") :].split("]")[0]
    assert {int(i) for i in named.split(", ")} <= set(range(GROUP))


def test_a_weight_updates_pause_is_an_interruption_the_group_generates_through(url: str) -> None:
    """rlpost's own aborts (a weight update pauses the engines) are interruptions: the group
    continues where each sample stopped and finishes."""

    async def scenario() -> list[Sample]:
        async with EngineClient(url, worker_urls=[url]) as client:
            runner = GroupRunner(client, zero_reward)
            group = group_of()
            task = asyncio.create_task(runner.run(group, long_params(), runner.client_for(group)))
            await until_running(client, url, GROUP)
            await client.pause("abort", [url])
            await client.continue_generation([url])
            return await asyncio.wait_for(task, 60)

    for sample in asyncio.run(scenario()):
        assert sample.status is SampleStatus.TRUNCATED and len(sample.response_ids) == 240


def timed_runner(client: EngineClient, generate: GenerateHook, limit_s: float) -> GroupRunner:
    return GroupRunner(client, zero_reward, generate, HOOK, episode_timeout_s=limit_s)


def short_params() -> dict[str, Any]:
    return {**SamplingSettings(max_new_tokens=8, temperature=1.0).to_sglang(), "ignore_eos": True}


def test_a_generate_function_whose_tool_hangs_stops_the_run_at_its_time_limit(url: str) -> None:
    """One episode awaits a tool that never answers: past recipe.rollout.episode_timeout_s
    the run stops, naming the function, the sample, the limit and the key (the hung call
    cancelled), where the run waited forever."""
    cancelled: list[int] = []

    async def tool_hangs(sample: Sample, ctx: GenerateContext) -> Sample:
        await ctx.policy_turn(sample)
        if sample.index == 1:
            try:
                await asyncio.Event().wait()  # a tool call that never returns
            except asyncio.CancelledError:
                cancelled.append(sample.index)
                raise
        return sample

    async def scenario() -> EpisodeTimeoutError:
        async with EngineClient(url, worker_urls=[url]) as client:
            runner = timed_runner(client, tool_hangs, limit_s=1.0)
            group = group_of()
            run = runner.run(group, short_params(), runner.client_for(group))
            with pytest.raises(EpisodeTimeoutError) as raised:
                await asyncio.wait_for(run, 20)
            return raised.value

    message = str(asyncio.run(scenario()))
    assert f"generate function '{HOOK}' ran 1 s of its own time on sample 1 of group 7" in message
    assert "recipe.rollout.episode_timeout_s=1;" in message
    assert cancelled == [1]


def test_an_episode_held_by_paused_engines_is_not_timed(url: str) -> None:
    """The clock counts a generate function's own time, not its requests to the engines:
    an episode whose request waits on engines a weight update paused (longer than the
    limit) is not hung, and finishes."""

    async def one_turn(sample: Sample, ctx: GenerateContext) -> Sample:
        await ctx.policy_turn(sample)
        return sample

    async def scenario() -> list[Sample]:
        async with EngineClient(url, worker_urls=[url]) as client:
            runner = timed_runner(client, one_turn, limit_s=0.5)
            group = group_of()
            await client.pause("abort", [url])
            try:
                task = asyncio.create_task(
                    runner.run(group, short_params(), runner.client_for(group))
                )
                await asyncio.sleep(2.0)  # the update takes longer than the limit
                assert not task.done()
            finally:
                await client.continue_generation([url])
            return await asyncio.wait_for(task, 30)

    for sample in asyncio.run(scenario()):
        assert sample.status is SampleStatus.TRUNCATED and len(sample.response_ids) == 8
