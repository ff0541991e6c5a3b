import pytest

from rlpost.filters import check_reward_nonzero_std, pop_first
from rlpost.types import Sample


def group(*rewards: float | None) -> list[Sample]:
    return [Sample(0, i, "q", [1], reward=r) for i, r in enumerate(rewards)]


def test_nonzero_std_keeps_only_groups_whose_rewards_differ() -> None:
    assert check_reward_nonzero_std(group(0.0, 1.0, 0.0))
    assert check_reward_nonzero_std(group(-1.0, 1.0))
    assert not check_reward_nonzero_std(group(1.0, 1.0, 1.0))
    assert not check_reward_nonzero_std(group(0.0, 0.0))
    assert not check_reward_nonzero_std(group(1.0))


def test_nonzero_std_refuses_unrewarded_samples() -> None:
    with pytest.raises(ValueError, match=r"samples \[1\] have no reward"):
        check_reward_nonzero_std(group(1.0, None))


def test_pop_first_takes_the_oldest_groups_out_of_the_buffer() -> None:
    buffer = [group(1.0), group(2.0), group(3.0)]
    oldest = buffer[0]
    taken = pop_first(0, buffer, 2)
    assert taken[0] is oldest and len(taken) == 2
    assert [g[0].reward for g in buffer] == [3.0]
    assert [g[0].reward for g in pop_first(1, buffer, 5)] == [3.0]
    assert buffer == []
