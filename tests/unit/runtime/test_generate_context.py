"""Multi-turn generation against a real CPU engine serving the shipped tiny model: policy and
environment turns, loss masks and logprobs aligned with the response, the response budget
across turns, and the checks on what a generate function returns."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer

from rlpost.backends.cpu_engine.engine import EngineSettings
from rlpost.backends.cpu_engine.server import BackgroundServer
from rlpost.envs.calculator import calculate, find_call
from rlpost.runtime.failures import RunFault, is_fault
from rlpost.runtime.rollout.client import EngineClient
from rlpost.runtime.rollout.context import (
    ContextFactory,
    GenerateContext,
    TemplateError,
    render_environment_turn,
)
from rlpost.runtime.rollout.manager import (
    GenerateError,
    GenerateHook,
    GroupRunner,
    MalformedSampleError,
    SamplingSettings,
)
from rlpost.types import UNVERSIONED, Sample, SampleStatus

MODEL = Path(__file__).resolve().parents[3] / "rlpost" / "assets" / "qwen3-tiny"
HOOK = "tests.unit.runtime.test_generate_context.hook"


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(MODEL, local_files_only=True)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    threads = torch.get_num_threads()
    server = BackgroundServer(EngineSettings(model_path=str(MODEL), num_threads=1))
    yield server.start()
    server.stop()
    torch.set_num_threads(threads)


def group_of(tokenizer: Any, size: int = 4) -> list[Sample]:
    prompt = [{"role": "user", "content": "What is 23*47?"}]
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    ids = tokenizer.encode(text, add_special_tokens=False)
    return [Sample(group_index=0, index=i, prompt=prompt, prompt_ids=ids) for i in range(size)]


async def zero_reward(samples: list[Sample]) -> list[float]:
    return [0.0] * len(samples)


def run_group(
    url: str, tokenizer: Any, generate: GenerateHook, max_new_tokens: int, max_turns: int = 3
) -> list[Sample]:
    async def scenario() -> list[Sample]:
        async with EngineClient(url, worker_urls=[url]) as client:
            contexts = ContextFactory(tokenizer=tokenizer, max_turns=max_turns)
            runner = GroupRunner(client, zero_reward, generate, HOOK, contexts)
            group = group_of(tokenizer)
            params = SamplingSettings(max_new_tokens=max_new_tokens, temperature=1.0).to_sglang()
            return await runner.run(group, params, runner.client_for(group))

    return asyncio.run(scenario())


def test_an_environment_turn_is_the_chat_templates_tool_turn(tokenizer: Any) -> None:
    # the policy wrote its end-of-turn token; the newline after it and the tool turn follow
    text = render_environment_turn(tokenizer, "<calc>23*47</calc><|im_end|>", "1081", "tool")
    assert text == "\n<|im_start|>tool\n1081<|im_end|>\n<|im_start|>assistant\n"
    # a turn cut off before its end-of-turn token gets the whole closing
    text = render_environment_turn(tokenizer, "<calc>23*4", "error", "tool")
    assert text.startswith("<|im_end|>\n<|im_start|>tool\nerror")
    whole = tokenizer.apply_chat_template(
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "<calc>1*2</calc>"},
            {"role": "tool", "content": "2"},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "q"}], tokenize=False, add_generation_prompt=True
    )
    turn = "<calc>1*2</calc><|im_end|>"
    assert prompt + turn + render_environment_turn(tokenizer, turn, "2", "tool") == whole


def test_a_template_that_rewrites_earlier_turns_is_refused() -> None:
    class Rewriting:
        def apply_chat_template(self, messages: list[dict[str, str]], **_: Any) -> str:
            return f"{len(messages)}:" + "|".join(m["content"] for m in messages)

    with pytest.raises(TemplateError, match="renders a conversation differently"):
        render_environment_turn(Rewriting(), "x", "y", "tool")


async def two_turns(sample: Sample, ctx: GenerateContext) -> Sample:
    """A policy turn, a tool turn, a policy turn: whatever the model writes."""
    while not sample.finished:
        turn = await ctx.policy_turn(sample)
        if turn.status is not SampleStatus.COMPLETED or sample.turns >= ctx.max_turns:
            return sample
        call = find_call(turn.text)
        ctx.environment_turn(sample, calculate(call) if call else "error: no call")
    return sample


def test_tool_tokens_are_masked_and_policy_tokens_carry_logprobs(url: str, tokenizer: Any) -> None:
    group = run_group(url, tokenizer, two_turns, max_new_tokens=120, max_turns=2)
    for sample in group:
        n = len(sample.response_ids)
        assert len(sample.loss_mask) == len(sample.rollout_logprobs) == n
        assert len(sample.token_versions) == n and n <= 120
        inserted = [i for i, m in enumerate(sample.loss_mask) if m == 0]
        if sample.turns < 2:  # the model ended (or ran out) in its first turn
            continue
        assert inserted, "a second turn follows a tool turn"
        # one contiguous tool turn between two policy turns
        assert inserted == list(range(inserted[0], inserted[-1] + 1))
        assert inserted[0] > 0 and inserted[-1] < n - 1
        assert all(sample.rollout_logprobs[i] == 0.0 for i in inserted)
        assert all(sample.token_versions[i] == UNVERSIONED for i in inserted)
        policy = [i for i in range(n) if sample.loss_mask[i]]
        assert all(sample.rollout_logprobs[i] < 0.0 for i in policy)
        tool_text = tokenizer.decode([sample.response_ids[i] for i in inserted])
        assert tool_text.startswith("\n<|im_start|>tool\n")
        assert tool_text.endswith("<|im_start|>assistant\n")
        assert sample.response_text == tokenizer.decode(sample.response_ids)
    assert any(s.turns == 2 for s in group), [s.response_text for s in group]


def test_every_turn_counts_in_the_response_budget(url: str, tokenizer: Any) -> None:
    async def long_tool(sample: Sample, ctx: GenerateContext) -> Sample:
        turn = await ctx.policy_turn(sample, ignore_eos=True, max_new_tokens=8)
        assert turn.status is SampleStatus.COMPLETED or turn.status is SampleStatus.TRUNCATED
        fits = ctx.environment_turn(sample, "9" * 40)  # more than what is left
        assert not fits
        return sample

    for sample in run_group(url, tokenizer, long_tool, max_new_tokens=30):
        assert len(sample.response_ids) == 30
        assert sample.status is SampleStatus.TRUNCATED
        assert sample.loss_mask[:8] == [1] * 8 and sample.loss_mask[8:] == [0] * 22


def test_the_sample_a_hook_returns_is_the_one_trained(url: str, tokenizer: Any) -> None:
    async def copy_then_generate(sample: Sample, ctx: GenerateContext) -> Sample:
        fresh = dataclasses.replace(sample, metadata={**sample.metadata, "copied": True})
        return await two_turns(fresh, ctx)

    for sample in run_group(url, tokenizer, copy_then_generate, max_new_tokens=60):
        assert sample.metadata["copied"] and sample.finished and sample.response_ids


def test_a_sample_generated_again_starts_from_its_prompts_metadata(
    url: str, tokenizer: Any
) -> None:
    """A generate function keeps its episode's state on `sample.metadata`; a sample
    generated again (a stale group regenerated, a resume after a kill) starts from what its
    prompt line said, not from the discarded episode's state."""
    tools = [{"name": "calc"}]

    async def keeps_state(sample: Sample, ctx: GenerateContext) -> Sample:
        sample.metadata["calls"] = sample.metadata.get("calls", 0) + 1
        sample.metadata["tools"].append({"name": "added by the episode"})
        return await two_turns(sample, ctx)

    async def scenario() -> list[Sample]:
        async with EngineClient(url, worker_urls=[url]) as client:
            runner = GroupRunner(client, zero_reward, keeps_state, HOOK, ContextFactory(tokenizer))
            group = [dataclasses.replace(s, metadata={"tools": tools}) for s in group_of(tokenizer)]
            params = SamplingSettings(max_new_tokens=40, temperature=1.0).to_sglang()
            return await runner.run(group, params, runner.client_for(group))

    for sample in asyncio.run(scenario()):
        assert sample.metadata["calls"] == 1
        again = sample.fresh()
        assert again.metadata == {"tools": [{"name": "calc"}]}
        assert not again.response_ids and again.status is SampleStatus.PENDING


def test_a_generate_function_that_raises_stops_its_groups_other_episodes(
    url: str, tokenizer: Any
) -> None:
    """One episode's tool raises: the run fails with that error, and the group's other
    episodes stop with it instead of sending requests to engines the run is shutting down."""
    stopped: list[int] = []

    async def one_tool_fails(sample: Sample, ctx: GenerateContext) -> Sample:
        if sample.index == 0:
            raise RuntimeError("sandbox down")
        try:
            await asyncio.sleep(30)  # a slow tool
        except asyncio.CancelledError:
            stopped.append(sample.index)
            raise
        return sample

    async def scenario() -> list[int]:
        async with EngineClient(url, worker_urls=[url]) as client:
            contexts = ContextFactory(tokenizer)
            runner = GroupRunner(client, zero_reward, one_tool_fails, HOOK, contexts)
            group = group_of(tokenizer)
            params = SamplingSettings(max_new_tokens=16, temperature=1.0).to_sglang()
            with pytest.raises(RuntimeError, match="sandbox down"):
                await runner.run(group, params, runner.client_for(group))
            return sorted(stopped)  # as the error leaves the runner, before any cleanup

    assert asyncio.run(scenario()) == [1, 2, 3]


def test_a_generate_function_that_raises_is_named_with_the_sample_it_was_generating(
    url: str, tokenizer: Any
) -> None:
    """A user's generate function that raises: the error names it, its exception and the
    sample, and keeps the exception as its cause, so that one a dead part of the run is
    behind is still a fault (a restart mends it)."""

    async def misreads_the_tool(sample: Sample, ctx: GenerateContext) -> Sample:
        await ctx.policy_turn(sample)
        if sample.index == 2:
            raise KeyError("answer")
        return sample

    with pytest.raises(GenerateError) as raised:
        run_group(url, tokenizer, misreads_the_tool, max_new_tokens=8)
    assert str(raised.value) == (
        f"generate function '{HOOK}' raised KeyError: 'answer' (generating sample 2 of group 0)"
    )
    assert isinstance(raised.value.__cause__, KeyError)

    async def router_gone(sample: Sample, ctx: GenerateContext) -> Sample:
        raise RunFault("the sglang-router process exited", component="router")

    with pytest.raises(GenerateError, match="raised RunFault") as raised:
        run_group(url, tokenizer, router_gone, max_new_tokens=8)
    assert is_fault(raised.value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: "text", "returned str, not a Sample"),
        (lambda s: s.rollout_logprobs.pop() and s, "rollout_logprobs"),
        (lambda s: setattr(s, "status", SampleStatus.PENDING) or s, "still pending"),
        (lambda s: dataclasses.replace(s, group_index=7), "another prompt"),
        (lambda s: s.append_inserted_tokens([5] * 64, "") or s, "over max_response_len=16"),
    ],
    ids=["not-a-sample", "short-logprobs", "pending", "other-prompt", "over-budget"],
)
def test_a_malformed_sample_is_refused_naming_the_hook(
    url: str, tokenizer: Any, change: Any, message: str
) -> None:
    async def malformed(sample: Sample, ctx: GenerateContext) -> Any:
        await ctx.policy_turn(sample)
        sample.status = SampleStatus.COMPLETED
        return change(sample)

    with pytest.raises(MalformedSampleError, match=message) as raised:
        run_group(url, tokenizer, malformed, max_new_tokens=16)
    assert HOOK in str(raised.value)


def test_a_sample_returned_aborted_with_nothing_interrupted_stops_the_run_naming_the_hook(
    url: str, tokenizer: Any
) -> None:
    """A generate function that returns ABORTED to mean "drop this sample": ABORTED is an
    episode a weight update (or a stop) interrupted, which the loop continues by calling the
    function again, so with no interruption it would be called forever. It is called once,
    and the run stops naming it and what to return instead."""
    calls: list[int] = []

    async def drops_one(sample: Sample, ctx: GenerateContext) -> Sample:
        if sample.index in calls:
            raise AssertionError(f"sample {sample.index} generated again, nothing interrupted")
        calls.append(sample.index)
        await ctx.policy_turn(sample)
        if sample.index == 2:
            sample.status = SampleStatus.ABORTED
        return sample

    with pytest.raises(MalformedSampleError) as raised:
        run_group(url, tokenizer, drops_one, max_new_tokens=16)
    message = str(raised.value)
    assert f"generate function '{HOOK}' returned sample(s) [2] aborted" in message
    assert "Return the sample completed or truncated" in message
    assert "rollout.dynamic_sampling_filter" in message
    assert sorted(calls) == [0, 1, 2, 3]


def test_graders_read_the_answer_without_the_special_token_that_ended_it(tokenizer: Any) -> None:
    """The engines keep special tokens in the text (skip_special_tokens false, as slime), so
    a response that stopped at its end-of-turn token reads `42<|im_end|>`: a token F1 of 0
    against `42`, and a DAPO answer `x+1<|im_end|>` that is not `x+1`. The rule-based graders
    read the response without that last special token; a response cut at the budget, or
    one that ends in text, is read as it is."""
    from rlpost.rewards import compute_rewards
    from rlpost.runtime.rollout.client import GenerateResult
    from rlpost.schema import RewardConfig

    def ended(text: str, finish: str) -> Sample:
        [sample] = group_of(tokenizer, 1)
        ids = tokenizer.encode(text, add_special_tokens=False)
        result = GenerateResult(ids, text, [0.0] * len(ids), finish, None, 3, len(ids))  # type: ignore[arg-type]
        GenerateContext(client=None, tokenizer=tokenizer, sampling_params={})._end_turn(
            sample, result
        )
        sample.label = "x+1"
        return sample

    stopped = ended("The answer is\nAnswer: x+1<|im_end|>", "stop")
    assert stopped.end_text == "<|im_end|>" and stopped.response_text.endswith("<|im_end|>")
    assert stopped.answer_text == "The answer is\nAnswer: x+1"
    cut = ended("The answer is\nAnswer: x+1", "length")
    texts = ended("The answer is\nAnswer: x+1", "stop")  # a stop string, not a token
    assert cut.end_text == texts.end_text == ""

    def graded(reward_type: str, samples: list[Sample]) -> list[float]:
        return asyncio.run(compute_rewards(samples, RewardConfig(type=reward_type)))

    assert graded("dapo", [stopped, cut, texts]) == [1.0, 1.0, 1.0]
    for sample in (stopped, cut, texts):
        sample.label = "The answer is Answer: x+1"
    assert graded("f1", [stopped]) == [1.0]
    # an environment's turn after it ends the response elsewhere: nothing left to drop
    stopped.append_inserted_tokens([1], "<tool_response>")
    assert stopped.answer_text == stopped.response_text
