"""TorchTrainer: policy-gradient training of a local HF causal LM, data parallel over gloo.

One `train_step` consumes one rollout. Every rank receives the whole rollout (the same list
on every rank) and picks its own share of each optimizer step, so step-wide loss denominators
are known locally and need no communication.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from rlpost.algo.advantages import compute_advantages, get_estimator, needs_reference_kl
from rlpost.algo.losses import LossInputs, compute_kl, compute_loss, reduction_weights
from rlpost.algo.packing import pack_micro_batches, packing_efficiency, partition_ranks
from rlpost.backends.torch_trainer.attention import PACKED_SDPA
from rlpost.backends.torch_trainer.distributed import DataParallel
from rlpost.backends.torch_trainer.forward import (
    forward_tokens,
    pack_samples,
    sample_loss_mask,
    sample_rollout_logp,
    validate_sample,
)
from rlpost.backends.torch_trainer.model_io import export_hf, freeze, load_causal_lm
from rlpost.backends.torch_trainer.optim import build_optimizer, lr_at_step, set_lr
from rlpost.schema import AlgoConfig, OptimConfig, TrainConfig
from rlpost.types import TrainSample

Which = Literal["actor", "ref"]


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
    logprobs: list[Tensor]
    entropy: list[Tensor] | None


def _cat(parts: Sequence[Tensor | None]) -> Tensor | None:
    return None if any(p is None for p in parts) else torch.cat(list(parts))  # type: ignore[arg-type]


class TorchTrainer:
    """Trainer backend on torch: actor, optional frozen reference, AdamW, gloo data parallel."""

    def __init__(
        self,
        model_dir: str | Path,
        algo: AlgoConfig,
        optim: OptimConfig,
        train: TrainConfig,
        *,
        rollout_temperature: float = 1.0,
        rank: int = 0,
        world_size: int = 1,
        master_addr: str = "127.0.0.1",
        master_port: int = 29500,
        attn_implementation: str = PACKED_SDPA,
        num_threads: int | None = None,
        reuse_logprobs_single_step: bool = True,
    ) -> None:
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.model_dir = Path(model_dir)
        self.algo, self.optim, self.train = algo, optim, train
        self.temperature = rollout_temperature
        self.policy_loss_kind = get_estimator(algo.advantage_estimator).policy_loss
        # With one optimizer step per rollout the old policy is the current one, so the
        # training forward's own logprobs (detached) are the old logprobs: one pass saved.
        self.reuse_logprobs_single_step = reuse_logprobs_single_step
        self.dp = DataParallel(rank, world_size, master_addr, master_port)
        self.dp.init()
        self.model = load_causal_lm(self.model_dir, attn_implementation)
        self.dp.broadcast_params(self.model)
        wants_ref = algo.use_kl_loss or needs_reference_kl(algo)
        self.ref_model = (
            freeze(load_causal_lm(self.model_dir, attn_implementation)) if wants_ref else None
        )
        self.optimizer = build_optimizer(self.model, optim)
        self.step = 0

    # ---- logprobs without gradients ------------------------------------------------------

    def _micro_batches(self, lengths: Sequence[int]) -> list[list[int]]:
        return pack_micro_batches(
            lengths,
            dynamic=self.train.use_dynamic_batch_size,
            max_tokens=self.train.max_tokens_per_gpu,
            micro_batch_size=self.train.micro_batch_size,
        )

    def compute_token_stats(
        self, batch: Sequence[TrainSample], which: Which = "actor", with_entropy: bool = True
    ) -> TokenStats:
        """Per-sample response-token logprobs (and entropy, actor only), no gradients."""
        model = self.model if which == "actor" else self.ref_model
        if model is None:
            raise ValueError("no reference model is loaded: it is loaded only for KL terms")
        for index, sample in enumerate(batch):
            validate_sample(sample, index)
        entropy_mode = "detached" if with_entropy and which == "actor" else "none"
        logprobs: list[Tensor] = [torch.empty(0)] * len(batch)
        entropy: list[Tensor] = [torch.empty(0)] * len(batch)
        with torch.no_grad():
            for micro in self._micro_batches([s.length for s in batch]):
                packed = pack_samples([batch[i] for i in micro])
                out = forward_tokens(model, packed, self.temperature, entropy_mode)
                for i, value in zip(micro, packed.split(out.logp), strict=True):
                    logprobs[i] = value
                if out.entropy is not None:
                    for i, value in zip(micro, packed.split(out.entropy), strict=True):
                        entropy[i] = value
        return TokenStats(logprobs, entropy if entropy_mode != "none" else None)

    def compute_logprobs(
        self, batch: Sequence[TrainSample], which: Which = "actor"
    ) -> list[Tensor]:
        return self.compute_token_stats(batch, which, with_entropy=False).logprobs

    # ---- training ------------------------------------------------------------------------

    def plan_steps(self, batch: Sequence[TrainSample]) -> list[StepPlan]:
        """Split the rollout into optimizer steps, this rank's share, and its micro-batches."""
        gbs = self.train.global_batch_size
        if not batch or len(batch) % gbs:
            raise ValueError(
                f"a rollout of {len(batch)} samples does not split into optimizer steps of "
                f"train.global_batch_size={gbs}; make the rollout a positive multiple of it"
            )
        plans = []
        for start in range(0, len(batch), gbs):
            step = list(range(start, start + gbs))
            lengths = [batch[i].length for i in step]
            share = partition_ranks(lengths, self.dp.world_size, self.train.balance_data)
            mine = [step[j] for j in share[self.dp.rank]]
            my_lengths = [batch[i].length for i in mine]
            local = self._micro_batches(my_lengths)
            cap = self.train.max_tokens_per_gpu
            efficiency = None
            if self.train.use_dynamic_batch_size and cap is not None:
                efficiency = packing_efficiency(my_lengths, local, cap)
            plans.append(
                StepPlan(
                    [[mine[j] for j in mb] for mb in local],
                    self._denominator(batch, step),
                    efficiency,
                )
            )
        return plans

    def _denominator(self, batch: Sequence[TrainSample], step: list[int]) -> float:
        if self.algo.loss_reduction == "sample_mean":
            return float(len(step))
        tokens = sum(float(sample_loss_mask(batch[i]).sum()) for i in step)
        return max(tokens, 1.0)

    def _prepare(
        self, batch: Sequence[TrainSample], mine: list[int], reuse: bool
    ) -> dict[int, SampleTensors]:
        """Old/ref logprobs and advantages of this rank's samples, before any update."""
        samples = [batch[i] for i in mine]
        masks = [sample_loss_mask(s) for s in samples]
        old = None if reuse else self.compute_logprobs(samples, "actor")
        ref = self.compute_logprobs(samples, "ref") if self.ref_model is not None else None
        kls = None
        if needs_reference_kl(self.algo) and old is not None and ref is not None:
            kls = [compute_kl(o, r, self.algo.kl_loss_type) for o, r in zip(old, ref, strict=True)]
        rewards = [s.reward for s in samples]
        advantages = compute_advantages(rewards, masks, self.algo, kls, reduce=self.dp.sum)
        return {
            index: SampleTensors(
                mask=masks[k],
                advantages=advantages[k],
                old_logp=None if old is None else old[k],
                ref_logp=None if ref is None else ref[k],
                rollout_logp=sample_rollout_logp(samples[k]),
            )
            for k, index in enumerate(mine)
        }

    def _metric_names(self) -> list[str]:
        names = ["loss", "pg_loss", "kl", "entropy", "clipfrac", "ppo_kl"]
        return names + (["tis_weight"] if self.algo.use_tis else [])

    def _micro_batch_loss(
        self,
        batch: Sequence[TrainSample],
        micro: list[int],
        data: dict[int, SampleTensors],
        denominator: float,
    ) -> dict[str, float]:
        packed = pack_samples([batch[i] for i in micro])
        entropy_mode = "grad" if self.algo.entropy_coef > 0 else "detached"
        out = forward_tokens(self.model, packed, self.temperature, entropy_mode)
        rows = [data[i] for i in micro]
        mask = torch.cat([r.mask for r in rows])
        old_logp = _cat([r.old_logp for r in rows])
        assert out.entropy is not None
        inputs = LossInputs(
            logp=out.logp,
            old_logp=out.logp.detach() if old_logp is None else old_logp,
            advantages=torch.cat([r.advantages for r in rows]),
            weights=reduction_weights(
                packed.segment_ids, mask, self.algo.loss_reduction, denominator
            ),
            segment_ids=packed.segment_ids,
            mask=mask,
            entropy=out.entropy,
            ref_logp=_cat([r.ref_logp for r in rows]),
            rollout_logp=_cat([r.rollout_logp for r in rows]),
        )
        result = compute_loss(inputs, self.algo, self.policy_loss_kind)
        torch.autograd.backward(result.loss)
        return result.metrics

    def _optimizer_step(
        self, batch: Sequence[TrainSample], plan: StepPlan, data: dict[int, SampleTensors]
    ) -> dict[str, float]:
        names = self._metric_names()
        sums = torch.zeros(len(names), dtype=torch.float64)
        self.optimizer.zero_grad(set_to_none=True)
        for micro in plan.micro_batches:
            metrics = self._micro_batch_loss(batch, micro, data, plan.denominator)
            sums += torch.tensor([metrics[n] for n in names], dtype=torch.float64)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.dp.sum_grads(params)
        max_norm = self.optim.clip_grad if self.optim.clip_grad > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        lr = lr_at_step(self.step, self.optim)
        set_lr(self.optimizer, lr)
        self.optimizer.step()
        self.step += 1
        self.dp.sum(sums)
        return {**dict(zip(names, sums.tolist(), strict=True)), "grad_norm": grad_norm, "lr": lr}

    def train_step(self, batch: Sequence[TrainSample]) -> dict[str, float]:
        """Train on one rollout: all of its optimizer steps. Returns `train/*` metrics."""
        start = time.perf_counter()
        for index, sample in enumerate(batch):
            validate_sample(sample, index)
        plans = self.plan_steps(batch)
        mine = sorted(i for plan in plans for micro in plan.micro_batches for i in micro)
        reuse = (
            self.reuse_logprobs_single_step
            and len(plans) == 1
            and not needs_reference_kl(self.algo)
        )
        data = self._prepare(batch, mine, reuse)
        prepared = time.perf_counter()
        steps = [self._optimizer_step(batch, plan, data) for plan in plans]
        elapsed = time.perf_counter() - start
        metrics = {f"train/{k}": sum(s[k] for s in steps) / len(steps) for k in steps[0]}
        metrics["train/lr"] = steps[-1]["lr"]
        tokens = sum(s.length for s in batch)
        micro_batches = sum(len(p.micro_batches) for p in plans)
        metrics.update(
            {
                "train/optimizer_steps": float(len(plans)),
                "train/micro_batches": float(micro_batches),
                "train/prepare_time_s": prepared - start,
                "train/time_s": elapsed,
                "train/samples_per_s": len(batch) / elapsed,
                "train/tokens_per_s": tokens / elapsed,
            }
        )
        efficiencies = [p.efficiency for p in plans if p.efficiency is not None]
        if efficiencies:
            metrics["train/packing_efficiency"] = sum(efficiencies) / len(efficiencies)
        return metrics

    # ---- weights and checkpoints -----------------------------------------------------------

    def export_hf(self, out_dir: str | Path) -> Path:
        """Rank 0 writes the policy as an HF folder; every rank returns once it is there."""
        out = Path(out_dir)
        if self.dp.rank == 0:
            export_hf(self.model, self.model_dir, out)
        self.dp.barrier()
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": {"step": self.step},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["scheduler"]["step"])

    def close(self) -> None:
        self.dp.close()
