"""One rollout's training, backend-neutral: optimizer steps, each rank's share, the per-sample
loss inputs fixed before the first step, and the `train/*` metrics of the whole rollout.

Both trainer backends (torch and megatron-core) use these, so the same rollout gives the same
steps, micro-batches, denominators and advantages whichever trains it. Every rank receives the
whole rollout and takes its own share, so step-wide loss denominators are known locally.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rlpost.algo.advantages import MomentReducer, compute_advantages, needs_reference_kl
from rlpost.algo.losses import LossInputs, compute_kl, reduction_weights
from rlpost.algo.packing import (
    pack_micro_batches,
    packing_efficiency,
    partition_groups,
    partition_ranks,
)
from rlpost.schema import AlgoConfig, TrainConfig
from rlpost.types import TrainSample

BASE_METRICS = ("loss", "pg_loss", "entropy", "clipfrac", "ppo_kl")


@dataclass(frozen=True)
class StepPlan:
    """One optimizer step as seen by this rank; indices point into the rollout batch."""

    micro_batches: list[list[int]]
    denominator: float
    efficiency: float | None  # packing quality; only for token-capped micro-batches


@dataclass(frozen=True)
class SampleTensors:
    """Per-token inputs of one sample's loss, fixed before the first optimizer step."""

    mask: Tensor
    advantages: Tensor
    old_logp: Tensor | None
    ref_logp: Tensor | None
    rollout_logp: Tensor | None


@dataclass(frozen=True)
class TokenStats:
    """Per-sample response-token logprobs, and entropy when asked for."""

    logprobs: list[Tensor]
    entropy: list[Tensor] | None


# ---- samples -----------------------------------------------------------------------------


def validate_sample(sample: TrainSample, index: int) -> None:
    response = sample.response_length
    if not 0 < response < len(sample.tokens):
        raise ValueError(
            f"sample {index}: response_length={response} with {len(sample.tokens)} tokens; "
            "a trainable sample needs at least one prompt token and one response token"
        )
    for name in ("rollout_logprobs", "loss_mask"):
        values = getattr(sample, name)
        if values is not None and len(values) != response:
            raise ValueError(
                f"sample {index}: {name} has {len(values)} entries but response_length is "
                f"{response}; it must hold one entry per response token"
            )


def sample_loss_mask(sample: TrainSample) -> Tensor:
    if sample.loss_mask is None:
        return torch.ones(sample.response_length, dtype=torch.float32)
    return torch.tensor(sample.loss_mask, dtype=torch.float32)


def sample_rollout_logp(sample: TrainSample) -> Tensor | None:
    if sample.rollout_logprobs is None:
        return None
    return torch.tensor(sample.rollout_logprobs, dtype=torch.float32)


# ---- steps and micro-batches ---------------------------------------------------------------


def micro_batches(lengths: Sequence[int], train: TrainConfig, cp: int = 1) -> list[list[int]]:
    """Micro-batches of one rank's samples; the token cap covers the whole CP group."""
    cap = None if train.max_tokens_per_gpu is None else train.max_tokens_per_gpu * cp
    return pack_micro_batches(
        lengths,
        dynamic=train.use_dynamic_batch_size,
        max_tokens=cap,
        micro_batch_size=train.micro_batch_size,
    )


def step_denominator(samples: Sequence[TrainSample], algo: AlgoConfig) -> float:
    """Samples (sample_mean) or loss tokens (token_mean) of the whole step, on every rank."""
    if algo.loss_reduction == "sample_mean":
        return float(len(samples))
    tokens = sum(
        sum(s.loss_mask) if s.loss_mask is not None else s.response_length for s in samples
    )
    return max(float(tokens), 1.0)


def prompt_of(sample: TrainSample) -> tuple[int, ...]:
    """The tokens before the response (a multi-turn sample's first prompt)."""
    return tuple(sample.tokens[: len(sample.tokens) - sample.response_length])


def prompt_groups(samples: Sequence[TrainSample]) -> list[list[int]]:
    """Indices of the samples with the same prompt, groups in order of first appearance."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for index, sample in enumerate(samples):
        groups.setdefault(prompt_of(sample), []).append(index)
    return list(groups.values())


def _rank_shares(
    samples: Sequence[TrainSample], train: TrainConfig, dp_size: int, share_prompts: bool
) -> list[list[int]]:
    """One step's samples over the DP ranks. A trainer that packs a prompt once
    (`share_prompts`) keeps each group on one rank, balanced by the tokens it computes
    (the prompt once, every response), when balancing and when there are groups enough to
    give every rank one."""
    if share_prompts and train.balance_data and dp_size > 1:
        groups = prompt_groups(samples)
        if len(groups) >= dp_size:
            tokens = [
                len(prompt_of(samples[g[0]])) + sum(samples[i].response_length for i in g)
                for g in groups
            ]
            return partition_groups(tokens, groups, dp_size)
    return partition_ranks([s.length for s in samples], dp_size, train.balance_data)


def plan_steps(
    batch: Sequence[TrainSample],
    train: TrainConfig,
    algo: AlgoConfig,
    dp_rank: int,
    dp_size: int,
    cp: int = 1,
    share_prompts: bool = False,
) -> list[StepPlan]:
    """Optimizer steps of `train.global_batch_size` samples, this DP rank's micro-batches
    (`share_prompts`: the trainer packs a prompt once, so a rank takes whole groups)."""
    return every_rank_steps(batch, train, algo, dp_size, cp, share_prompts, [dp_rank])[0]


def every_rank_steps(
    batch: Sequence[TrainSample],
    train: TrainConfig,
    algo: AlgoConfig,
    dp_size: int,
    cp: int = 1,
    share_prompts: bool = False,
    ranks: Sequence[int] | None = None,
) -> list[list[StepPlan]]:
    """`plan_steps` of each of `ranks` (None: every DP rank), each step's shares split once.
    Every rank holds the whole rollout, so each can work out what the others will run (how
    many forwards to even out to) without asking them."""
    gbs = train.global_batch_size
    if not batch or len(batch) % gbs:
        raise ValueError(
            f"a rollout of {len(batch)} samples does not split into optimizer steps of "
            f"train.global_batch_size={gbs}; make the rollout a positive multiple of it"
        )
    wanted = list(range(dp_size) if ranks is None else ranks)
    plans: list[list[StepPlan]] = [[] for _ in wanted]
    for start in range(0, len(batch), gbs):
        step = list(range(start, start + gbs))
        shares = _rank_shares([batch[i] for i in step], train, dp_size, share_prompts)
        denominator = step_denominator([batch[i] for i in step], algo)
        for out, rank in zip(plans, wanted, strict=True):
            mine = [step[j] for j in shares[rank]]
            my_lengths = [batch[i].length for i in mine]
            local = micro_batches(my_lengths, train, cp)
            efficiency = None
            if train.use_dynamic_batch_size and train.max_tokens_per_gpu is not None:
                efficiency = packing_efficiency(my_lengths, local, train.max_tokens_per_gpu * cp)
            out.append(StepPlan([[mine[j] for j in mb] for mb in local], denominator, efficiency))
    return plans


def even_out(bins: list[list[int]], lengths: Sequence[int], count: int) -> list[list[int]]:
    """Split the fullest multi-sample micro-batches until there are `count` of them (ranks that
    share collectives in every forward must run the same number: megatron's expert-parallel
    all-to-alls, FSDP's all-gathers); empty ones fill the rest."""
    bins = [list(b) for b in bins]
    while len(bins) < count:
        splittable = [b for b in bins if len(b) > 1]
        if not splittable:
            bins.append([])
            continue
        fullest = max(splittable, key=lambda b: sum(lengths[i] for i in b))
        bins.remove(fullest)
        ordered = sorted(fullest, key=lambda i: -lengths[i])
        bins += [sorted(ordered[0::2]), sorted(ordered[1::2])]
    return bins


def even_counts(
    groups: Sequence[list[list[int]]], lengths: Sequence[int], counts: Sequence[int]
) -> list[list[list[int]]]:
    """Each entry's micro-batches evened out to its count (the largest any rank needs)."""
    return [even_out(g, lengths, n) for g, n in zip(groups, counts, strict=True)]


def reuses_logprobs(plans: Sequence[StepPlan], algo: AlgoConfig, allowed: bool) -> bool:
    """With one optimizer step per rollout the old policy is the current one, so the
    training forward's own (detached) logprobs are the old logprobs: one pass saved."""
    return allowed and len(plans) == 1 and not needs_reference_kl(algo)


def loads_reference(algo: AlgoConfig, load_reference: bool | None) -> bool:
    """A trainer's choice to load the reference: the plan's (Plan.work), or, when built
    without one (None), whenever the recipe ever reads its KL."""
    return algo.reference_interval > 0 if load_reference is None else load_reference


def check_reference(algo: AlgoConfig, loaded: bool, wanted: bool | None) -> bool:
    """Whether this rollout runs the reference forward: `wanted` (None: whenever it is
    loaded), refused when the reference is not loaded, or when the KL weighs in the loss or
    the reward and the rollout would go without it."""
    run = loaded if wanted is None else wanted
    if run and not loaded:
        raise ValueError(
            "no reference model is loaded (the plan loads it only when the recipe reads its "
            "KL: algo.kl_loss_coef, algo.kl_coef or algo.kl_metric_interval)"
        )
    if not run and (algo.kl_in_loss or algo.kl_in_reward):
        raise ValueError(
            "the KL to the reference weighs in this run's loss or reward: it "
            "cannot skip the reference forward"
        )
    return run


# ---- loss inputs ---------------------------------------------------------------------------


def sample_tensors(
    samples: Sequence[TrainSample],
    old: Sequence[Tensor] | None,
    ref: Sequence[Tensor] | None,
    algo: AlgoConfig,
    reduce: MomentReducer,
) -> list[SampleTensors]:
    """Masks, advantages (moments summed over DP ranks by `reduce`), old/ref/rollout logps."""
    masks = [sample_loss_mask(s) for s in samples]
    kls = None
    if needs_reference_kl(algo) and old is not None and ref is not None:
        kls = [compute_kl(o, r, algo.kl_loss_type) for o, r in zip(old, ref, strict=True)]
    advantages = compute_advantages([s.reward for s in samples], masks, algo, kls, reduce=reduce)
    return [
        SampleTensors(
            mask=masks[k],
            advantages=advantages[k],
            old_logp=None if old is None else old[k],
            ref_logp=None if ref is None else ref[k],
            rollout_logp=sample_rollout_logp(sample),
        )
        for k, sample in enumerate(samples)
    ]


def _cat(parts: Sequence[Tensor | None]) -> Tensor | None:
    present = [p for p in parts if p is not None]
    return torch.cat(present) if len(present) == len(parts) else None


def loss_inputs(
    rows: Sequence[SampleTensors],
    segment_ids: Tensor,
    logp: Tensor,
    entropy: Tensor,
    algo: AlgoConfig,
    denominator: float,
) -> LossInputs:
    """One micro-batch's LossInputs (rlpost.algo.losses), samples in micro-batch order."""
    mask = torch.cat([r.mask for r in rows])
    old_logp = _cat([r.old_logp for r in rows])
    return LossInputs(
        logp=logp,
        old_logp=logp.detach() if old_logp is None else old_logp,
        advantages=torch.cat([r.advantages for r in rows]),
        weights=reduction_weights(segment_ids, mask, algo.loss_reduction, denominator),
        segment_ids=segment_ids,
        mask=mask,
        entropy=entropy,
        ref_logp=_cat([r.ref_logp for r in rows]),
        rollout_logp=_cat([r.rollout_logp for r in rows]),
    )


# ---- metrics -------------------------------------------------------------------------------


def metric_names(
    algo: AlgoConfig, with_reference: bool, with_rollout_logprobs: bool = False
) -> list[str]:
    """The loss metrics every micro-batch reports, summed over micro-batches and ranks
    (the KL to the reference on the rollouts the reference runs; the mean absolute
    difference between the trainer's and the engines' token logprobs when the samples
    carry the engines')."""
    corrected = algo.off_policy_correction != "none"
    return [
        *BASE_METRICS,
        *(["kl"] if with_reference else []),
        *(["is_weight", "is_clipfrac"] if corrected else []),
        *(["rollout_logprob_abs_diff"] if with_rollout_logprobs else []),
    ]


def has_rollout_logprobs(batch: Sequence[TrainSample]) -> bool:
    return all(sample.rollout_logprobs is not None for sample in batch)


@dataclass(frozen=True)
class RolloutTiming:
    start_s: float
    prepared_s: float
    end_s: float


def rollout_metrics(
    steps: Sequence[dict[str, float]],
    plans: Sequence[StepPlan],
    batch: Sequence[TrainSample],
    timing: RolloutTiming,
) -> dict[str, float]:
    """`train/*` metrics of one rollout: per-step values averaged (lr: the last step's),
    plus step and micro-batch counts, timings, throughput and packing efficiency."""
    elapsed = timing.end_s - timing.start_s
    metrics = {
        f"train/{k}": max(s[k] for s in steps)
        if k.endswith("_max")
        else sum(s[k] for s in steps) / len(steps)
        for k in steps[0]
    }
    metrics["train/lr"] = steps[-1]["lr"]
    tokens = sum(s.length for s in batch)
    metrics.update(
        {
            "train/optimizer_steps": float(len(plans)),
            "train/micro_batches": float(sum(len(p.micro_batches) for p in plans)),
            "train/prepare_time_s": timing.prepared_s - timing.start_s,
            "train/time_s": elapsed,
            "train/samples_per_s": len(batch) / elapsed,
            "train/tokens_per_s": tokens / elapsed,
        }
    )
    efficiencies = [p.efficiency for p in plans if p.efficiency is not None]
    if efficiencies:
        metrics["train/packing_efficiency"] = sum(efficiencies) / len(efficiencies)
    return metrics
