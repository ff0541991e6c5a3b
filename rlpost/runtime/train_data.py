"""From rewarded groups to what the trainer consumes, and the rollout's own metrics."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from rlpost.algo.advantages import normalize_rewards
from rlpost.runtime.rollout.manager import Group, RolloutResult
from rlpost.schema import AlgoConfig
from rlpost.types import SampleStatus, TrainSample


def to_train_samples(groups: Sequence[Group], algo: AlgoConfig) -> list[TrainSample]:
    """Group-normalise rewards (the whole group is needed), then flatten to train samples."""
    samples = [s for group in groups for s in group]
    sizes = {len(group) for group in groups}
    if len(sizes) != 1:
        raise ValueError(f"groups of different sizes {sorted(sizes)} cannot be normalised")
    rewards = [float(s.reward) if s.reward is not None else 0.0 for s in samples]
    normalized = normalize_rewards(rewards, sizes.pop(), algo)
    return [
        TrainSample(
            tokens=s.prompt_ids + s.response_ids,
            response_length=len(s.response_ids),
            reward=reward,
            rollout_logprobs=list(s.rollout_logprobs) or None,
        )
        for s, reward in zip(samples, normalized, strict=True)
    ]


def rollout_metrics(result: RolloutResult) -> dict[str, float]:
    samples = result.samples
    rewards = [float(s.reward or 0.0) for s in samples]
    lengths = [len(s.response_ids) for s in samples]
    tokens = sum(lengths)
    truncated = sum(s.status is SampleStatus.TRUNCATED for s in samples)
    return {
        "rollout/reward_mean": statistics.fmean(rewards) if rewards else 0.0,
        "rollout/reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "rollout/num_samples": float(len(samples)),
        "rollout/num_groups": float(len(result.groups)),
        "rollout/response_len_mean": statistics.fmean(lengths) if lengths else 0.0,
        "rollout/truncated_ratio": truncated / len(samples) if samples else 0.0,
        "rollout/filtered_groups": float(result.num_filtered),
        "rollout/aborted_groups": float(len(result.aborted)),
        "perf/rollout_time_s": result.wall_s,
        "perf/rollout_tokens_per_s": tokens / result.wall_s if result.wall_s > 0 else 0.0,
        "perf/rollout_samples_per_s": len(samples) / result.wall_s if result.wall_s > 0 else 0.0,
    }
