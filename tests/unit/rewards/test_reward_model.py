"""Reward model classes: built once with their settings, called on batches gathered from
groups that finish together, each group getting its own rewards back; bad answers refused."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from rlpost.rewards.errors import RewardError
from rlpost.rewards.model import RewardBatcher, build_reward_model, score
from rlpost.rewards.scored import Scored
from rlpost.runtime.metrics import reward_extra_means
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

    async def scorer(samples: list[Sample]) -> list[Scored]:
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


def test_a_models_dicts_are_scored_by_their_score_and_the_rest_logged(
    hook_modules: Path,
) -> None:
    """A dict per sample: its "score" is the reward, its other keys the sample's
    reward_extra, set in this process by the batcher (from an actor, they travel back in
    the Scored), averaged as a verl-shaped function's are."""
    model = build_reward_model("rlpost_test_hooks.BoxedAnswerModelWithExtras", {}, "cpu")

    async def scorer(samples: list[Sample]) -> list[Scored]:
        return await score(model, samples, "BoxedAnswerModelWithExtras")

    groups = [group(0, 2, ["7", "8"]), group(1, 2, ["7"])]
    groups[1][1].response_text = "no box"

    async def scenario() -> list[list[float]]:
        batcher = RewardBatcher(scorer, batch_size=4, max_wait_s=0.05)
        return list(await asyncio.gather(*(batcher(g) for g in groups)))

    assert asyncio.run(scenario()) == [[1.0, 0.0], [1.0, 0.0]]
    samples = [s for g in groups for s in g]
    assert [s.reward_extra for s in samples] == [
        {"boxed": True, "answer": "7"},
        {"boxed": True, "answer": "8"},
        {"boxed": True, "answer": "7"},
        {"boxed": False, "answer": None},
    ]
    assert reward_extra_means(samples, "rollout") == {"rollout/reward_extra/boxed": 0.75}


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ([1.0], "returned 1 rewards for 2 samples \\(\\[1.0\\]; the first is sample "
         "group_index=0, index=0\\); it returns one reward per sample"),
        ("high", "returned str 'high' for 2 samples \\(the first is sample group_index=0, "
         "index=0\\); it returns a list of 2, in the samples' order: a number per sample, "
         "or a dict per sample holding the reward as 'score'$"),
        ([1.0, float("nan")], "returned nan for sample group_index=0, index=1; rewards must "
         "be finite"),
        ([{"reward": 1.0}, {"reward": 0.0}], "returned a dict without a 'score' for sample "
         "group_index=0, index=0: {'reward': 1.0}; .* return {'score': <number>, ...}"),
        ([{"score": 1.0}, 0.0], "returned numbers for some samples and dicts for others "
         ".*a number for sample group_index=0, index=1, a dict for sample group_index=0, "
         "index=0\\); return a dict with a 'score' for every sample, or a number"),
        ([{"score": None, "acc": 1}, {"score": 1.0}], "returned {'score': None, 'acc': 1} "
         "for sample group_index=0, index=0: its 'score' \\(None\\) is not a number"),
    ],
)  # fmt: skip
def test_a_bad_answer_from_the_model_is_refused(answer: object, message: str) -> None:
    async def model(samples: list[Sample]) -> object:
        return answer

    with pytest.raises(RewardError, match=f"^reward model 'm' {message}"):
        asyncio.run(score(model, group(0, 2, ["7"]), "m"))


def test_a_failing_call_fails_every_group_it_carried() -> None:
    async def broken(samples: list[Sample]) -> list[Scored]:
        raise RewardError("model down")

    async def scenario() -> list[object]:
        batcher = RewardBatcher(broken, batch_size=8, max_wait_s=0.01)
        calls = [batcher(group(i, 2, ["7"])) for i in range(2)]
        return list(await asyncio.gather(*calls, return_exceptions=True))

    outcomes = asyncio.run(scenario())
    assert all(isinstance(o, RewardError) for o in outcomes)


def test_a_model_whose_constructor_raises_is_named_with_its_settings(
    hook_modules: Path, tmp_path: Path
) -> None:
    """The run stops naming the class, what it raised and what it was built with; in an
    actor (model_placement: actor) the same message comes back from the actor's start."""
    path = "rlpost_test_hooks.ModelWithoutWeights"
    with pytest.raises(RewardError) as info:
        build_reward_model(path, {"path": str(tmp_path / "rm")}, "cpu")
    assert str(info.value) == (
        f"reward model '{path}' could not be built: ModelWithoutWeights(ctx) raised "
        f"FileNotFoundError: {tmp_path / 'rm'} holds no config.json (its settings, "
        f"recipe.rollout.reward.model_settings: {{'path': '{tmp_path / 'rm'}'}}; device 'cpu')"
    )
