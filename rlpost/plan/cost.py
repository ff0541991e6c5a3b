"""Predicted time of one rollout-and-train iteration of a layout: what `layout=auto` ranks by.

The model is a sum of bounds, each from a published account of where the time goes; it ranks
layouts of one run against each other and is not a promise of wall-clock time.

Training (per rollout):
- compute: the plan's TrainWork passes (three forwards' worth for forward and backward, the
  old-policy and reference forwards it runs, one more for full recompute) at rlpost.plan.flops'
  FLOPs per forward over the longest samples, at the model-FLOPs utilisation this backend
  measured without recompute: `DENSE_MFU` for dense models, `MOE_MFU` for MoE. Full recompute's
  extra forward costs `RECOMPUTE_TIME` of a forward at that rate, as measured, not a whole one.
- the pipeline: 1F1B's bubble makes a stage idle (p - 1) / (m + p - 1) of the step for m
  micro-batches (Narayanan et al. 2021, section 2.2.1), and the slowest stage sets the pace
  (uneven splits exist to even out the embedding and output head).
- tensor parallelism with sequence parallelism: per layer, two all-gathers and two
  reduce-scatters of the layer's activations forward, as many backward and again in a
  recompute (Korthikanti et al. 2022, section 4.2.2); each moves (tp - 1) / tp of the tokens x
  hidden x 2 bytes through every rank's link.
- context parallelism (ring attention): every rank passes its K and V blocks cp - 1 times per
  layer forward, and K, V and their gradients backward.
- expert parallelism: a dispatch and a combine all-to-all per MoE layer and pass, each moving
  (ep - 1) / ep of tokens x top_k x hidden x 2 bytes.
- data parallelism: the distributed optimizer reduce-scatters fp32 gradients and all-gathers
  bf16 parameters once per optimizer step (Rajbhandari et al. 2020, "ZeRO", section 5).
- the optimizer: Adam reads and writes `ADAM_BYTES_PER_PARAM` per parameter it owns; CPU
  Adam does so in host memory and moves the gradients down and the weights up over PCIe each
  step (Ren et al. 2021, "ZeRO-Offload", section 4).
- the torch trainer (FSDP2, rlpost.plan.fsdp): every forward of a micro-batch all-gathers
  the parameters in the compute dtype (the backward gathers them again, unless
  `layout.train.fsdp.reshard_after_forward` is false; full recompute runs inside the
  backward's gather), every backward reduce-scatters float32 gradients, and with
  HSDP all-reduces the shard's gradients across the replicas; the no-grad forwards (old
  policy, reference) gather once. FSDP2 runs them a layer at a time on streams of their own,
  beside the compute of a neighbouring layer (the overlap of Zhao et al. 2023, "PyTorch FSDP",
  which FSDP2 keeps: the forward's next all-gather is issued ahead, the backward prefetches the
  next layer's and reduce-scatters the last one's): a pass exposes its first layer's gather
  (and a backward its last layer's reduce-scatter), and each layer's collectives only where
  they outlast its compute (`fsdp_exposed_s`). With FSDP2's CPU offload each gather first
  copies the float32 shard to the GPU and each reduce-scatter copies the gradients back over
  PCIe, counted exposed, and Adam runs on the host. Its MFU is `TORCH_MFU`.
Collectives within a node run at `hardware.intra_node_gbps` (PCIe without NVLink), across
nodes at `hardware.inter_node_gbps`, and, apart from FSDP2's, are not assumed to overlap
compute.

Rollout: decoding is bound by memory bandwidth (Pope et al. 2022, "Efficiently Scaling
Transformer Inference", section 2): each step reads the engine GPU's weight shard (for MoE only
the experts the batch routes to) and the KV cache of the sequences in flight, at
`DECODE_EFFICIENCY` of `hardware.memory_bandwidth_gbps`, or is bound by compute when the batch
is large; tensor-parallel engines add two all-reduces per layer and step, at a latency of
`ALLREDUCE_LATENCY_S`. An engine holds as many sequences as its KV cache fits (and its
max_running_requests allow), all the engines together as many as the rollout client sends at
once (recipe.rollout.max_concurrency, one bound for all of them, a group sent whole counted
whole: rlpost.plan.runtime.samples_in_flight), and a rollout takes as many waves of
max_response_len decode steps as its samples need. In mode=eval the
generation is the evaluation sets', each at its own lengths and samples, one set after another
(rlpost.plan.generation: a set's prompts are counted by its row slice, else assumed).

Weight sync: the bf16 (FP8: 1 byte) weights once per `update_weights_interval` rollouts, over
the node's links when colocated (CUDA IPC) or when the engines share the trainer's node, else
over the network. Colocation adds the trainer's offload: its GPU state to the host and back
over PCIe every rollout.

Per iteration: synchronous loops add rollout, training, sync and offload; the asynchronous
loops (decoupled) overlap rollout with training, so the slower of the two counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlpost.plan.batch import BatchPlan
from rlpost.plan.engine_memory import GIB, RolloutMemory
from rlpost.plan.flops import TRAIN_FORWARDS
from rlpost.plan.fsdp import GRAD_REDUCE_BYTES, MASTER_BYTES, FsdpTrainMemory, trained_params
from rlpost.plan.generation import Generation, planned_generations
from rlpost.plan.layout import EngineLayout, ParallelLayout, Sizes
from rlpost.plan.memory import TrainMemory, pipeline_stages
from rlpost.plan.params import ParamCount, params_per_stage
from rlpost.plan.runtime import samples_in_flight
from rlpost.plan.work import TrainWork
from rlpost.schema import RunConfig

DENSE_MFU = 0.35
"""Model-FLOPs utilisation of a training step without recompute, by rlpost.plan.flops'
definition against the profile's 989 TFLOP/s. Measured with benchmarks/megatron_train.py on one
H200 (megatron-core 0.16.1 without TransformerEngine, 32 x 4096 tokens, bf16; docs/
gpu-results.md). With the layer's elementwise work compiled and the log-prob kernel chunking
the vocabulary (2026-11-27, second run): qwen3-0.6b 0.339 without recompute and 0.303 with full
recompute, qwen3-1.7b 0.356 with full recompute, which with recompute's extra forward counted
at RECOMPUTE_TIME are 0.34, 0.34 and 0.40 at this constant's rate; 0.35 predicts the 0.6b
steps within 3% and the 1.7b 14% slow. MFU grows with the model (a layer's elementwise work
and the host's launches do not grow with its matmuls): qwen3-4b measured 0.273 with full
recompute before these kernels, 1.25x the 1.7b's 0.219 then. Megatron-LM with TransformerEngine
reports 0.44-0.52 on dense GPT models (Narayanan et al. 2021)."""
RECOMPUTE_TIME = 0.35
"""What full recompute's extra forward costs, in forwards at the step's rate (its FLOPs are one
forward). Measured on qwen3-0.6b, one H200: full over none 1.12x (2.793 against 2.499 s,
2026-11-27, second run) and 1.10x (5.08 against 4.62 s, first run), where a whole forward would
be 1.33x; 0.35 of a forward is 1.12x. The recomputed forward runs on the GPU while the host is
busy launching the backward's kernels, where a step without recompute leaves the GPU waiting.
The torch trainer's checkpointing, measured once before the same kernels, cost 1.26x."""
MOE_MFU = 0.20
"""Not measured on a GPU yet: the dense figure scaled by 2/3, the share the first measured
dense MFU had of the published one (routed experts run smaller GEMMs and wait on their
dispatch)."""
TORCH_MFU = DENSE_MFU
"""The torch trainer (transformers' layers under FSDP2) on GPUs: measured on one H200
(2026-11-27, second run, docs/gpu-results.md) at MFU 0.285 for qwen3-0.6b with full recompute,
0.94 of the megatron backend's 0.303 on the same shapes (1.12x and 1.03x its step time in the
first run, before the compiled kernels); kept equal to the megatron backend's."""
DECODE_EFFICIENCY = 0.6
"""Share of peak memory bandwidth a decode step reaches (kernel launch gaps, small GEMMs)."""
PREFILL_MFU = 0.4
FP32_SPEED = 67 / 989
"""Dense float32 over dense bf16 matmul throughput on an H100 SXM or H200 (NVIDIA's data sheets:
67 and 989 TFLOP/s). A GPU profile's peak_bf16_tflops times this is what model.params_dtype=fp32
trains and generates at: torch multiplies float32 without TF32 unless told otherwise, and the
trainers and engines compute in the model's dtype (`compute_tflops`)."""
ALLREDUCE_LATENCY_S = 10e-6
"""One small all-reduce within a node; across nodes `INTER_NODE_LATENCY_S`."""
INTER_NODE_LATENCY_S = 30e-6
ADAM_BYTES_PER_PARAM = 28
"""fp32 gradient, master weight and two moments read (16), master and moments written (12)."""
GB = 1e9


def timed_tflop(work: TrainWork) -> float:
    """The rollout's training TFLOP as the step's rate sees them: every pass's FLOPs, full
    recompute's forward at RECOMPUTE_TIME of its own."""
    if not work.passes_per_rollout:
        return work.train_tflop_per_rollout
    recompute_share = work.recompute_passes / work.passes_per_rollout
    return work.train_tflop_per_rollout * (1 - recompute_share * (1 - RECOMPUTE_TIME))


@dataclass(frozen=True)
class TrainTime:
    compute_s: float
    pipeline_s: float  # bubble and stage imbalance on top of compute
    tp_s: float
    cp_s: float
    ep_s: float
    dp_s: float
    optimizer_s: float

    @property
    def total_s(self) -> float:
        return (
            self.compute_s
            + self.pipeline_s
            + self.tp_s
            + self.cp_s
            + self.ep_s
            + self.dp_s
            + self.optimizer_s
        )


@dataclass(frozen=True)
class RolloutTime:
    concurrent_per_engine: int  # sequences an engine decodes at once (KV cache, requests)
    waves: int
    decode_step_s: float
    decode_s: float
    prefill_s: float

    @property
    def total_s(self) -> float:
        return self.decode_s + self.prefill_s


@dataclass(frozen=True)
class StepCost:
    """Seconds per rollout-and-train iteration, and the parts it is made of."""

    train: TrainTime
    rollout: RolloutTime
    sync_s: float
    offload_s: float
    overlapped: bool  # asynchronous loop: rollout and training run at the same time

    @property
    def total_s(self) -> float:
        train, rollout = self.train.total_s, self.rollout.total_s
        busy = max(train, rollout) if self.overlapped else train + rollout
        return busy + self.sync_s + self.offload_s


def _link_gbps(cfg: RunConfig, group: int, stride: int = 1) -> float:
    """A group of `group` ranks `stride` apart stays in a node when it spans at most one."""
    hw = cfg.hardware
    if group * stride > hw.gpus_per_node:
        return hw.inter_node_gbps
    return hw.intra_node_gbps if hw.nvlink_within_node else hw.pcie_gbps


def _ring_s(bytes_: float, group: int, gbps: float) -> float:
    """A ring collective over `group` ranks moves (group - 1) / group of the data per rank."""
    if group <= 1:
        return 0.0
    return bytes_ * (group - 1) / group / (gbps * GB)


def _stage_flops_share(cfg: RunConfig, par: ParallelLayout) -> tuple[float, int]:
    """(slowest stage's share of the model's per-token work x pp, layers on it): 1.0 for an
    even split. A stage's work is its parameters' (its MoE experts counted at top_k)."""
    model = cfg.model
    stages = params_per_stage(model, pipeline_stages(model, par))
    active = 1.0
    if model.moe is not None:
        active = model.moe.top_k / model.moe.num_experts
    work = [s.dense + s.experts * active for s in stages]
    slowest = max(range(len(work)), key=lambda i: work[i])
    return max(work) * len(work) / sum(work), stages[slowest].num_layers


def compute_tflops(cfg: RunConfig) -> float:
    """The dense peak one GPU computes the model at: the profile's bf16 peak, or for
    model.params_dtype=fp32 on GPUs `FP32_SPEED` of it (a CPU profile's peak is what it
    computes at: float32 always)."""
    hw = cfg.hardware
    fp32 = hw.kind == "gpu" and cfg.model.params_dtype == "fp32"
    return hw.peak_bf16_tflops * (FP32_SPEED if fp32 else 1.0)


def train_time(
    cfg: RunConfig,
    par: ParallelLayout,
    batch: BatchPlan,
    work: TrainWork,
    memory: TrainMemory,
    train_gpus: int,
) -> TrainTime:
    if not work.steps_per_rollout:  # mode=eval: the train ranks run no step
        return TrainTime(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    if isinstance(memory, FsdpTrainMemory):
        return fsdp_train_time(cfg, par, batch, work, memory, train_gpus)
    model, hw, recipe = cfg.model, cfg.hardware, cfg.recipe
    mfu = MOE_MFU if model.moe is not None else DENSE_MFU
    tokens = batch.samples_per_rollout * batch.longest_sample_tokens
    compute = timed_tflop(work) / (train_gpus * compute_tflops(cfg) * mfu)
    imbalance, stage_layers = _stage_flops_share(cfg, par)
    per_step_rank = batch.samples_per_step_per_dp_rank * batch.longest_sample_tokens
    micro = max(1, math.ceil(per_step_rank / max(1, memory.tokens_per_gpu * par.cp)))
    bubble = (par.pp - 1) / (micro + par.pp - 1)
    pipeline = compute * imbalance / (1 - bubble) - compute
    # tokens each rank of a TP group sees over the rollout, and how often a layer's
    # collectives run on them (forward 1, backward 2 in units of a forward's traffic)
    rank_tokens = tokens / (par.dp * par.cp)
    passes = work.passes_per_rollout - 1.0  # forward + backward (+ recompute) ~ 4 collectives
    h = model.hidden_size
    tp_bytes = 4 * rank_tokens * h * 2 * stage_layers * passes
    tp = _ring_s(tp_bytes, par.tp, _link_gbps(cfg, par.tp))
    kv_dim = 2 * model.num_query_groups * model.head_dim / par.tp  # K and V, per TP rank
    cp_bytes = (par.cp - 1) * rank_tokens * kv_dim * 2 * stage_layers * (1 + 2)
    cp = cp_bytes / (_link_gbps(cfg, par.cp, par.tp) * GB) if par.cp > 1 else 0.0
    ep = 0.0
    if model.moe is not None and par.ep > 1:
        moe_layers = stage_layers * (1 - model.moe.first_k_dense_layers / model.num_layers)
        ep_bytes = 2 * rank_tokens / par.tp * model.moe.top_k * h * 2 * moe_layers * passes
        ep = _ring_s(ep_bytes, par.ep, _link_gbps(cfg, par.ep * par.etp))
    grads = memory.params_per_gpu
    dp_group = par.dp * par.cp
    dp = work.steps_per_rollout * _ring_s(grads * (4 + 2), dp_group, _link_gbps(cfg, dp_group))
    owned = grads / max(1, par.optimizer_shards)
    if recipe.optim.cpu_offload:
        ranks = min(train_gpus, hw.gpus_per_node)
        host = owned * ADAM_BYTES_PER_PARAM / (hw.host_memory_bandwidth_gbps * GB / ranks)
        copies = owned * (4 + 2) / (hw.pcie_gbps * GB)
        optimizer = work.steps_per_rollout * (host + copies)
    else:
        optimizer = (
            work.steps_per_rollout * owned * ADAM_BYTES_PER_PARAM / (hw.memory_bandwidth_gbps * GB)
        )
    return TrainTime(compute, pipeline, tp, cp, ep, dp, optimizer)


def fsdp_train_time(
    cfg: RunConfig,
    par: ParallelLayout,
    batch: BatchPlan,
    work: TrainWork,
    memory: FsdpTrainMemory,
    train_gpus: int,
) -> TrainTime:
    """The torch trainer's rollout of training: compute, FSDP2's collectives per micro-batch
    (in `dp_s`) and the optimizer (with CPU offload, its PCIe copies too)."""
    model, hw = cfg.model, cfg.hardware
    mfu = TORCH_MFU * (MOE_MFU / DENSE_MFU if model.moe is not None else 1.0)
    compute = timed_tflop(work) / (train_gpus * compute_tflops(cfg) * mfu)
    per_step_rank = batch.samples_per_step_per_dp_rank * batch.longest_sample_tokens
    micro = work.steps_per_rollout * max(1, math.ceil(per_step_rank / memory.tokens_per_gpu))
    no_grad = work.passes_per_rollout - TRAIN_FORWARDS - work.recompute_passes
    # forward and backward (once when the layers stay gathered), and each no-grad forward
    gathers = micro * ((2 if memory.reshard_after_forward else 1) + no_grad)
    params = trained_params(model)
    element = 4 if model.params_dtype == "fp32" else 2
    shards, replicas = memory.shards, max(1, par.dp // memory.shards)
    gather = _ring_s(params * element, shards, _link_gbps(cfg, shards))
    reduce = _ring_s(params * GRAD_REDUCE_BYTES, shards, _link_gbps(cfg, shards))
    shard_grads = memory.params_per_gpu * GRAD_REDUCE_BYTES
    across = 2 * _ring_s(shard_grads, replicas, _link_gbps(cfg, replicas, shards))
    # one micro-batch's forward of the whole model, as timed (compute is the rollout's passes)
    timed_passes = work.passes_per_rollout - work.recompute_passes * (1 - RECOMPUTE_TIME)
    forward = compute / max(timed_passes, 1e-9) / micro
    backward = forward * (TRAIN_FORWARDS - 1 + work.recompute_passes * RECOMPUTE_TIME)
    layers = model.num_layers
    regather = gather if memory.reshard_after_forward else 0.0
    forward_wait = fsdp_exposed_s(gather, 0.0, forward, layers)  # a training or no-grad one
    backward_wait = fsdp_exposed_s(regather, reduce + across, backward, layers)
    collectives = micro * ((1 + no_grad) * forward_wait + backward_wait)
    owned = memory.params_per_gpu
    if memory.cpu_offload:
        ranks = min(train_gpus, hw.gpus_per_node)
        host = owned * ADAM_BYTES_PER_PARAM / (hw.host_memory_bandwidth_gbps * GB / ranks)
        copies = (gathers * owned * MASTER_BYTES + micro * shard_grads) / (hw.pcie_gbps * GB)
        optimizer = work.steps_per_rollout * host + copies
    else:
        optimizer = (
            work.steps_per_rollout * owned * ADAM_BYTES_PER_PARAM / (hw.memory_bandwidth_gbps * GB)
        )
    return TrainTime(compute, 0.0, 0.0, 0.0, 0.0, collectives, optimizer)


def fsdp_exposed_s(gather_s: float, reduce_s: float, compute_s: float, layers: int) -> float:
    """The time a pass of FSDP2 over `layers` decoder layers waits on its collectives: all the
    layers' all-gathers take `gather_s` and reduce-scatters `reduce_s` (0 forward), the
    layers' compute `compute_s`. Each layer's collectives run beside a neighbour's compute, so
    the pass waits for the first layer's gather, the last layer's reduce-scatter, and each
    layer's collectives wherever they outlast its compute (the link is shared)."""
    n = max(layers, 1)
    gather, reduce, compute = gather_s / n, reduce_s / n, compute_s / n
    return gather + reduce + n * max(0.0, gather + reduce - compute)


def rollout_time(
    cfg: RunConfig,
    engine: EngineLayout,
    memory: RolloutMemory,
    batch: BatchPlan,
    params: ParamCount,
) -> RolloutTime:
    """The engines' generation in one iteration: training's rollout, or in mode=eval every
    evaluation set in turn at its own lengths and samples (rlpost.plan.generation)."""
    parts = [
        generation_time(cfg, engine, memory, work, params)
        for work in planned_generations(cfg, batch)
    ]
    if len(parts) == 1:
        return parts[0]
    # one after another: the times add; the busiest round's concurrency and step are shown
    return RolloutTime(
        max(p.concurrent_per_engine for p in parts),
        sum(p.waves for p in parts),
        max(p.decode_step_s for p in parts),
        sum(p.decode_s for p in parts),
        sum(p.prefill_s for p in parts),
    )


def generation_time(
    cfg: RunConfig,
    engine: EngineLayout,
    memory: RolloutMemory,
    work: Generation,
    params: ParamCount,
) -> RolloutTime:
    """One round of generation: `work`'s samples spread over the engines, each engine decoding
    as many at once as its KV cache holds at `work`'s longest sample and its
    max_running_requests allow, and all of them together no more than the rollout client
    keeps in flight (rlpost.plan.runtime.samples_in_flight)."""
    model, hw = cfg.model, cfg.hardware
    engines = max(1, engine.num_engines)
    per_engine = math.ceil(work.samples / engines)
    longest = work.longest_tokens
    capacity = max(1, memory.kv_cache_tokens_per_engine // max(1, longest))
    limit = engine.option("max_running_requests") or per_engine
    held = min(per_engine, capacity, int(limit))  # what one engine holds, by itself
    sent = samples_in_flight(cfg, engines, work.samples_per_prompt)
    in_flight = max(1, min(work.samples, engines * held, sent))
    concurrent = math.ceil(in_flight / engines)  # the busiest engine's
    waves = math.ceil(work.samples / in_flight)
    per_group = concurrent / engine.dp_size  # sequences per attention group
    expert_share = 1.0
    if model.moe is not None:
        routed = per_group * model.moe.top_k / model.moe.num_experts
        expert_share = min(1.0, routed)
    weights = memory.weights_gib * GIB
    if model.moe is not None:
        expert_bytes = weights * params.experts / max(1, params.total)
        weights = weights - expert_bytes + expert_bytes * expert_share
    kv = per_group * longest / 2 * memory.kv_bytes_per_token_per_gpu
    bandwidth = hw.memory_bandwidth_gbps * GB * DECODE_EFFICIENCY
    read = (weights + kv) / bandwidth
    flops = 2 * params.active * concurrent / engine.gpus_per_engine
    compute = flops / (compute_tflops(cfg) * 1e12 * PREFILL_MFU)
    reduce = 0.0
    if engine.gpus_per_engine > 1:
        # two all-reduces per layer of the step's hidden states (an all-reduce moves
        # 2 (n - 1) / n of them), each paying a launch latency
        spans = engine.gpus_per_engine > hw.gpus_per_node
        per_call = INTER_NODE_LATENCY_S if spans else ALLREDUCE_LATENCY_S
        hidden = concurrent * model.hidden_size * 2
        moved = 2 * _ring_s(hidden, engine.gpus_per_engine, _link_gbps(cfg, engine.gpus_per_engine))
        reduce = 2 * model.num_layers * (per_call + moved)
    step = max(read, compute) + reduce
    response, prompt = work.response_tokens, work.prompt_tokens
    prefill_flops = 2 * params.active * per_engine * prompt
    prefill = prefill_flops / (engine.gpus_per_engine * compute_tflops(cfg) * 1e12 * PREFILL_MFU)
    return RolloutTime(concurrent, waves, step, waves * response * step, prefill)


def sync_time(cfg: RunConfig, sizes: Sizes, engine: EngineLayout, params: ParamCount) -> float:
    """One weight update, averaged over the rollouts between updates."""
    hw = cfg.hardware
    per_param = 1 if engine.fp8 is not None else 2
    bytes_ = params.total * per_param
    local = sizes.colocate or sizes.total_gpus <= hw.gpus_per_node
    gbps = (hw.intra_node_gbps if hw.nvlink_within_node else hw.pcie_gbps) if local else None
    seconds = bytes_ / ((gbps or hw.inter_node_gbps) * GB)
    return seconds / cfg.recipe.loop.update_weights_interval


def offload_time(cfg: RunConfig, sizes: Sizes, memory: TrainMemory) -> float:
    """Colocated on GPUs: the trainer's weights, gradients and optimizer state leave the GPU
    for the rollout and come back for training."""
    if not sizes.colocate or cfg.hardware.kind != "gpu":
        return 0.0
    state = (memory.weights_gib + memory.grads_gib + memory.optimizer_gib) * GIB
    if isinstance(memory, FsdpTrainMemory):  # the reference model's shard goes with them
        state += memory.reference_gib * GIB
    return 2 * state / (cfg.hardware.pcie_gbps * GB)
