"""Filters shipped with rlpost, named by dotted path in a recipe.

    rollout:
      dynamic_sampling_filter: rlpost.filters.check_reward_nonzero_std
      buffer_filter: rlpost.filters.pop_first

Write your own with the same signatures (checked when the config is validated):
`def fn(samples) -> bool` and `def fn(rollout_id, buffer, num_groups) -> list[list[Sample]]`.
"""

from __future__ import annotations

from rlpost.types import Sample


def check_reward_nonzero_std(samples: list[Sample]) -> bool:
    """Keep a group only if its rewards differ: equal rewards give GRPO no signal."""
    rewards = [sample.reward for sample in samples]
    if any(reward is None for reward in rewards):
        missing = [sample.index for sample in samples if sample.reward is None]
        raise ValueError(f"samples {missing} have no reward yet; filter groups after rewarding")
    return len(rewards) > 1 and min(rewards) != max(rewards)  # type: ignore[type-var]


def pop_first(rollout_id: int, buffer: list[list[Sample]], num_groups: int) -> list[list[Sample]]:
    """Take the oldest `num_groups` groups (fewer if the buffer is shorter) out of `buffer`."""
    taken = buffer[:num_groups]
    del buffer[:num_groups]
    return taken
