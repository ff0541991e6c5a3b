"""Who trains on what in one rollout: optimizer steps, this rank's share, its micro-batches.

The same arithmetic as the torch backend (rlpost.algo.packing): samples are split over
data-parallel ranks per optimizer step, then packed under max_tokens_per_gpu x cp. One
difference: ranks that meet in expert-parallel all-to-alls must run equally many
micro-batches, so every rank takes the largest count any rank needs (`equalize`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from rlpost.algo.advantages import MomentReducer, compute_advantages, needs_reference_kl
from rlpost.algo.losses import LossInputs, compute_kl, reduction_weights
from rlpost.algo.packing import pack_micro_batches, packing_efficiency, partition_ranks
from rlpost.backends.megatron.batches import even_out
from rlpost.backends.torch_trainer.forward import sample_loss_mask, sample_rollout_logp
from rlpost.schema import AlgoConfig, TrainConfig
from rlpost.types import TrainSample


@dataclass(frozen=True)
class StepPlan:
    """One optimizer step as seen by this rank; indices point into the rollout batch."""

    micro_batches: list[list[int]]
    denominator: float
    efficiency: float | None


@dataclass(frozen=True)
class SampleTensors:
    """Per-token inputs of one sample's loss, fixed before the first optimizer step."""

    mask: Tensor
    advantages: Tensor
    old_logp: Tensor | None
    ref_logp: Tensor | None
    rollout_logp: Tensor | None


def micro_batches(lengths: Sequence[int], train: TrainConfig, cp: int) -> list[list[int]]:
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


def plan_steps(
    batch: Sequence[TrainSample],
    train: TrainConfig,
    algo: AlgoConfig,
    dp_rank: int,
    dp_size: int,
    cp: int,
) -> list[StepPlan]:
    """Optimizer steps of `train.global_batch_size` samples, this DP rank's micro-batches."""
    gbs = train.global_batch_size
    if not batch or len(batch) % gbs:
        raise ValueError(
            f"a rollout of {len(batch)} samples does not split into optimizer steps of "
            f"train.global_batch_size={gbs}; make the rollout a positive multiple of it"
        )
    plans = []
    for start in range(0, len(batch), gbs):
        step = list(range(start, start + gbs))
        lengths = [batch[i].length for i in step]
        mine = [step[j] for j in partition_ranks(lengths, dp_size, train.balance_data)[dp_rank]]
        my_lengths = [batch[i].length for i in mine]
        local = micro_batches(my_lengths, train, cp)
        efficiency = None
        if train.use_dynamic_batch_size and train.max_tokens_per_gpu is not None:
            efficiency = packing_efficiency(my_lengths, local, train.max_tokens_per_gpu * cp)
        denominator = step_denominator([batch[i] for i in step], algo)
        plans.append(StepPlan([[mine[j] for j in mb] for mb in local], denominator, efficiency))
    return plans


def equalize(
    groups: list[list[list[int]]], lengths: Sequence[int], synced: bool
) -> list[list[list[int]]]:
    """Every rank's micro-batch count per entry raised to the world's largest."""
    counts = torch.tensor([len(g) for g in groups], dtype=torch.long)
    if synced and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(counts, op=dist.ReduceOp.MAX)
    return [even_out(g, lengths, int(n)) for g, n in zip(groups, counts.tolist(), strict=True)]


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
