"""Reward model classes: built once with their settings, called on batches gathered from
groups that finish together, each group getting its own rewards back; bad answers refused."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from rlpost.rewards.errors import RewardError
from rlpost.rewards.model import RewardBatcher, build_reward_model, score
from rlpost.types import Sample


def group(index: int, size: int, answers: list[str]) -> list[Sample]:
    return [
        Sample(
            group_index=index,
            index=index * size + j,
            prompt="q",
            prompt_ids=[1],
            label="7",
            response_text=f"\\boxed{{{answers[j % len(answers)]}}}",
        )
        for j in range(size)
    ]


def test_groups_that_finish_together_are_scored_in_one_call(
    hook_modules: Path, tmp_path: Path
) -> None:
    model = build_reward_model(
        "rlpost_test_hooks.BoxedAnswerModel", {"scale": 2.0, "log_dir": str(tmp_path)}, "cpu"
    )
    calls: list[int] = []

    async def scorer(samples: list[Sample]) -> list[float]:
        calls.append(len(samples))
        return await score(model, samples, "BoxedAnswerModel")

    async def scenario() -> list[list[float]]:
        batcher = RewardBatcher(scorer, batch_size=8, max_wait_s=0.05)
        groups = [group(i, 4, ["7", "8"] if i % 2 else ["7"]) for i in range(5)]
        return list(await asyncio.gather(*(batcher(g) for g in groups)))

    rewards = asyncio.run(scenario())
    assert rewards == [[2.0] * 4, [2.0, 0.0] * 2, [2.0] * 4, [2.0, 0.0] * 2, [2.0] * 4]
    assert calls == [8, 8, 4]  # two full batches at once, the rest after the wait; no split
    logged = [line.split() for line in (tmp_path / "calls.txt").read_text().splitlines()]
    assert [int(n) for _, n in logged] == calls and {pid for pid, _ in logged} == {
        str(os.getpid())
    }  # one model, built once, in this process


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ([1.0], "returned 1 rewards for 2 samples"),
        ("high", "returned str, not a list"),
        ([1.0, float("nan")], "rewards must be finite"),
    ],
)
def test_a_bad_answer_from_the_model_is_refused(answer: object, message: str) -> None:
    async def model(samples: list[Sample]) -> object:
        return answer

    with pytest.raises(RewardError, match=message):
        asyncio.run(score(model, group(0, 2, ["7"]), "m"))


def test_a_failing_call_fails_every_group_it_carried() -> None:
    async def broken(samples: list[Sample]) -> list[float]:
        raise RewardError("model down")

    async def scenario() -> list[object]:
        batcher = RewardBatcher(broken, batch_size=8, max_wait_s=0.01)
        calls = [batcher(group(i, 2, ["7"])) for i in range(2)]
        return list(await asyncio.gather(*calls, return_exceptions=True))

    outcomes = asyncio.run(scenario())
    assert all(isinstance(o, RewardError) for o in outcomes)
