"""RL math: reward baselines, token advantages, losses and packing. Pure torch, no models."""

from rlpost.algo.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageEstimator,
    advantage_estimator,
    compute_advantages,
    get_estimator,
    needs_reference_kl,
    normalize_rewards,
    whiten,
)
from rlpost.algo.losses import (
    KL_ESTIMATORS,
    POLICY_LOSSES,
    LossInputs,
    LossOutput,
    compute_kl,
    compute_loss,
    entropy_from_logits,
    importance_weights,
    reduction_weights,
)
from rlpost.algo.packing import (
    balance_partitions,
    pack_first_fit,
    pack_fixed_count,
    pack_micro_batches,
    packing_efficiency,
    partition_ranks,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "AdvantageEstimator",
    "LossInputs",
    "LossOutput",
    "advantage_estimator",
    "balance_partitions",
    "compute_advantages",
    "compute_kl",
    "compute_loss",
    "entropy_from_logits",
    "get_estimator",
    "importance_weights",
    "needs_reference_kl",
    "normalize_rewards",
    "pack_first_fit",
    "pack_fixed_count",
    "pack_micro_batches",
    "packing_efficiency",
    "partition_ranks",
    "reduction_weights",
    "whiten",
]
