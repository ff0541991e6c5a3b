"""Rewards: rule-based graders, a remote reward model, and user functions by dotted path."""

from rlpost.rewards.answers import (
    answers_match,
    f1_score,
    grade_dapo,
    grade_deepscaler,
    grade_math,
    last_boxed,
)
from rlpost.rewards.errors import RemoteRewardError, RewardError
from rlpost.rewards.hub import (
    REWARD_TYPES,
    RewardContext,
    RewardFn,
    compute_rewards,
    register_reward,
)
from rlpost.rewards.pool import GradingPool, grading_pool, shutdown_grading_pool

__all__ = [
    "REWARD_TYPES",
    "GradingPool",
    "RemoteRewardError",
    "RewardContext",
    "RewardError",
    "RewardFn",
    "answers_match",
    "compute_rewards",
    "f1_score",
    "grade_dapo",
    "grade_deepscaler",
    "grade_math",
    "grading_pool",
    "last_boxed",
    "register_reward",
    "shutdown_grading_pool",
]
