import math
import random

import pytest

from rlpost.algo.packing import (
    balance_partitions,
    pack_first_fit,
    pack_fixed_count,
    pack_micro_batches,
    packing_efficiency,
    padded_groups,
    padded_rows,
    partition_groups,
    partition_ranks,
    split_contiguous,
)
from rlpost.plan.layout import PADDED_ROWS_LIMIT as LIMIT


def rl_lengths(count: int, seed: int) -> list[int]:
    """Prompt plus a long-tailed response length, as RL rollouts look."""
    rng = random.Random(seed)
    return [rng.randint(20, 200) + int(rng.expovariate(1 / 800)) for _ in range(count)]


def assert_partition(groups: list[list[int]], count: int) -> None:
    flat = sorted(i for g in groups for i in g)
    assert flat == list(range(count))


@pytest.mark.parametrize("seed", range(5))
def test_first_fit_respects_the_cap_except_single_oversize_samples(seed: int) -> None:
    lengths = rl_lengths(256, seed)
    cap = 2048
    bins = pack_first_fit(lengths, cap)
    assert_partition(bins, len(lengths))
    for b in bins:
        total = sum(lengths[i] for i in b)
        assert total <= cap or (len(b) == 1 and lengths[b[0]] > cap)
    assert any(length > cap for length in lengths)  # the case is exercised
    assert packing_efficiency(lengths, bins, cap) > 0.93


def test_first_fit_decreasing_on_a_known_case() -> None:
    # Sorted: 7 7 4 4 3 3 2 -> bins [7,3] [7,3] [4,4,2]
    bins = pack_first_fit([3, 7, 4, 2, 7, 4, 3], 10)
    assert [sorted([3, 7, 4, 2, 7, 4, 3][i] for i in b) for b in bins] == [
        [3, 7],
        [3, 7],
        [2, 4, 4],
    ]


def test_oversize_sample_gets_its_own_micro_batch_untruncated() -> None:
    bins = pack_first_fit([50, 3, 3], 10)
    assert bins == [[0], [1, 2]]


def test_fixed_count_micro_batches() -> None:
    assert pack_fixed_count(5, 2) == [[0, 1], [2, 3], [4]]
    assert pack_micro_batches([9, 9, 9], dynamic=False, max_tokens=None, micro_batch_size=8) == [
        [0, 1, 2]
    ]


def test_dynamic_micro_batches_need_a_cap() -> None:
    with pytest.raises(ValueError, match="max_tokens_per_gpu"):
        pack_micro_batches([1], dynamic=True, max_tokens=None, micro_batch_size=1)


def test_packing_efficiency_is_bound_over_used() -> None:
    assert packing_efficiency([6, 6, 6], [[0], [1], [2]], 10) == pytest.approx(2 / 3)
    assert packing_efficiency([5, 5], [[0, 1]], 10) == 1.0


def test_karmarkar_karp_by_hand() -> None:
    # Differences: 10-7=3; 5-3=2; 3-3=0; 2-2=0; 0-0=0 -> a perfect split of 30.
    lengths = [10, 7, 5, 3, 3, 2]
    parts = balance_partitions(lengths, 2)
    assert_partition(parts, 6)
    assert sorted(sum(lengths[i] for i in p) for p in parts) == [15, 15]
    # The textbook case where differencing is not optimal: 8-7, 6-5, 4-1, 3-1 leaves 2.
    classic = [8, 7, 6, 5, 4]
    loads = sorted(sum(classic[i] for i in p) for p in balance_partitions(classic, 2))
    assert loads == [14, 16]


@pytest.mark.parametrize(("count", "parts"), [(256, 8), (64, 4), (33, 8), (1000, 16)])
def test_balance_quality_on_rl_lengths(count: int, parts: int) -> None:
    lengths = rl_lengths(count, count)
    groups = balance_partitions(lengths, parts)
    assert_partition(groups, count)
    loads = [sum(lengths[i] for i in g) for g in groups]
    contiguous = [sum(lengths[i] for i in g) for g in split_contiguous(count, parts)]
    # The imbalance KK leaves is far below what consecutive slices give, and within a small
    # fraction of the mean load.
    assert max(loads) - min(loads) < (max(contiguous) - min(contiguous)) / 4
    assert max(loads) <= math.ceil(sum(lengths) / parts) * 1.02


@pytest.mark.parametrize(
    "lengths",
    [[5] * 8, [0, 0, 0, 0, 10], [1000, 1, 1, 1], [3, 0, 0, 0, 0, 0, 0, 0]],
)
def test_every_rank_gets_a_sample_when_there_are_enough(lengths: list[int]) -> None:
    groups = balance_partitions(lengths, 4)
    assert_partition(groups, len(lengths))
    assert all(groups)


def test_fewer_samples_than_ranks_leaves_some_empty() -> None:
    groups = balance_partitions([4, 2], 4)
    assert_partition(groups, 2)
    assert sum(1 for g in groups if g) == 2
    assert balance_partitions([], 3) == [[], [], []]


def test_contiguous_split_when_not_balancing() -> None:
    assert partition_ranks([1] * 5, 2, balance=False) == [[0, 1, 2], [3, 4]]
    assert_partition(partition_ranks([3, 1, 2], 2, balance=True), 3)


def test_groups_stay_whole_and_balanced() -> None:
    groups = [[0, 4], [1, 5, 6], [2], [3, 7]]
    lengths = [30, 50, 20, 40]
    parts = partition_groups(lengths, groups, 2)
    assert sorted(i for p in parts for i in p) == list(range(8))
    for group in groups:
        assert sum(set(group) <= set(p) for p in parts) == 1
    loads = sorted(
        sum(lengths[g] for g, members in enumerate(groups) if set(members) <= set(p)) for p in parts
    )
    assert loads == [70, 70]


def test_padded_groups_by_hand() -> None:
    # 200 and 130 pad to 400 rows for 330 tokens (1.21); 64 with them would be 600 for 394
    assert padded_groups([1, 37, 200, 64, 5, 130]) == [[2, 5], [3], [1], [4], [0]]
    assert padded_rows([1, 37, 200, 64, 5, 130]) == 2 * 200 + 64 + 37 + 5 + 1
    assert padded_groups([8, 8, 8]) == [[0, 1, 2]]  # one length: one group, no padding
    assert padded_groups([3, 0, 4]) == [[0, 2]]  # 8 rows for 7 tokens; no rows: no group
    assert padded_groups([3, 4], limit=1.0) == [[1], [0]]
    assert padded_groups([]) == []
    with pytest.raises(ValueError, match="limit"):
        padded_groups([1], limit=0.5)


@pytest.mark.parametrize(("seed", "cap"), [(s, c) for s in range(3) for c in (4096, 16384)])
def test_padded_groups_bound_the_padding_of_rl_micro_batches(seed: int, cap: int) -> None:
    """First-fit micro-batches of RL lengths pad to their longest sample up to about 1.9x their
    tokens; grouped, none exceeds the limit, in a few groups each."""
    lengths = rl_lengths(256, seed)
    single = []
    for micro_batch in pack_first_fit(lengths, cap):
        mine = [lengths[i] for i in micro_batch]
        groups = padded_groups(mine)
        assert_partition(groups, len(mine))
        for group in groups:  # each group within the limit, so the micro-batch too
            assert padded_rows([mine[i] for i in group]) <= LIMIT * sum(mine[i] for i in group)
        assert len(groups) <= 4
        single.append(len(mine) * max(mine) / sum(mine))
    assert max(single) > 1.4  # what one padded batch would have kept
