"""MegatronTrainer: policy-gradient training of a megatron-core GPTModel under the plan's layout.

The same interface and metrics as the torch backend (TorchTrainer), the same losses and
advantages (rlpost.algo). One process per train GPU; every public method is collective: all
ranks call it, with the same rollout. Tensor, pipeline (1F1B), context, expert and data
parallelism come from the ParallelLayout; the distributed optimizer shards Adam over DP x CP.
On a machine without CUDA everything runs on CPU over gloo (see compat.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core.distributed import DistributedDataParallel
from megatron.core.optimizer import get_megatron_optimizer
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
from rlpost.backends.megatron.batches import CU_SEQLENS, MicroBatch, build_micro_batch
from rlpost.backends.megatron.compat import cpu_compat, needs_cpu_compat
from rlpost.backends.megatron.config import megatron_settings
from rlpost.backends.megatron.convert import (
    ModelWeights,
    iter_hf_weights,
    load_hf_weights,
    load_torch_dist,
)
from rlpost.backends.megatron.distributed import (
    ProcessPlace,
    all_reduce_sum,
    compute_device,
    destroy_parallel,
    init_parallel,
)
from rlpost.backends.megatron.export import export_hf_folder
from rlpost.backends.megatron.hf_files import HFCheckpoint
from rlpost.backends.megatron.kernels import (
    attach_positions,
    fuse_adam,
    inverse_frequencies,
    rope_table,
)
from rlpost.backends.megatron.layers import gather_along_sequence
from rlpost.backends.megatron.logits import hidden_logprobs, output_layer_input
from rlpost.backends.megatron.mtp import mtp_loss_factor, mtp_step_metrics, with_mtp_targets
from rlpost.backends.megatron.packed import with_rope
from rlpost.backends.megatron.provider import build_gpt_model
from rlpost.backends.megatron.schedule import finalize_grads, from_last_stage, run_micro_batches
from rlpost.backends.megatron.steps import equalize
from rlpost.backends.megatron.trainer_state import (
    load_state,
    load_weights,
    offload_to_host,
    onload_from_host,
    save_state,
)
from rlpost.backends.rope import scaled_frequencies
from rlpost.backends.step_perf import StepMeter, forwards_run, host_memory_now_gib
from rlpost.backends.vector_math import warm_vector_math
from rlpost.plan.layout import ParallelLayout
from rlpost.plan.prediction import TrainPrediction
from rlpost.schema import AlgoConfig, ModelConfig, OptimConfig, TrainConfig
from rlpost.types import TrainSample

Which = Literal["actor", "ref"]
NO_CLIP = 1e30  # clip_grad 0 means "report the norm, never clip"
# torch's fused AdamW on both: one kernel per step, and the step count stays on the device (the
# unfused kernel reads it on the host once per parameter)
FUSED_ADAM_DEVICES = ("cuda", "cpu")


class MegatronTrainer:
    """Trainer backend on megatron-core: actor (DDP + distributed optimizer), optional frozen
    reference, all parallelism from `layout` (the plan's `parallel`)."""

    def __init__(
        self,
        model: ModelConfig,
        algo: AlgoConfig,
        optim: OptimConfig,
        train: TrainConfig,
        layout: ParallelLayout,
        *,
        rollout_temperature: float = 1.0,
        rank: int = 0,
        world_size: int = 1,
        master_addr: str = "127.0.0.1",
        master_port: int = 29500,
        collective_timeout_s: float = 600.0,
        init_method: str | None = None,
        num_threads: int | None = None,
        reuse_logprobs_single_step: bool = True,
        load_reference: bool | None = None,
        prediction: TrainPrediction | None = None,
        seed: int = 1234,
        trains: bool = True,
    ) -> None:
        """`prediction`: the plan's, logged beside what each step measured (perf/*);
        `trains` false (mode=eval): the GPTModel alone, with no DDP gradient buffers and no
        optimizer, holds the weights to send them (a checkpoint loads its model part)."""
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        warm_vector_math()
        host_before = host_memory_now_gib()
        self.model_config, self.algo, self.optim, self.train = model, algo, optim, train
        self.layout, self.temperature = layout, rollout_temperature
        self.policy_loss_kind = get_estimator(algo.advantage_estimator).policy_loss
        self.reuse_logprobs_single_step = reuse_logprobs_single_step
        self.step = 0
        on_gpu = not needs_cpu_compat()
        mtp_factor = mtp_loss_factor(model, train)  # None unless MTP layers are trained
        self.settings = megatron_settings(
            model, layout, optim, on_gpu=on_gpu, mtp_loss_scaling_factor=mtp_factor
        )
        with cpu_compat():
            init_parallel(
                ProcessPlace(
                    rank, world_size, master_addr, master_port, collective_timeout_s, init_method
                ),
                self.settings.parallel,
                seed,
            )
            self.device = compute_device()
            self.meter = StepMeter(self.device, world_size, prediction, host_before)
            self.weights = ModelWeights.current(model, self.settings)
            module = self._load(build_gpt_model(self.settings), model.load)
            # before the config gets the DDP hooks below: building MoE experts deep-copies it,
            # and a bound method of the DDP wrapper (holding process groups) cannot be copied
            wants_ref = loads_reference(algo, load_reference)
            self.ref_model = self._frozen(model.ref_load) if wants_ref else None
            self.model: Any = module
            self.optimizer: Any = None
            if trains:
                self._build_optimizer(module, on_gpu)
        self.inv_freq, self.rope_scale = None, 1.0
        if self.settings.own_rope:
            gpt = self.settings.gpt
            inv_freq = inverse_frequencies(
                self.settings.transformer.kv_channels, gpt.rotary_percent, gpt.rotary_base
            )
            inv_freq, self.rope_scale = scaled_frequencies(
                inv_freq, self.model_config.rope_scaling, gpt.rotary_base
            )
            self.inv_freq = inv_freq.to(self.device)

    # ---- construction ------------------------------------------------------------------------

    def _build_optimizer(self, module: torch.nn.Module, on_gpu: bool) -> None:
        """DDP's gradient buffers and the distributed optimizer around `module`."""
        config = self.settings.transformer
        self.model = DistributedDataParallel(config, self.settings.ddp, module)
        config.finalize_model_grads_func = finalize_grads
        config.no_sync_func = self.model.no_sync
        # gloo groups exist only on CPU (init_parallel); megatron-core's default asks for
        # them and asserts they were created
        self.optimizer = get_megatron_optimizer(
            self._optimizer_config(on_gpu), [self.model], use_gloo_process_groups=not on_gpu
        )
        if config.fp16:  # the fp16 optimizer divides grads by its loss scale: scale the loss
            config.grad_scale_func = self.optimizer.scale_loss
        fuse_adam(self.optimizer, FUSED_ADAM_DEVICES)

    def _load(self, module: torch.nn.Module, path: str | None) -> torch.nn.Module:
        """Weights from `path`, a torch_dist checkpoint or an HF folder (model.load,
        model.ref_load); from model.hf_checkpoint when it is None."""
        if path and (Path(path) / "metadata.json").is_file():
            # MTP layers a checkpoint lacks (saved without MTP training) come from the HF one
            load_torch_dist(module, path, self.model_config.hf_checkpoint, self.weights)
            return module
        if path and not (Path(path) / "config.json").is_file():
            raise FileNotFoundError(
                f"{path} is neither a torch_dist checkpoint (metadata.json) nor an HF folder "
                "(config.json)"
            )
        ckpt = HFCheckpoint(path or self.model_config.hf_checkpoint)
        try:
            load_hf_weights(module, ckpt, self.weights)
        finally:
            ckpt.close()
        return module

    def _frozen(self, path: str | None) -> torch.nn.Module:
        """The reference model: frozen, and kept in host memory on a GPU machine (it visits
        the GPU only for its forward; the plan counts it in host memory)."""
        module = self._load(build_gpt_model(self.settings, with_mtp=False), path)
        for p in module.parameters():
            p.requires_grad_(False)
        return module.eval().to("cpu")

    @contextlib.contextmanager
    def _on_device(self, model: torch.nn.Module) -> Iterator[torch.nn.Module]:
        """`model` on this rank's GPU for the duration (a no-op for the actor and on CPU)."""
        if model is self.model or needs_cpu_compat():
            yield model
            return
        model.to(torch.device("cuda", torch.cuda.current_device()))
        try:
            yield model
        finally:
            model.to("cpu")
            torch.cuda.empty_cache()

    def _optimizer_config(self, on_gpu: bool) -> Any:
        config = self.settings.optimizer
        assert config is not None
        changes: dict[str, Any] = {}
        if self.optim.clip_grad == 0:
            changes["clip_grad"] = NO_CLIP
        if not on_gpu:  # host-memory Adam and TE's fused Adam need a GPU
            changes |= {
                "optimizer_cpu_offload": False,
                "overlap_cpu_optimizer_d2h_h2d": False,
                "use_precision_aware_optimizer": False,
            }
        return dataclasses.replace(config, **changes) if changes else config

    # ---- packing -------------------------------------------------------------------------------

    def _build(self, batch: Sequence[TrainSample], bins: list[list[int]]) -> list[MicroBatch]:
        return [self._with_rope(mb) for mb in self._packed(batch, bins)]

    def _with_rope(self, mb: MicroBatch) -> MicroBatch:
        """The micro-batch with its RoPE table, computed on the device from its positions (MLA,
        which applies its own: its cu_seqlens carry the positions, kernels.packed_mla_rope)."""
        if self.inv_freq is None:
            attach_positions([getattr(mb.packed, n) for n in CU_SEQLENS], mb.position_ids[0])
            return mb
        config = self.settings.transformer
        table = rope_table(
            mb.position_ids[0],
            self.inv_freq,
            config.rotary_interleaved,
            config.params_dtype,
            self.rope_scale,
        )
        return dataclasses.replace(mb, packed=with_rope(mb.packed, table))

    def _packed(self, batch: Sequence[TrainSample], bins: list[list[int]]) -> list[MicroBatch]:
        return [
            build_micro_batch(
                [batch[i] for i in mb],
                mb,
                cp_rank=ps.get_context_parallel_rank(),
                cp_size=ps.get_context_parallel_world_size(),
                tp_size=ps.get_tensor_model_parallel_world_size(),
                sequence_parallel=self.layout.sequence_parallel,
            ).to(self.device)
            for mb in bins
        ]

    def _response_values(self, mb: MicroBatch, values: Tensor) -> Tensor:
        """Per-local-token values -> the micro-batch's response tokens, sample by sample."""
        cp_group = ps.get_context_parallel_group()
        if ps.get_context_parallel_world_size() > 1:
            values = gather_along_sequence(values, cp_group)
        return values[mb.response_index]

    def _token_outputs(
        self, model: torch.nn.Module, mb: MicroBatch, output: Tensor, entropy: str
    ) -> tuple[Tensor, Tensor | None]:
        """Response-token logprobs (and entropy) from the model's output, its final hidden
        states: the log-prob kernel applies the output layer."""
        hidden = output_layer_input(output[0], self.layout.sequence_parallel)
        weight = _output_weight(_unwrapped(model))
        vocab = self.settings.gpt.true_vocab_size
        out = hidden_logprobs(hidden, weight, mb.targets, vocab, self.temperature, entropy)
        ent = None if out.entropy is None else self._response_values(mb, out.entropy)
        return self._response_values(mb, out.logp), ent

    # ---- logprobs without gradients ----------------------------------------------------------

    def compute_token_stats(
        self, batch: Sequence[TrainSample], which: Which = "actor", with_entropy: bool = True
    ) -> TokenStats:
        """Per-sample response-token logprobs (and entropy, actor only), no gradients.

        Collective; each rank gets the values of the batch it passed.
        """
        model = self.model if which == "actor" else self.ref_model
        if model is None:
            raise ValueError("no reference model is loaded: it is loaded only for KL terms")
        for index, sample in enumerate(batch):
            validate_sample(sample, index)
        mode = "detached" if with_entropy and which == "actor" else "none"
        lengths = [s.length for s in batch]
        bins = micro_batches(lengths, self.train, ps.get_context_parallel_world_size())
        bins = equalize([bins], lengths, self.layout.ep > 1)[0]

        def collect(mb: MicroBatch, output: Tensor) -> tuple[Tensor, dict[str, Any]]:
            logp, ent = self._token_outputs(model, mb, output, mode)
            return output.new_zeros(()), {"logp": logp, "entropy": ent}

        with cpu_compat(), torch.no_grad(), self._on_device(model):
            model.eval()
            mbs = self._build(batch, bins)
            outputs = run_micro_batches(model, mbs, collect, True)
            outputs = from_last_stage(outputs)
        logprobs: list[Tensor] = [torch.empty(0)] * len(batch)
        entropy: list[Tensor] = [torch.empty(0)] * len(batch)
        for mb, out in zip(mbs, outputs, strict=True):
            for i, value in zip(mb.samples, mb.split(out["logp"]), strict=True):
                logprobs[i] = value
            if out["entropy"] is not None:
                for i, value in zip(mb.samples, mb.split(out["entropy"]), strict=True):
                    entropy[i] = value
        return TokenStats(logprobs, entropy if mode != "none" else None)

    def compute_logprobs(
        self, batch: Sequence[TrainSample], which: Which = "actor"
    ) -> list[Tensor]:
        return self.compute_token_stats(batch, which, with_entropy=False).logprobs

    # ---- training ------------------------------------------------------------------------------

    def _dp_sum(self, tensor: Tensor) -> Tensor:
        if ps.get_data_parallel_world_size() > 1:
            all_reduce_sum(tensor, ps.get_data_parallel_group())
        return tensor

    def _prepare(
        self, batch: Sequence[TrainSample], mine: list[int], reuse: bool, with_reference: bool
    ) -> dict[int, SampleTensors]:
        """Old/ref logprobs and advantages of this rank's samples, before any update."""
        samples = [batch[i] for i in mine]
        old = None if reuse else _on_host(self.compute_logprobs(samples, "actor"))
        ref = _on_host(self.compute_logprobs(samples, "ref")) if with_reference else None
        tensors = sample_tensors(samples, old, ref, self.algo, self._dp_sum)  # on the host
        return {i: _sample_on(t, self.device) for i, t in zip(mine, tensors, strict=True)}

    def _train_loss(
        self,
        data: dict[int, SampleTensors],
        denominator: float,
        names: list[str],
        mb: MicroBatch,
        output: Tensor,
    ) -> tuple[Tensor, dict[str, Any]]:
        if not mb.samples:  # an evening-out micro-batch: no sample, no gradient
            zeros = torch.zeros(len(names), dtype=torch.float64, device=output.device)
            return output.sum() * 0.0, {"metrics": zeros}
        entropy_mode = "grad" if self.algo.entropy_coef > 0 else "detached"
        logp, entropy = self._token_outputs(self.model, mb, output, entropy_mode)
        assert entropy is not None
        inputs = loss_inputs(
            [data[i] for i in mb.samples], mb.segment_ids, logp, entropy, self.algo, denominator
        )
        result = compute_loss(inputs, self.algo, self.policy_loss_kind)
        metrics = torch.tensor(
            [result.metrics[n] for n in names], dtype=torch.float64, device=output.device
        )
        # every CP rank computes the whole loss from gathered values; their gradients add up
        extra = {"metrics": metrics, "maxima": result.maxima}
        return result.loss / ps.get_context_parallel_world_size(), extra

    def _optimizer_step(
        self,
        batch: Sequence[TrainSample],
        plan: StepPlan,
        data: dict[int, SampleTensors],
        with_reference: bool,
    ) -> dict[str, float]:
        names = metric_names(self.algo, with_reference, has_rollout_logprobs(batch))
        self.model.train()
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        mbs = with_mtp_targets(self._build(batch, plan.micro_batches), batch, data, self.settings)
        outputs = run_micro_batches(
            self.model,
            mbs,
            lambda mb, out: self._train_loss(data, plan.denominator, names, mb, out),
            False,
        )
        lr = lr_at_step(self.step, self.optim)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        # fp16 skips a step whose gradients overflowed and then has no norm
        _, grad_norm, _ = self.optimizer.step()
        self.step += 1
        sums = torch.zeros(len(names), dtype=torch.float64, device=self.device)
        if ps.get_context_parallel_rank() == 0 and ps.get_tensor_model_parallel_rank() == 0:
            for out in outputs:
                sums += out["metrics"]
        dist.all_reduce(sums)
        maxima: dict[str, float] = {}  # this rank's largest values (the driver takes the max)
        for out in outputs:
            for key, value in out.get("maxima", {}).items():
                maxima[key] = max(maxima.get(key, value), value)
        return {
            **dict(zip(names, sums.tolist(), strict=True)),
            **maxima,
            **mtp_step_metrics(mbs, self.settings),
            "grad_norm": float("nan") if grad_norm is None else float(grad_norm),
            "lr": lr,
        }

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
        with cpu_compat():
            plans = self._plans(batch)
            mine = sorted(i for plan in plans for micro in plan.micro_batches for i in micro)
            reuse = reuses_logprobs(plans, self.algo, self.reuse_logprobs_single_step)
            data = self._prepare(batch, mine, reuse, ref)
            prepared = time.perf_counter()
            steps = [self._optimizer_step(batch, plan, data, ref) for plan in plans]
        timing = RolloutTiming(start, prepared, time.perf_counter())
        lengths, forwards = [s.length for s in batch], forwards_run(reuse, ref)
        perf = self.meter.metrics(lengths, forwards, timing.end_s - timing.start_s)
        return {**rollout_metrics(steps, plans, batch, timing), **perf}

    def _plans(self, batch: Sequence[TrainSample]) -> list[StepPlan]:
        plans = plan_steps(
            batch,
            self.train,
            self.algo,
            ps.get_data_parallel_rank(),
            ps.get_data_parallel_world_size(),
            ps.get_context_parallel_world_size(),
        )
        lengths = [s.length for s in batch]
        even = equalize([p.micro_batches for p in plans], lengths, self.layout.ep > 1)
        return [dataclasses.replace(p, micro_batches=b) for p, b in zip(plans, even, strict=True)]

    # ---- weights and checkpoints ---------------------------------------------------------------

    def iter_hf_weights(self, bucket_bytes: int = 512 << 20) -> Iterator[list[tuple[str, Tensor]]]:
        """The policy in HF names, gathered over TP/EP/PP, in buckets of <= bucket_bytes.
        Collective: every rank must consume every bucket."""
        with cpu_compat():
            yield from iter_hf_weights(_unwrapped(self.model), self.weights, bucket_bytes)

    def export_hf(self, out_dir: str | Path) -> Path:
        """Rank 0 writes the policy as an HF folder; every rank returns once it is there."""
        out = Path(out_dir)
        with cpu_compat():
            buckets = iter_hf_weights(_unwrapped(self.model), self.weights)
            export_hf_folder(buckets, self.model_config, out, write=dist.get_rank() == 0)
            dist.barrier()
        return out

    def save_checkpoint(self, ckpt_dir: str | Path, with_optimizer: bool = True) -> Path:
        """Model, optimizer and step as a torch_dist checkpoint (see trainer_state). Collective."""
        with cpu_compat():
            return save_state(self.model, self.optimizer, self.step, Path(ckpt_dir), with_optimizer)

    def load_checkpoint(self, ckpt_dir: str | Path) -> None:
        """Inverse of save_checkpoint; without a saved optimizer, Adam starts over. Collective."""
        with cpu_compat():
            if self.optimizer is None:  # mode=eval: the weights alone
                self.step = load_weights(self.model, Path(ckpt_dir))
                return
            self.step = load_state(self.model, self.optimizer, Path(ckpt_dir))
            fuse_adam(self.optimizer, FUSED_ADAM_DEVICES)  # loading restores saved flags

    @property
    def model_dir(self) -> Path:
        """The HF folder the policy came from (config and tokenizer)."""
        return Path(self.model_config.hf_checkpoint)

    def offload(self) -> int:
        """Weights, gradients and optimizer state to host memory while the engines generate
        (colocated GPU runs); returns bytes freed on the GPU. A no-op on CPU."""
        if needs_cpu_compat() or self.optimizer is None:  # mode=eval: nothing is offloaded
            return 0
        return offload_to_host(self.model, self.optimizer)

    def onload(self) -> None:
        """Back from `offload` before training."""
        if not needs_cpu_compat() and self.optimizer is not None:
            onload_from_host(self.model, self.optimizer)

    def close(self) -> None:
        destroy_parallel()


def _unwrapped(model: torch.nn.Module) -> Any:
    """The GPTModel inside megatron-core's DDP wrapper (the reference model has none)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def _output_weight(gpt: Any) -> Tensor:
    """The output layer's weight as GPTModel applies it: the embedding's when they are tied
    (on the last pipeline stage, its copy there), else the output layer's own."""
    if gpt.share_embeddings_and_output_weights:
        return gpt.shared_embedding_or_output_weight()  # type: ignore[no-any-return]
    return gpt.output_layer.weight  # type: ignore[no-any-return]


def _on_host(tensors: list[Tensor]) -> list[Tensor]:
    return [t.cpu() for t in tensors]


def _sample_on(tensors: SampleTensors, device: torch.device) -> SampleTensors:
    """A sample's loss inputs on the device its logprobs come out on."""
    fields = {
        f.name: value
        if (value := getattr(tensors, f.name)) is None or value.device == device
        else value.to(device)
        for f in dataclasses.fields(tensors)
    }
    return SampleTensors(**fields)
