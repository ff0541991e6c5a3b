"""Policy-gradient loss terms on flat response tokens, reduced by step-wide denominators.

Every tensor here is flat over the response tokens of one micro-batch (several samples
packed back to back). `segment_ids[i]` is the sample (0..num_samples-1 within the micro-batch)
that token i belongs to. Each token carries a reduction weight fixed for the whole optimizer
step (see `reduction_weights`), so the sum of `weight * term` over all micro-batches and ranks
is the step's loss whatever the packing or the micro-batch size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from rlpost.schema import AlgoConfig

KL_CLAMP = 10.0

KLEstimator = Callable[[Tensor, Tensor], Tensor]
KL_ESTIMATORS: dict[str, KLEstimator] = {}


def kl_estimator(*names: str) -> Callable[[KLEstimator], KLEstimator]:
    def register(fn: KLEstimator) -> KLEstimator:
        for name in names:
            KL_ESTIMATORS[name] = fn
        return fn

    return register


@kl_estimator("k1")
def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return logp - ref_logp


@kl_estimator("k2")
def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return (logp - ref_logp).square() / 2


@kl_estimator("k3", "low_var_kl")
def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Unbiased, non-negative; clamped because exp(-log r) explodes when ref >> policy."""
    log_ratio = logp - ref_logp
    return (torch.exp(-log_ratio) - 1 + log_ratio).clamp(-KL_CLAMP, KL_CLAMP)


def compute_kl(logp: Tensor, ref_logp: Tensor, kind: str) -> Tensor:
    return KL_ESTIMATORS[kind](logp, ref_logp)


# ---- policy losses ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyTerms:
    """Per-token policy loss and its diagnostics."""

    loss: Tensor
    clipped: Tensor
    ppo_kl: Tensor


PolicyLoss = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, AlgoConfig], PolicyTerms]
POLICY_LOSSES: dict[str, PolicyLoss] = {}


def policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    def register(fn: PolicyLoss) -> PolicyLoss:
        POLICY_LOSSES[name] = fn
        return fn

    return register


def clipped_surrogate(log_ratio: Tensor, advantages: Tensor, algo: AlgoConfig) -> PolicyTerms:
    """max(-r A, -clip(r, 1-eps, 1+eps_high) A), then dual clip of negative advantages."""
    eps_high = algo.eps_clip if algo.eps_clip_high is None else algo.eps_clip_high
    ratio = torch.exp(log_ratio)
    unclipped = -ratio * advantages
    clipped = -ratio.clamp(1 - algo.eps_clip, 1 + eps_high) * advantages
    loss = torch.maximum(unclipped, clipped)
    if algo.eps_clip_c is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -algo.eps_clip_c * advantages), loss)
    # max/min pick one operand exactly, so inequality means a clip decided this token.
    was_clipped = (loss != unclipped).float()
    return PolicyTerms(loss, was_clipped, -log_ratio.detach())


@policy_loss("ppo_clip")
def ppo_clip_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    segment_ids: Tensor,
    mask: Tensor,
    algo: AlgoConfig,
) -> PolicyTerms:
    return clipped_surrogate(logp - old_logp, advantages, algo)


@policy_loss("gspo")
def gspo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    segment_ids: Tensor,
    mask: Tensor,
    algo: AlgoConfig,
) -> PolicyTerms:
    """Sequence-level ratio: each sample's masked mean log ratio, on all of its tokens."""
    seq_log_ratio = segment_mean(logp - old_logp, segment_ids, mask)[segment_ids]
    return clipped_surrogate(seq_log_ratio, advantages, algo)


def segment_mean(values: Tensor, segment_ids: Tensor, mask: Tensor) -> Tensor:
    """Masked mean of `values` per segment; one entry per segment id."""
    num_segments = int(segment_ids.max()) + 1 if segment_ids.numel() else 0
    zeros = torch.zeros(num_segments, dtype=values.dtype, device=values.device)
    sums = zeros.index_add(0, segment_ids, values * mask)
    counts = torch.zeros_like(zeros, dtype=mask.dtype).index_add(0, segment_ids, mask)
    return sums / counts.clamp(min=1)


# ---- per-token pieces ------------------------------------------------------------------------


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) along the last dim."""
    return entropy_of_log_probs(torch.log_softmax(logits.float(), dim=-1))


def entropy_of_log_probs(log_probs: Tensor) -> Tensor:
    return -(log_probs.exp() * log_probs).sum(dim=-1)


def importance_weights(
    old_logp: Tensor, rollout_logp: Tensor, algo: AlgoConfig
) -> tuple[Tensor, Tensor]:
    """(per-token weight, whether it was cut) for algo.off_policy_correction.

    Both weigh by pi_old / pi_rollout: the policy the ratio is clipped against (recomputed
    at train time: the proximal policy) over the one that sampled the token (the engines,
    possibly several versions older). tis clamps the weight into [tis_clip_low,
    tis_clip_high]; decoupled_ppo keeps it as it is and drops tokens whose weight exceeds
    behaviour_weight_cap (weight 0), so a few very unlikely tokens cannot dominate.
    """
    raw = torch.exp(old_logp - rollout_logp)
    if algo.off_policy_correction == "tis":
        clamped = raw.clamp(algo.tis_clip_low, algo.tis_clip_high)
        return clamped, clamped != raw
    dropped = raw > algo.behaviour_weight_cap
    return raw.masked_fill(dropped, 0.0), dropped


def reduction_weights(
    segment_ids: Tensor,
    mask: Tensor,
    reduction: str,
    step_denominator: float,
) -> Tensor:
    """Per-token weights whose weighted sum gives this micro-batch's share of the step loss.

    sample_mean: a sample's masked token mean, summed over samples, over the step's sample
    count. token_mean: the masked token sum over the step's loss-token count.
    """
    return REDUCTIONS[reduction](segment_ids, mask.float()) / step_denominator


def _sample_mean_weights(segment_ids: Tensor, mask: Tensor) -> Tensor:
    num_segments = int(segment_ids.max()) + 1 if segment_ids.numel() else 0
    counts = torch.zeros(num_segments, dtype=mask.dtype, device=mask.device)
    counts = counts.index_add(0, segment_ids, mask)
    return mask / counts.clamp(min=1)[segment_ids]


def _token_mean_weights(segment_ids: Tensor, mask: Tensor) -> Tensor:
    return mask


REDUCTIONS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "sample_mean": _sample_mean_weights,
    "token_mean": _token_mean_weights,
}


# ---- the total -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LossInputs:
    """One micro-batch, flat over response tokens. `entropy` keeps its graph when used."""

    logp: Tensor
    old_logp: Tensor
    advantages: Tensor
    weights: Tensor
    segment_ids: Tensor
    mask: Tensor
    entropy: Tensor
    ref_logp: Tensor | None = None
    rollout_logp: Tensor | None = None


@dataclass(frozen=True)
class LossOutput:
    loss: Tensor
    metrics: dict[str, float]
    maxima: dict[str, float]


def compute_loss(inputs: LossInputs, algo: AlgoConfig, policy_loss_kind: str) -> LossOutput:
    """pg * w - entropy_coef * entropy + kl_loss_coef * kl, weighted to the step's share, where
    w is the off-policy importance weight (1 without a correction).

    `metrics` holds weighted sums (so sums over micro-batches and ranks are step means);
    `maxima` the largest value of a quantity in this micro-batch.
    """
    w = inputs.weights
    terms = POLICY_LOSSES[policy_loss_kind](
        inputs.logp, inputs.old_logp, inputs.advantages, inputs.segment_ids, inputs.mask, algo
    )
    pg = terms.loss
    metrics: dict[str, Tensor] = {}
    maxima: dict[str, float] = {}
    if algo.off_policy_correction != "none":
        if inputs.rollout_logp is None:
            raise ValueError(
                f"algo.off_policy_correction={algo.off_policy_correction} needs rollout "
                "logprobs from the engine, but a sample has none"
            )
        weight, cut = importance_weights(inputs.old_logp, inputs.rollout_logp, algo)
        pg = pg * weight
        metrics["is_weight"] = weight
        metrics["is_clipfrac"] = cut.float()
        raw = torch.exp(inputs.old_logp - inputs.rollout_logp) * inputs.mask
        maxima["is_weight_max"] = float(raw.max()) if raw.numel() else 0.0
    if inputs.rollout_logp is not None:
        # the engines' numerics against the trainer's (FP8 rollout, other kernels), and the
        # policy versions between them in the async loops
        metrics["rollout_logprob_abs_diff"] = (inputs.old_logp - inputs.rollout_logp).abs()
    total = pg - algo.entropy_coef * inputs.entropy
    if inputs.ref_logp is not None:  # measured on the rollouts the reference runs
        kl = compute_kl(inputs.logp, inputs.ref_logp, algo.kl_loss_type)
        metrics["kl"] = kl
        if algo.use_kl_loss:
            total = total + algo.kl_loss_coef * kl
    metrics.update(pg_loss=pg, entropy=inputs.entropy, clipfrac=terms.clipped, ppo_kl=terms.ppo_kl)
    loss = (total * w).sum()
    with torch.no_grad():
        sums = {name: float((value.detach() * w).sum()) for name, value in metrics.items()}
    sums["loss"] = float(loss.detach())
    return LossOutput(loss, sums, maxima)
