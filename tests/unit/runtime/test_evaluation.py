"""An evaluation against a real CPU engine when one of its groups fails."""

from __future__ import annotations

import asyncio

import pytest

from rlpost.runtime.evaluation import EvalSet, evaluate
from rlpost.runtime.rollout.client import EngineClient
from rlpost.runtime.rollout.context import GenerateContext
from rlpost.runtime.rollout.manager import (
    GenerateError,
    GroupRunner,
    SamplingSettings,
    generate_sample,
)
from rlpost.types import Sample

GROUPS, PER_GROUP = 4, 2
HOOK = "tests.unit.runtime.test_evaluation.one_group_fails"


def eval_set() -> EvalSet:
    groups = [
        [Sample(g, g * PER_GROUP + i, f"p{g}", [40 + g, 41, 42]) for i in range(PER_GROUP)]
        for g in range(GROUPS)
    ]
    return EvalSet("arith", groups, SamplingSettings(max_new_tokens=8, temperature=1.0))


async def zero_reward(samples: list[Sample]) -> list[float]:
    return [0.0] * len(samples)


def test_a_group_that_fails_stops_the_evaluations_other_groups(url: str) -> None:
    """One group's generate function raises while the other groups are still generated (a
    slow tool): the evaluation fails with that error, naming the function, and the other
    groups have stopped by then, rather than go on sending requests to engines the failing
    run shuts down (each retried and logged while it does)."""
    stopped: set[int] = set()

    async def one_group_fails(sample: Sample, ctx: GenerateContext) -> Sample:
        if sample.group_index == 0:
            await generate_sample(sample, ctx)
            raise RuntimeError("sandbox down")
        try:
            await generate_sample(sample, ctx)
            await asyncio.sleep(60)  # a slow tool
        except asyncio.CancelledError:
            stopped.add(sample.group_index)
            raise
        return sample

    async def scenario() -> tuple[GenerateError, set[int]]:
        async with EngineClient(url, worker_urls=[url]) as client:
            runner = GroupRunner(client, zero_reward, one_group_fails, HOOK)
            with pytest.raises(GenerateError) as raised:
                await asyncio.wait_for(evaluate(runner, [eval_set()], 0, 0), 30)
            return raised.value, set(stopped)  # as the error leaves the evaluation

    error, stopped_then = asyncio.run(scenario())
    assert str(error).startswith(f"generate function '{HOOK}' raised RuntimeError: sandbox down")
    assert stopped_then == set(range(1, GROUPS))
