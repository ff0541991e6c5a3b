"""From the groups of a train step to what the trainer consumes, and the step's rollout
metrics."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from rlpost.runtime.metrics import reward_extra_means
from rlpost.runtime.pipeline import Batch
from rlpost.runtime.rollout.manager import Group
from rlpost.schema import AlgoConfig
from rlpost.types import Sample, SampleStatus, TrainSample


def train_mask(sample: Sample, mask_carried_over: bool) -> list[int]:
    """1 for the response tokens the loss trains: tokens the policy generated, minus (with
    mask_offpolicy_in_partial_rollout) those a partial rollout carried over."""
    mask = list(sample.loss_mask)
    if mask_carried_over:
        mask[: sample.resumed_at] = [0] * sample.resumed_at
    return mask


def to_train_samples(
    groups: Sequence[Group], algo: AlgoConfig, mask_carried_over: bool = False
) -> list[TrainSample]:
    """Group-normalise rewards (the whole group is needed), then flatten to train samples."""
    # torch, which the baselines use, loads in the driver with its inputs (the tokenizer),
    # alongside Ray's start; importing it with this module would delay that start
    from rlpost.algo.advantages import normalize_rewards

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
            loss_mask=train_mask(s, mask_carried_over),
        )
        for s, reward in zip(samples, normalized, strict=True)
    ]


def rollout_metrics(batch: Batch) -> dict[str, float]:
    """`rollout/*` metrics of one train step's groups, and how the pipeline got them.

    Response lengths count the tokens the policy generated (not those a tool inserted,
    counted apart with the policy turns of multi-turn samples); staleness is the trained
    version minus the oldest policy version of each sample's tokens generated since it was
    drawn. What a scorer's dict held beside the reward is averaged per
    key as `rollout/reward_extra/<key>` (`reward_extra_means`).
    """
    samples = [s for g in batch.groups for s in g]
    rewards = [float(s.reward or 0.0) for s in samples]
    lengths = [sum(s.loss_mask) for s in samples]
    tally = batch.tally
    truncated = sum(s.status is SampleStatus.TRUNCATED for s in samples)
    tokens = sum(lengths)
    return {
        "rollout/reward_mean": statistics.fmean(rewards) if rewards else 0.0,
        "rollout/reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "rollout/num_samples": float(len(samples)),
        "rollout/num_groups": float(len(batch.groups)),
        "rollout/response_len_mean": statistics.fmean(lengths) if lengths else 0.0,
        "rollout/truncated_ratio": truncated / len(samples) if samples else 0.0,
        "rollout/filtered_groups": float(len(tally.filtered)),
        "rollout/aborted_groups": float(len(tally.cut_short) + len(tally.to_buffer)),
        "rollout/stale_groups_dropped": float(len(tally.dropped_stale)),
        "rollout/stale_groups_regenerated": float(len(tally.regenerated)),
        "rollout/staleness_mean": statistics.fmean(batch.staleness) if batch.staleness else 0.0,
        "rollout/staleness_max": float(max(batch.staleness, default=0)),
        "rollout/carried_over_tokens": float(sum(s.resumed_at for s in samples)),
        "rollout/response_tokens": float(tokens),
        "rollout/inserted_tokens": float(sum(len(s.loss_mask) for s in samples) - tokens),
        "rollout/turns_mean": statistics.fmean(s.turns for s in samples) if samples else 0.0,
        "perf/rollout_time_s": batch.wait_s,
        **reward_extra_means(samples, "rollout"),
    }


def accounting(batch: Batch, outstanding: list[int]) -> dict[str, list[int]]:
    """Which groups (by group index) this step trained, what happened to the others since
    the previous step, and which are still on their way (`outstanding`): every group drawn is
    in exactly one of these at any step."""
    return {
        "trained": [g[0].group_index for g in batch.groups],
        **batch.tally.as_record(),
        "outstanding": outstanding,
    }
