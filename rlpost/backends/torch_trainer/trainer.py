"""TorchTrainer: policy-gradient training of a local HF causal LM, sharded with FSDP2.

One `train_step` consumes one rollout. Every rank receives the whole rollout (the same list
on every rank) and picks its own share of each optimizer step, so step-wide loss denominators
are known locally and need no communication. Parameters, gradients and optimizer state are
sharded over the data-parallel ranks (distributed.py: gloo on CPU, NCCL on CUDA, one rank
included); every rank runs as many forwards as the busiest one, padding with empty
micro-batches, because each forward gathers the shards collectively. Rank 0 alone reads the
model's folder; the other ranks receive their shards from it (sharded_model.py).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from rlpost.algo.advantages import get_estimator
from rlpost.algo.losses import compute_loss
from rlpost.algo.schedule import lr_at_step
from rlpost.algo.steps import (
    RolloutTiming,
    SampleTensors,
    StepPlan,
    TokenStats,
    check_reference,
    even_counts,
    every_rank_steps,
    has_rollout_logprobs,
    loads_reference,
    loss_inputs,
    metric_names,
    micro_batches,
    reuses_logprobs,
    rollout_metrics,
    sample_tensors,
    validate_sample,
)
from rlpost.backends.hf_names import persistent_buffers, to_checkpoint
from rlpost.backends.megatron.hf_files import write_hf_folder
from rlpost.backends.sglang.buckets import plan_buckets, weight_infos
from rlpost.backends.step_perf import StepMeter, forwards_run, host_memory_now_gib
from rlpost.backends.torch_trainer.attention import PACKED_SDPA
from rlpost.backends.torch_trainer.checkpoint import load_sharded, save_sharded
from rlpost.backends.torch_trainer.distributed import (
    DataParallel,
    clip_grad_norm,
    gather_full,
    local_shard,
    reshard,
)
from rlpost.backends.torch_trainer.forward import (
    FILLER,
    PackedBatch,
    TokenForward,
    pack_samples,
)
from rlpost.backends.torch_trainer.optim import build_optimizer, set_lr
from rlpost.backends.torch_trainer.sharded_model import load_sharded_lm
from rlpost.backends.vector_math import warm_vector_math
from rlpost.plan.layout import ParallelLayout
from rlpost.plan.prediction import TrainPrediction
from rlpost.schema import AlgoConfig, OptimConfig, TrainConfig
from rlpost.schema.layout import FsdpLayout
from rlpost.types import TrainSample

Which = Literal["actor", "ref"]
MODEL_PREFIX = "lm."  # the HF model inside TokenForward; state dicts keep HF names


class TorchTrainer:
    """Trainer backend on torch: actor, optional frozen reference, AdamW, FSDP2 sharding."""

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
        device: str = "cpu",
        layout: ParallelLayout | None = None,
        fsdp: FsdpLayout | None = None,
        per_layer_units: bool | None = None,
        compute_dtype: str = "bf16",
        router_dtype: str = "fp32",
        grouped_gemm: bool | None = None,
        trains: bool = True,
    ) -> None:
        """`model_dir`: the policy's HF folder; `reference_dir`: the reference's (default:
        the policy's); `prediction`: the plan's, logged beside what each step measured;
        `device`: "cpu" or "cuda"; `layout`: the plan's (its recompute is honoured);
        `fsdp`: layout.train.fsdp (FSDP2's CPU offload, the HSDP shard group size, whether the
        policy's layers reshard after their forward; the reference keeps the default, since no
        backward follows its forward); `per_layer_units`: FSDP2 units per decoder layer
        (None: on CUDA or where the layers reshard after their forward; on CPU one unit by
        default, distributed.py says why); `compute_dtype`: model.params_dtype, what the
        layers compute in on CUDA ("bf16" or "fp32"; float32 on CPU); `router_dtype`:
        model.moe.router_dtype, what an MoE model's routers compute in there;
        `grouped_gemm`: model.moe.grouped_gemm (None: a dense model), whether its experts
        run as grouped matrix multiplies or one at a time; `trains` false (mode=eval): no
        optimizer, the rank only holds the weights to send them (a checkpoint loads its
        model part alone)."""
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        warm_vector_math()
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
            rank, world_size, master_addr, master_port, collective_timeout_s, init_method, device
        )
        self._owns_group = self.dp.init()
        fsdp = fsdp or FsdpLayout()
        mesh = self.dp.mesh(fsdp.shard_group_size)
        # Rank 0 reads the folder; the others build the model on the meta device and
        # receive their shards from it (sharded_model.py).
        layout = layout or ParallelLayout.single_process()
        self.policy = load_sharded_lm(
            self.model_dir,
            attn_implementation,
            self.dp,
            mesh,
            cpu_offload=fsdp.cpu_offload,
            layout=layout,
            per_layer=per_layer_units,
            reshard_after_forward=fsdp.reshard_after_forward,
            compute_dtype=compute_dtype,
            router_dtype=router_dtype,
            grouped_gemm=grouped_gemm,
        )
        self.model = self.policy.lm  # the HF model; its parameters are shards
        self.ref_model: TokenForward | None = None
        if loads_reference(algo, load_reference):
            self.ref_model = load_sharded_lm(
                Path(reference_dir or model_dir),
                attn_implementation,
                self.dp,
                mesh,
                cpu_offload=fsdp.cpu_offload,
                frozen=True,
                per_layer=per_layer_units,
                compute_dtype=compute_dtype,
                router_dtype=router_dtype,
                grouped_gemm=grouped_gemm,
            )
        self.optimizer: torch.optim.Optimizer | None = (
            build_optimizer(self.model, optim) if trains else None
        )
        self.device = self.dp.device
        self.meter = StepMeter(self.device, world_size, prediction, host_before)
        self.step = 0
        self._offloaded_from: torch.device | None = None

    # ---- logprobs without gradients ------------------------------------------------------

    def compute_token_stats(
        self, batch: Sequence[TrainSample], which: Which = "actor", with_entropy: bool = True
    ) -> TokenStats:
        """Per-sample response-token logprobs (and entropy, actor only), no gradients.

        Collective: every rank calls it (with its own batch) and runs as many forwards as the
        busiest rank."""
        model = self.policy if which == "actor" else self.ref_model
        if model is None:
            raise ValueError("no reference model is loaded: it is loaded only for KL terms")
        for index, sample in enumerate(batch):
            validate_sample(sample, index)
        entropy_mode = "detached" if with_entropy and which == "actor" else "none"
        logprobs: list[Tensor] = [torch.empty(0)] * len(batch)
        entropy: list[Tensor] = [torch.empty(0)] * len(batch)
        lengths = [s.length for s in batch]
        bins = self._even([micro_batches(lengths, self.train)], lengths)[0]
        with torch.no_grad():
            for micro in bins:
                packed, (logp, ent) = self._forward(model, batch, micro, entropy_mode)
                if not micro:  # an evening-out micro-batch: its outputs belong to no sample
                    continue
                for i, value in zip(micro, packed.split(logp.cpu()), strict=True):
                    logprobs[i] = value
                if ent is not None:
                    for i, value in zip(micro, packed.split(ent.cpu()), strict=True):
                        entropy[i] = value
        # Layers gathered for a forward stay so on CPU until a backward; none follows a
        # no-grad pass, and between calls every parameter is its shard again (what the
        # optimizer steps, the weight stream gathers and a checkpoint saves).
        reshard(model)
        return TokenStats(logprobs, entropy if entropy_mode != "none" else None)

    def _forward(
        self, model: TokenForward, batch: Sequence[TrainSample], micro: list[int], entropy: str
    ) -> tuple[PackedBatch, tuple[Tensor, Tensor | None]]:
        """One micro-batch through `model`; an empty one runs the filler sample."""
        samples = [batch[i] for i in micro] if micro else [FILLER]
        packed = pack_samples(samples, self.share_prompts).to(self.device)
        return packed, model(packed, self.temperature, entropy)

    def _even(self, groups: list[list[list[int]]], lengths: Sequence[int]) -> list[list[list[int]]]:
        """Each entry's micro-batches raised to the largest count any rank has for it."""
        return even_counts(groups, lengths, self.dp.max_counts([len(g) for g in groups]))

    def compute_logprobs(
        self, batch: Sequence[TrainSample], which: Which = "actor"
    ) -> list[Tensor]:
        return self.compute_token_stats(batch, which, with_entropy=False).logprobs

    # ---- training ------------------------------------------------------------------------

    def plan_steps(self, batch: Sequence[TrainSample]) -> list[StepPlan]:
        """Split the rollout into optimizer steps, this rank's share, and its micro-batches,
        as many per step as the busiest rank's (the rest empty). Every rank holds the whole
        rollout and plans every rank's share, so no collective is needed to learn the
        busiest one's count."""
        every = every_rank_steps(
            batch, self.train, self.algo, self.dp.world_size, share_prompts=self.share_prompts
        )
        plans = every[self.dp.rank]
        counts = [max(len(rank[i].micro_batches) for rank in every) for i in range(len(plans))]
        lengths = [s.length for s in batch]
        even = even_counts([p.micro_batches for p in plans], lengths, counts)
        return [dataclasses.replace(p, micro_batches=b) for p, b in zip(plans, even, strict=True)]

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
        """Forward and backward of one micro-batch; an empty one (evening out the ranks'
        counts) backpropagates a zero loss and reports nothing."""
        entropy_mode = "grad" if self.algo.entropy_coef > 0 else "detached"
        packed, (logp, entropy) = self._forward(self.policy, batch, micro, entropy_mode)
        if not micro:
            torch.autograd.backward(logp.sum() * 0.0)
            return {}
        assert entropy is not None
        rows = [_to_device(data[i], self.device) for i in micro]
        inputs = loss_inputs(rows, packed.segment_ids, logp, entropy, self.algo, denominator)
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
        optimizer = self._adam
        optimizer.zero_grad(set_to_none=True)
        for micro in plan.micro_batches:
            metrics = self._micro_batch_loss(batch, micro, data, plan.denominator)
            if not metrics:
                continue
            sums += torch.tensor([metrics[n] for n in names], dtype=torch.float64)
            for key in metrics.keys() - set(names):  # maxima: this rank's largest value
                maxima[key] = max(maxima.get(key, metrics[key]), metrics[key])
        params = [p for p in self.model.parameters() if p.requires_grad]
        max_norm = self.optim.clip_grad if self.optim.clip_grad > 0 else float("inf")
        grad_norm = clip_grad_norm(params, max_norm, self.dp, sums)  # sums summed with it
        lr = lr_at_step(self.step, self.optim)
        set_lr(optimizer, lr)
        optimizer.step()
        self.step += 1
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
        """Rank 0 writes the policy as an HF folder beside the base folder's config and
        tokenizer, in the checkpoint's layout (`iter_hf_weights`), each shard as soon as its
        buckets have arrived: no rank holds more than a shard and a bucket, and the others
        wait on no more than one shard's write at a time. Every rank returns once the folder
        is there. Collective."""
        out = Path(out_dir)
        buckets = self.iter_hf_weights()
        if self.dp.rank == 0:
            tensors = ((name, t.cpu()) for bucket in buckets for name, t in bucket)
            write_hf_folder(out, tensors, self.model_dir)
        else:
            for _ in buckets:
                pass
        self.dp.barrier()
        return out

    def iter_hf_weights(self, bucket_bytes: int = 512 << 20) -> Iterator[list[tuple[str, Tensor]]]:
        """The policy as its HF checkpoint stores it (names and layout: an MoE layer's
        experts one tensor each, `rlpost.backends.hf_names`), as the engines load it, in
        buckets of about bucket_bytes of one dtype each, every tensor whole (gathered from
        its shards). Collective: every rank must consume every bucket. This generator holds
        one bucket of gathered tensors at a time (twice that while it gathers one,
        `gather_full`); a consumer that drops each bucket before asking for the next holds
        no more. The persistent buffers (a router's expert bias) come last, in buckets of
        their own: every rank holds them whole, so they need no gathering."""
        params = dict(self.model.named_parameters())
        for plan in plan_buckets(weight_infos(list(params.items())), bucket_bytes):
            whole = gather_full([params[w.name].detach() for w in plan])
            bucket = to_checkpoint(
                self.model, {w.name: t for w, t in zip(plan, whole, strict=True)}
            )
            del whole
            yield list(bucket.items())
            del bucket
        buffers = persistent_buffers(self.model)
        for plan in plan_buckets(weight_infos(list(buffers.items())), bucket_bytes):
            yield list(to_checkpoint(self.model, {w.name: buffers[w.name] for w in plan}).items())

    def state_dict(self) -> dict[str, Any]:
        """Model (HF names), optimizer and step, whole tensors on the host of rank 0 (other
        ranks get empty model and optimizer entries). Collective."""
        model, optimizer = get_state_dict(
            self.policy,
            self._adam,
            options=StateDictOptions(full_state_dict=True, cpu_offload=True),
        )
        return {
            "model": {k.removeprefix(MODEL_PREFIX): v for k, v in model.items()},
            "optimizer": optimizer,
            "scheduler": {"step": self.step},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of `state_dict`: rank 0's whole tensors, sharded onto every rank.
        Collective; only rank 0's `state` needs the tensors."""
        options = StateDictOptions(
            full_state_dict=True, broadcast_from_rank0=self.dp.enabled, strict=True
        )
        reshard(self.policy)
        model = {MODEL_PREFIX + k: v for k, v in state.get("model", {}).items()}
        if "optimizer" in state:
            set_state_dict(
                self.policy,
                self._adam,
                model_state_dict=model,
                optim_state_dict=state["optimizer"],
                options=options,
            )
        else:
            set_model_state_dict(self.policy, model, options=options)
        self.step = int(state["scheduler"]["step"])

    def save_checkpoint(self, ckpt_dir: str | Path, with_optimizer: bool = True) -> None:
        """Every rank writes its shards of the model (HF names) and optimizer state, rank 0
        the step (`checkpoint.save_sharded`): the checkpoint loads under any data-parallel
        size. OSError on every rank when a disk refuses a write. Collective."""
        optimizer = self.optimizer if with_optimizer else None
        save_sharded(ckpt_dir, self.model, optimizer, {"step": self.step})

    def load_checkpoint(self, ckpt_dir: str | Path) -> None:
        """Each rank reads the shards it holds now, from a sharded checkpoint or rank 0's
        `rank_0.pt` of before; without a saved optimizer, Adam starts over. Collective."""
        reshard(self.policy)
        extra = load_sharded(ckpt_dir, self.model, self.optimizer)
        self.step = int(extra["step"])

    def offload(self) -> int:
        """This rank's shards of the model, its gradients and optimizer state to host memory;
        returns bytes moved off the accelerator (0 when the model already lives on the CPU,
        FSDP2's CPU offload included)."""
        params = list(self.policy.parameters())
        device = local_shard(params[0]).device if params else torch.device("cpu")
        if device.type == "cpu":
            return 0
        moved = sum(local_shard(p).numel() * local_shard(p).element_size() for p in params)
        self._offloaded_from = device
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
            _move_optimizer(self.optimizer, torch.device("cpu"))
        reshard(self.policy)
        self.policy.to("cpu")
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return moved

    def onload(self) -> None:
        """Back to the device `offload` took the trainer from (a no-op when nothing moved)."""
        device, self._offloaded_from = self._offloaded_from, None
        if device is None:
            return
        self.policy.to(device)
        if self.optimizer is not None:
            _move_optimizer(self.optimizer, device)
        torch.cuda.synchronize()

    @property
    def _adam(self) -> torch.optim.Optimizer:
        """The optimizer of a trainer that trains (`trains`; mode=eval builds none)."""
        if self.optimizer is None:
            raise RuntimeError("this trainer was built without an optimizer (mode=eval)")
        return self.optimizer

    def close(self) -> None:
        if self._owns_group:
            self.dp.close()


def _to_device(row: SampleTensors, device: torch.device) -> SampleTensors:
    moved = {
        f.name: getattr(row, f.name).to(device)
        for f in dataclasses.fields(row)
        if getattr(row, f.name) is not None
    }
    return dataclasses.replace(row, **moved)


def _move_optimizer(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, Tensor):
                state[key] = value.to(device, non_blocking=True)
