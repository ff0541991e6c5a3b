"""TorchTrainer: policy-gradient training of a local HF causal LM, data parallel over gloo.

One `train_step` consumes one rollout. Every rank receives the whole rollout (the same list
on every rank) and picks its own share of each optimizer step, so step-wide loss denominators
are known locally and need no communication.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from rlpost.algo.advantages import get_estimator
from rlpost.algo.losses import compute_loss
from rlpost.algo.schedule import lr_at_step
from rlpost.algo.steps import (
    RolloutTiming,
    SampleTensors,
    StepPlan,
    TokenStats,
    check_reference,
    has_rollout_logprobs,
    loads_reference,
    loss_inputs,
    metric_names,
    micro_batches,
    plan_steps,
    reuses_logprobs,
    rollout_metrics,
    sample_tensors,
    validate_sample,
)
from rlpost.backends.sglang.buckets import plan_buckets, weight_infos
from rlpost.backends.step_perf import StepMeter, forwards_run, host_memory_now_gib
from rlpost.backends.torch_trainer.attention import PACKED_SDPA
from rlpost.backends.torch_trainer.distributed import DataParallel
from rlpost.backends.torch_trainer.forward import forward_tokens, pack_samples
from rlpost.backends.torch_trainer.model_io import export_hf, freeze, load_causal_lm
from rlpost.backends.torch_trainer.optim import build_optimizer, set_lr
from rlpost.plan.prediction import TrainPrediction
from rlpost.schema import AlgoConfig, OptimConfig, TrainConfig
from rlpost.types import TrainSample

Which = Literal["actor", "ref"]
STATE_FILE = "rank_0.pt"


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
        collective_timeout_s: float = 600.0,
        init_method: str | None = None,
        attn_implementation: str = PACKED_SDPA,
        num_threads: int | None = None,
        reuse_logprobs_single_step: bool = True,
        share_prompts: bool = True,
        load_reference: bool | None = None,
        reference_dir: str | Path | None = None,
        prediction: TrainPrediction | None = None,
    ) -> None:
        """`model_dir`: the policy's HF folder; `reference_dir`: the reference's (default:
        the policy's); `prediction`: the plan's, logged beside what each step measured."""
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        host_before = host_memory_now_gib()
        self.model_dir = Path(model_dir)
        self.algo, self.optim, self.train = algo, optim, train
        self.temperature = rollout_temperature
        self.policy_loss_kind = get_estimator(algo.advantage_estimator).policy_loss
        # With one optimizer step per rollout the old policy is the current one, so the
        # training forward's own logprobs (detached) are the old logprobs: one pass saved.
        self.reuse_logprobs_single_step = reuse_logprobs_single_step
        # A group's samples share one copy of their prompt in the packed row (forward.py):
        # the same logprobs, the prompt's tokens computed once.
        self.share_prompts = share_prompts and attn_implementation == PACKED_SDPA
        self.dp = DataParallel(
            rank, world_size, master_addr, master_port, collective_timeout_s, init_method
        )
        self.dp.init()
        self.model = load_causal_lm(self.model_dir, attn_implementation)
        self.dp.broadcast_params(self.model)
        self.ref_model = (
            freeze(load_causal_lm(Path(reference_dir or model_dir), attn_implementation))
            if loads_reference(algo, load_reference)
            else None
        )
        self.optimizer = build_optimizer(self.model, optim)
        device = next(self.model.parameters()).device
        self.meter = StepMeter(device, world_size, prediction, host_before)
        self.step = 0
        self._offloaded_from: torch.device | None = None

    # ---- logprobs without gradients ------------------------------------------------------

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
            for micro in micro_batches([s.length for s in batch], self.train):
                packed = pack_samples([batch[i] for i in micro], self.share_prompts)
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
        return plan_steps(
            batch,
            self.train,
            self.algo,
            self.dp.rank,
            self.dp.world_size,
            share_prompts=self.share_prompts,
        )

    def _prepare(
        self, batch: Sequence[TrainSample], mine: list[int], reuse: bool, with_reference: bool
    ) -> dict[int, SampleTensors]:
        """Old/ref logprobs and advantages of this rank's samples, before any update."""
        samples = [batch[i] for i in mine]
        old = None if reuse else self.compute_logprobs(samples, "actor")
        ref = self.compute_logprobs(samples, "ref") if with_reference else None
        tensors = sample_tensors(samples, old, ref, self.algo, self.dp.sum)
        return dict(zip(mine, tensors, strict=True))

    def _micro_batch_loss(
        self,
        batch: Sequence[TrainSample],
        micro: list[int],
        data: dict[int, SampleTensors],
        denominator: float,
    ) -> dict[str, float]:
        packed = pack_samples([batch[i] for i in micro], self.share_prompts)
        entropy_mode = "grad" if self.algo.entropy_coef > 0 else "detached"
        out = forward_tokens(self.model, packed, self.temperature, entropy_mode)
        assert out.entropy is not None
        rows = [data[i] for i in micro]
        inputs = loss_inputs(
            rows, packed.segment_ids, out.logp, out.entropy, self.algo, denominator
        )
        result = compute_loss(inputs, self.algo, self.policy_loss_kind)
        torch.autograd.backward(result.loss)
        return {**result.metrics, **result.maxima}

    def _optimizer_step(
        self,
        batch: Sequence[TrainSample],
        plan: StepPlan,
        data: dict[int, SampleTensors],
        with_reference: bool,
    ) -> dict[str, float]:
        names = metric_names(self.algo, with_reference, has_rollout_logprobs(batch))
        sums = torch.zeros(len(names), dtype=torch.float64)
        maxima: dict[str, float] = {}
        self.optimizer.zero_grad(set_to_none=True)
        for micro in plan.micro_batches:
            metrics = self._micro_batch_loss(batch, micro, data, plan.denominator)
            sums += torch.tensor([metrics[n] for n in names], dtype=torch.float64)
            for key in metrics.keys() - set(names):  # maxima: this rank's largest value
                maxima[key] = max(maxima.get(key, metrics[key]), metrics[key])
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.dp.sum_grads(params)
        max_norm = self.optim.clip_grad if self.optim.clip_grad > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        lr = lr_at_step(self.step, self.optim)
        set_lr(self.optimizer, lr)
        self.optimizer.step()
        self.step += 1
        self.dp.sum(sums)
        summed = dict(zip(names, sums.tolist(), strict=True))
        return {**summed, **maxima, "grad_norm": grad_norm, "lr": lr}

    def train_step(
        self, batch: Sequence[TrainSample], with_reference: bool | None = None
    ) -> dict[str, float]:
        """Train on one rollout: all of its optimizer steps. Returns `train/*` metrics.
        `with_reference`: run the reference forward this rollout (the plan's
        TrainWork.reference_due; None: whenever it is loaded)."""
        self.meter.start()
        start = time.perf_counter()
        for index, sample in enumerate(batch):
            validate_sample(sample, index)
        ref = check_reference(self.algo, self.ref_model is not None, with_reference)
        plans = self.plan_steps(batch)
        mine = sorted(i for plan in plans for micro in plan.micro_batches for i in micro)
        reuse = reuses_logprobs(plans, self.algo, self.reuse_logprobs_single_step)
        data = self._prepare(batch, mine, reuse, ref)
        prepared = time.perf_counter()
        steps = [self._optimizer_step(batch, plan, data, ref) for plan in plans]
        timing = RolloutTiming(start, prepared, time.perf_counter())
        lengths, forwards = [s.length for s in batch], forwards_run(reuse, ref)
        perf = self.meter.metrics(lengths, forwards, timing.end_s - timing.start_s)
        return {**rollout_metrics(steps, plans, batch, timing), **perf}

    # ---- weights and checkpoints -----------------------------------------------------------

    def export_hf(self, out_dir: str | Path) -> Path:
        """Rank 0 writes the policy as an HF folder; every rank returns once it is there."""
        out = Path(out_dir)
        if self.dp.rank == 0:
            export_hf(self.model, self.model_dir, out)
        self.dp.barrier()
        return out

    def iter_hf_weights(self, bucket_bytes: int = 512 << 20) -> Iterator[list[tuple[str, Tensor]]]:
        """The policy in HF names (it is an HF model), in buckets of <= bucket_bytes of one
        dtype each. Local to this rank: every DP rank holds the whole model."""
        params = dict(self.model.named_parameters())
        for bucket in plan_buckets(weight_infos(list(params.items())), bucket_bytes):
            yield [(w.name, params[w.name].detach()) for w in bucket]

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

    def save_checkpoint(self, ckpt_dir: str | Path, with_optimizer: bool = True) -> None:
        """Rank 0 writes `ckpt_dir/rank_0.pt`: every DP rank holds an identical replica of
        the model and optimizer (gradients are summed before every step), so rank 0's copy is
        every rank's and loads into any number of ranks."""
        if self.dp.rank != 0:
            return
        state = self.state_dict()
        if not with_optimizer:
            state.pop("optimizer")
        path = Path(ckpt_dir) / STATE_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        # Through a Python file, so that a write the disk refuses (ENOSPC, EDQUOT, EFBIG) is
        # an OSError, which the run reports as a skipped save. torch's writer reports it as a
        # RuntimeError ("unexpected pos") that would end the run; the OSError is behind it.
        with path.open("wb") as f:
            try:
                torch.save(state, f)
            except RuntimeError as exc:
                if isinstance(exc.__context__, OSError):
                    raise exc.__context__ from exc
                raise

    def load_checkpoint(self, ckpt_dir: str | Path) -> None:
        """Every rank loads rank 0's copy; without a saved optimizer, Adam starts over."""
        state = torch.load(Path(ckpt_dir) / STATE_FILE, map_location="cpu", weights_only=True)
        if "optimizer" not in state:
            state["optimizer"] = self.optimizer.state_dict()
        self.load_state_dict(state)

    def offload(self) -> int:
        """Model, gradients and optimizer state to host memory; returns bytes moved off the
        accelerator (0 when the model already lives on the CPU)."""
        params = list(self.model.parameters())
        device = params[0].device if params else torch.device("cpu")
        if device.type == "cpu":
            return 0
        moved = sum(p.numel() * p.element_size() for p in params)
        self._offloaded_from = device
        self.model.to("cpu")
        for p in params:
            p.grad = None
        _move_optimizer(self.optimizer, torch.device("cpu"))
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return moved

    def onload(self) -> None:
        """Back to the device `offload` took the trainer from (a no-op when nothing moved)."""
        device, self._offloaded_from = self._offloaded_from, None
        if device is None:
            return
        self.model.to(device)
        _move_optimizer(self.optimizer, device)
        torch.cuda.synchronize()

    def close(self) -> None:
        self.dp.close()


def _move_optimizer(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, Tensor):
                state[key] = value.to(device, non_blocking=True)
