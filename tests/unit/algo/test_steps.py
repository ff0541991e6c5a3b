"""Step planning: a trainer that packs a prompt once takes whole groups per DP rank."""

from __future__ import annotations

import random

import pytest

from rlpost.algo.steps import even_out, every_rank_steps, plan_steps, prompt_groups
from rlpost.schema import AlgoConfig, TrainConfig
from rlpost.types import TrainSample


def groups_of(count: int, size: int, seed: int = 0) -> list[TrainSample]:
    """`count` prompts with `size` samples each, interleaved, responses of random length."""
    rng = random.Random(seed)
    prompts = [[100 + g] * rng.randint(3, 20) for g in range(count)]
    return [
        TrainSample(prompt + [7] * (n := rng.randint(1, 30)), n, 0.0)
        for _ in range(size)
        for prompt in prompts
    ]


def shares(samples: list[TrainSample], ranks: int, share: bool, balance: bool = True):
    train = TrainConfig(global_batch_size=len(samples), balance_data=balance)
    return [
        sorted(
            i
            for plan in plan_steps(samples, train, AlgoConfig(), r, ranks, share_prompts=share)
            for micro in plan.micro_batches
            for i in micro
        )
        for r in range(ranks)
    ]


@pytest.mark.parametrize("share", [True, False])
def test_every_rank_planned_at_once_as_each_rank_plans_itself(share: bool) -> None:
    """What a trainer rank works out for the others (how many forwards to even out to) is
    what each of them plans for itself: two optimizer steps, dynamic micro-batches."""
    samples = groups_of(8, 8, seed=5)
    train = TrainConfig(global_batch_size=32, use_dynamic_batch_size=True, max_tokens_per_gpu=96)
    algo = AlgoConfig()
    every = every_rank_steps(samples, train, algo, 4, share_prompts=share)
    assert every == [plan_steps(samples, train, algo, r, 4, share_prompts=share) for r in range(4)]
    assert len(every[0]) == 2 and len({len(p[0].micro_batches) for p in every}) > 1


def test_prompt_groups_in_order_of_first_appearance() -> None:
    samples = groups_of(3, 2)
    assert prompt_groups(samples) == [[0, 3], [1, 4], [2, 5]]


@pytest.mark.parametrize(("count", "ranks"), [(8, 2), (8, 4), (16, 8), (5, 2)])
def test_each_group_on_one_rank_every_sample_once(count: int, ranks: int) -> None:
    samples = groups_of(count, 8, seed=count + ranks)
    parts = shares(samples, ranks, share=True)
    assert sorted(i for p in parts for i in p) == list(range(len(samples)))
    assert all(parts)
    for group in prompt_groups(samples):
        assert sum(set(group) <= set(p) for p in parts) == 1


def test_ranks_balance_the_tokens_they_compute() -> None:
    samples = groups_of(16, 8, seed=3)
    parts = shares(samples, 2, share=True)

    def computed(part: list[int]) -> int:
        groups = {
            tuple(samples[i].tokens[: len(samples[i].tokens) - samples[i].response_length])
            for i in part
        }
        return sum(len(g) for g in groups) + sum(samples[i].response_length for i in part)

    loads = [computed(p) for p in parts]
    assert max(loads) - min(loads) <= max(len(s.tokens) for s in samples)


def test_samples_are_split_when_groups_are_fewer_than_ranks_or_not_balancing() -> None:
    samples = groups_of(2, 8)
    assert shares(samples, 4, share=True) == shares(samples, 4, share=False)
    samples = groups_of(8, 8)
    assert shares(samples, 2, share=True, balance=False) == [list(range(32)), list(range(32, 64))]


def test_even_out_splits_the_fullest_micro_batches_then_adds_empty_ones() -> None:
    """Ranks whose forwards are collectives run the same number of micro-batches: the
    fullest multi-sample ones split first, empty ones make up the rest, no sample is lost."""
    lengths = [10, 40, 20, 30]
    bins = even_out([[0, 1, 2], [3]], lengths, 3)
    assert sorted(i for b in bins for i in b) == [0, 1, 2, 3] and len(bins) == 3
    assert [3] in bins and all(len(b) <= 2 for b in bins)
    padded = even_out([[0], [1]], lengths, 4)
    assert padded[:2] == [[0], [1]] and padded[2:] == [[], []]
    assert even_out([[0, 1]], lengths, 1) == [[0, 1]]
