"""Per-GPU memory estimates for training and rollout, and the verdict: fits or by how much not.

Training state per parameter (mixed precision with Adam; Rajbhandari et al. 2020, "ZeRO",
section 3.1, with Megatron's fp32 main gradients): bf16 weights 2 bytes + fp32 gradients
4 bytes + fp32 master weights, first and second moments 12 bytes = 18 bytes. Megatron's
distributed optimizer shards the 12 optimizer bytes over the data-parallel group (ZeRO stage
1; with context parallelism the group is DP x CP), so 6 + 12/DP. Expert weights shard their
optimizer state over the expert-data-parallel group instead (world / (EP x ETP x PP)). With
CPU offload (Megatron's HybridDeviceOptimizer) the 12 bytes and an fp32 copy of the gradients
live on the host, and the GPU keeps 6 bytes per parameter. fp32 models need no master copy:
4 + 4 + 8 = 16 bytes.

Activations are counted tensor by tensor from what this backend keeps for backward (megatron-core's
local layer spec with rlpost's kernels; tests/unit/plan/test_activation_memory.py measures
them): per token and layer, the two norms' inputs and outputs (4h, plus GLM-4's post norms),
the attention block (`_attention_elements`: QKV output and query copy with QK-norm, the padded
Q, K, V and output SDPA keeps, the projection's input; its width is heads x head_dim, not the
hidden size), the MLP (SwiGLU's input and fc2's input, 3f; MoE layers per routed copy), all in
the compute dtype, and SDPA's float32 log-sum-exp. Tensor parallelism splits the attention and
MLP terms, sequence parallelism the norms' too. Selective recompute (core attention,
`SELECTIVE_RECOMPUTE_MODULES`) keeps the normed Q and K instead of SDPA's tensors; full
recompute keeps each layer's input and rebuilds one group of layers at a time. Pipeline stage
i of p holds p - i micro-batches in flight under 1F1B (Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models", section 4.2.3). The output side is the
log-prob kernel's: the hidden states, three float32 chunks of logits, the output weight's
gradient and the hidden states' float32 gradient, never the [tokens x vocab] logits. The
padded attention pads each group of samples of similar lengths to its longest, to at most
PADDED_ROWS_LIMIT times the group's tokens (rlpost.algo.packing.padded_groups), so what it
keeps is counted at that many rows per token.

On GPUs the megatron trainer's attention runs torch's varlen flash kernel instead of padded
SDPA wherever it applies (`varlen_attention`, rlpost.backends.megatron.kernels.varlen_applies),
which keeps different tensors: the roped Q and K, V as a view of the QKV output (which stays
whole), and its output, which is also the projection's input. That is g more elements per
token than the padded path without QK-norm, a + g fewer with it (a, g: query and key/value
widths); selective recompute keeps the same checkpoint inputs either way. No padding either.
The trainer still takes the padded path for a micro-batch on which it measured faster
(kernels.padded_pays), so there the estimate counts the larger of the two terms.

A `generic` model (an HF causal LM outside the families megatron-core expresses, trained by the
torch trainer through transformers) is counted from its config.json's facts the same way:
parameters exactly for a llama-shaped decoder (norms, GQA attention, gated or plain MLP, tied or
untied head, MoE experts when stated), activations with the terms above as if its layers were
megatron-core's. What it cannot count: the modelling code's own tensors (transformers keeps
more copies than megatron's fused layers, a fused QKV or gate-up projection keeps its output
whole, eager attention keeps [heads x tokens x tokens] scores), weights the config does not
state (extra norms, biases a class adds), and logits a model transforms before the log-probs
(softcapping or scaling sends the forward through the model's own [tokens x vocab] logits).
`GENERIC_MEMORY_NOTE` says so in the plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from rlpost.plan.engine_memory import (
    CUDA_CONTEXT_GIB,
    GIB,
    RolloutMemory,
    longest_sample_tokens,
)
from rlpost.plan.layout import PADDED_ROWS_LIMIT, ParallelLayout, Sizes
from rlpost.plan.params import StageParams, is_moe_layer, params_per_stage, stage_layers
from rlpost.schema import HardwareConfig, ModelConfig, RecipeConfig


def gib_text(gib: float) -> str:
    """An amount of memory as the plan prints it: GiB to 2 places, and an amount too small to
    show that way in MiB or KiB (never "0.00 GiB" for a shortfall)."""
    if gib == 0 or abs(gib) >= 0.01:
        return f"{gib:.2f} GiB"
    if abs(gib) * 1024 >= 0.01:
        return f"{gib * 1024:.2f} MiB"
    return f"{gib * 1024 * 1024:.1f} KiB"


TRAIN_WORKSPACE_GIB = 2.0
"""NCCL buffers, cuBLAS workspaces and allocator fragmentation beyond the CUDA context."""
ENGINE_RESIDUAL_GIB = 1.0
"""Colocated: an engine process's CUDA context, left on the GPU after it releases memory."""
HOST_PER_PROCESS_GIB = 2.0
"""Host memory of one train rank's process (Python, CUDA host allocations, pinned buffers)."""
LOGPROB_CHUNK_BYTES = 256 << 20
"""float32 logits of one chunk of tokens in the trainers' log-prob kernel: the logits are
never whole in memory (rlpost.backends.megatron.logits)."""


GENERIC_MEMORY_NOTE = (
    "model family generic ({architecture}): parameters are counted from config.json's facts "
    "as a llama-shaped decoder (weights its class adds beyond them are not counted), and "
    "activations with megatron-core's per-tensor terms; transformers' own layers keep more "
    "(unfused projections' outputs, eager attention's scores, a softcapped model's whole "
    "logits), so the activation figure can fall short of what the run holds"
)


def weight_bytes(model: ModelConfig) -> int:
    return 4 if model.params_dtype == "fp32" else 2


def optimizer_bytes(model: ModelConfig) -> int:
    """fp32 master copy (absent for fp32 weights) and two Adam moments."""
    return 8 if model.params_dtype == "fp32" else 12


def train_tokens_per_gpu(recipe: RecipeConfig, cp: int) -> int:
    """Tokens one GPU holds in a micro-batch: packing fills max_tokens_per_gpu (a CP group
    shares max_tokens_per_gpu x cp), but a longer sample gets a micro-batch of its own."""
    longest_per_gpu = math.ceil(longest_sample_tokens(recipe) / cp)
    train = recipe.train
    if train.use_dynamic_batch_size and train.max_tokens_per_gpu:
        return max(train.max_tokens_per_gpu, longest_per_gpu)
    return train.micro_batch_size * longest_per_gpu


def varlen_attention(model: ModelConfig, hardware: HardwareConfig, par: ParallelLayout) -> bool:
    """Whether the megatron trainer's attention runs torch's varlen flash kernel, as far as the
    config tells (the rule itself: rlpost.backends.megatron.kernels.varlen_applies): on GPUs, in
    bf16 or fp16, without context parallelism, with one head size for query, key and value (not
    multi-latent attention) that is a multiple of 8 and at most 256. Not known here: the GPU's
    compute capability (8.0 or later; at most 192 for a backward on sm86/sm89) and whether the
    installed torch has the kernel; attention dropout is always off in this backend."""
    return (
        hardware.kind == "gpu"
        and model.params_dtype in ("bf16", "fp16")
        and par.cp == 1
        and model.mla is None
        and model.head_dim % 8 == 0
        and model.head_dim <= 256
    )


def _attention_elements(
    model: ModelConfig, recompute: str, varlen: bool = False, padded_rows: float = 1.0
) -> float:
    """Elements per token the attention block keeps inside TP (megatron-core's local spec with
    rlpost's PackedAttention): the fused QKV output (its key view stays with the K norm), the
    query copy its reshape makes (with QK-norm), the padded per-sample Q, K, V and the output
    SDPA keeps (`padded_rows` rows of them per token), and the output projection's input.
    Selective recompute (core attention) keeps the normed Q and K instead of what SDPA keeps.
    The varlen kernel (`varlen`) keeps the roped Q and K, the QKV output whole (V is a view of
    it) and its output, which the projection keeps as its input too."""
    if model.mla is not None:  # queries and latents through low-rank projections
        mla = model.mla
        heads = model.num_attention_heads
        a = heads * (mla.qk_head_dim + mla.qk_pos_emb_head_dim)
        g = heads * mla.v_head_dim
        latents = (mla.q_lora_rank or 0) + mla.kv_lora_rank + mla.qk_pos_emb_head_dim
        kept = 2 * latents + 2 * a + g
        return kept + (a + g if recompute == "selective" else padded_rows * (2 * a + 2 * g))
    a = model.num_attention_heads * model.head_dim
    g = model.num_query_groups * model.head_dim
    qkv = (a + 2 * g) + a if model.qk_layernorm else 0.0  # fused output, query copy
    if varlen and recompute != "selective":
        fused = a + 2 * g  # kept through V's view, with QK-norm already counted in qkv
        return qkv + (0.0 if model.qk_layernorm else fused) + (a + g) + a
    if recompute == "selective":  # the checkpoint's inputs: Q and K (V is a view of QKV);
        # without QK-norm, the query copy and the QKV output the key and value view
        core: float = a + g if model.qk_layernorm else 2 * a + 2 * g
    else:
        core = padded_rows * (2 * a + 2 * g)
    return qkv + core + a


def _mlp_elements(model: ModelConfig, index: int) -> float:
    """Elements per token the MLP keeps inside TP: SwiGLU's input (2 f) and fc2's input (f);
    for an MoE layer, per routed copy of the token its dispatched input (h), SwiGLU's input,
    the activation before and after the routing probability (f each), plus shared experts."""
    moe = model.moe
    if moe is None or not is_moe_layer(model, index):
        return 3.0 * model.ffn_hidden_size
    shared = moe.shared_expert_ffn_hidden_size or moe.num_shared_experts * (
        moe.expert_ffn_hidden_size
    )
    routed = moe.top_k * (model.hidden_size + 4 * moe.expert_ffn_hidden_size)
    return routed + 3.0 * shared


def _routing_bytes(model: ModelConfig, index: int) -> float:
    """Bytes per token of an MoE layer's routing: float32 scores and probabilities, routing
    maps and int64 indices."""
    moe = model.moe
    if moe is None or not is_moe_layer(model, index):
        return 0.0
    return 10.0 * moe.num_experts + 24.0 * moe.top_k + 16.0


def _replicated_elements(model: ModelConfig) -> float:
    """Elements per token outside TP (split by TP only under sequence parallelism): the two
    norms' inputs and outputs, and GLM-4's post norms' inputs."""
    post = int(model.post_self_attn_layernorm) + int(model.post_mlp_layernorm)
    return (4.0 + post) * model.hidden_size


def layer_activation_bytes(
    model: ModelConfig,
    index: int,
    tokens: int,
    par: ParallelLayout,
    recompute: str,
    varlen: bool = False,
    padded_rows: float = PADDED_ROWS_LIMIT,
) -> float:
    """Bytes decoder layer `index` keeps for backward over `tokens` tokens on one GPU, under
    `recompute` none or selective (full keeps its input: `layer_input_bytes`), with padded
    SDPA (`padded_rows` rows per token: at most PADDED_ROWS_LIMIT, 1.0 for samples of one
    length) or (`varlen`) the varlen flash kernel. Every tensor is in the compute dtype except
    the attention's float32 log-sum-exp and the routing's."""
    element = weight_bytes(model)
    rows = 1.0 if varlen else padded_rows
    inner = _attention_elements(model, recompute, varlen, rows) + _mlp_elements(model, index)
    replicated = _replicated_elements(model)
    lse = 4.0 * rows * model.num_attention_heads / par.tp if recompute != "selective" else 0.0
    if par.sequence_parallel:
        per_token = element * (replicated + inner) / par.tp
    else:
        per_token = element * (replicated + inner / par.tp)
    return tokens * (per_token + lse + _routing_bytes(model, index))


def layer_input_bytes(model: ModelConfig, tokens: int, par: ParallelLayout) -> float:
    """A layer's input, what full recompute keeps of each checkpointed group."""
    split = par.tp if par.sequence_parallel else 1
    return tokens * model.hidden_size * weight_bytes(model) / split


@lru_cache(maxsize=1024)
def stage_activation_bytes(
    model: ModelConfig,
    layers: tuple[int, ...],
    index: int,
    tokens: int,
    par: ParallelLayout,
    varlen: bool = False,
) -> float:
    """The stage's layers' activations for its micro-batches in flight (1F1B holds pp - i on
    stage i); under full recompute their inputs plus one recomputed group during backward.
    Where the varlen kernel applies (`varlen`) the trainer may still take the padded path for a
    micro-batch (rlpost.backends.megatron.kernels.padded_pays, by a measurement at run time),
    so each layer counts the larger of the two paths' terms."""
    in_flight = par.pp - index
    recompute = par.recompute if par.recompute in ("none", "selective") else "full"

    def layer(i: int, recompute: str) -> float:
        padded = layer_activation_bytes(model, i, tokens, par, recompute)
        if not varlen:
            return padded
        return max(padded, layer_activation_bytes(model, i, tokens, par, recompute, True))

    if recompute != "full":
        return in_flight * sum(layer(i, recompute) for i in layers)
    group = par.recompute_num_layers
    kept = math.ceil(len(layers) / group) * layer_input_bytes(model, tokens, par)
    widest = max(layer(i, "none") for i in layers)
    return in_flight * kept + group * widest


def logprob_kernel_bytes(model: ModelConfig, tokens: int, par: ParallelLayout) -> float:
    """The last stage's output side: the final norm's input and the log-prob kernel's saved
    hidden states (compute dtype), three float32 chunks of logits in flight, the output
    weight's gradient (compute dtype, each row written once) and the float32 accumulator of
    the hidden states' gradient (rlpost.backends.logprobs)."""
    hidden = 2 * tokens * model.hidden_size * weight_bytes(model)
    weight_grad = weight_bytes(model) * model.vocab_size / par.tp * model.hidden_size
    accumulator = 4 * tokens * model.hidden_size
    chunk = min(LOGPROB_CHUNK_BYTES, 4 * tokens * model.vocab_size / par.tp)  # at most all
    return hidden + 3 * chunk + weight_grad + accumulator


@dataclass(frozen=True)
class TrainMemory:
    """The most loaded pipeline stage's GPU during a training step."""

    stage: int
    params_per_gpu: float
    tokens_per_gpu: int
    weights_gib: float
    grads_gib: float
    optimizer_gib: float
    activations_gib: float
    logits_gib: float
    overhead_gib: float
    total_gib: float
    host_optimizer_gib: float
    # megatron's grouped experts (model.moe.grouped_gemm): one MoE layer's local fc1 weights
    # stacked for a grouped GEMM, and in its backward their stacked gradient beside them
    grouped_experts_gib: float
    # mode=eval's train ranks (rlpost.plan.fsdp.estimate_sender): the weights gathered into
    # one bucket for the engines and its flattened copy; 0 in training, where the bucket
    # takes the room the step's activations left (MemoryPlan.weight_sync_gib)
    weight_bucket_gib: float

    def host_reference_gib(self, model: ModelConfig) -> float:
        """The reference model's weights kept on the host between uses, per rank."""
        return self.params_per_gpu * weight_bytes(model) / GIB

    def terms(self) -> str:
        """Every term of total_gib in GiB ('weights + grads 70.3, optimizer 119.2, ...'),
        those that are zero left out but the first three."""
        parts = [
            ("weights + grads", self.weights_gib + self.grads_gib),
            ("optimizer", self.optimizer_gib),
            ("activations + logits", self.activations_gib + self.logits_gib),
            ("grouped experts", self.grouped_experts_gib),
            ("weight bucket", self.weight_bucket_gib),
            ("CUDA context and workspaces", self.overhead_gib),
        ]
        return ", ".join(f"{name} {gib:.1f}" for i, (name, gib) in enumerate(parts) if i < 3 or gib)


def _stage_memory(
    model: ModelConfig,
    recipe: RecipeConfig,
    hardware: HardwareConfig,
    par: ParallelLayout,
    stage: StageParams,
    index: int,
    colocate: bool,
) -> TrainMemory:
    dense = stage.dense / par.tp
    experts = stage.experts / (par.ep * par.etp)
    params = dense + experts
    opt = optimizer_bytes(model)
    optimizer = dense * opt / par.optimizer_shards + experts * opt / par.expert_optimizer_shards
    offload = recipe.optim.cpu_offload
    tokens = train_tokens_per_gpu(recipe, par.cp)
    layers = tuple(range(stage.first_layer, stage.first_layer + stage.num_layers))
    if index == par.pp - 1:  # MTP layers sit on the last stage
        layers += (model.num_layers,) * model.mtp_num_layers
    varlen = varlen_attention(model, hardware, par)
    activations = stage_activation_bytes(model, layers, index, tokens, par, varlen)
    logits = logprob_kernel_bytes(model, tokens, par) if index == par.pp - 1 else 0.0
    overhead = 0.0
    if hardware.kind == "gpu":
        overhead = CUDA_CONTEXT_GIB + TRAIN_WORKSPACE_GIB
        overhead += ENGINE_RESIDUAL_GIB if colocate else 0.0
    parts = {
        "weights": params * weight_bytes(model) / GIB,
        "grads": params * 4 / GIB,
        "optimizer": 0.0 if offload else optimizer / GIB,
        "activations": activations / GIB,
        "logits": logits / GIB,
        "grouped": grouped_experts_bytes(model, par, layers) / GIB,
    }
    # the host keeps the offloaded state plus an fp32 gradient copy to step on
    host_grads = dense * 4 / par.optimizer_shards + experts * 4 / par.expert_optimizer_shards
    return TrainMemory(
        stage=index,
        params_per_gpu=params,
        tokens_per_gpu=tokens,
        weights_gib=parts["weights"],
        grads_gib=parts["grads"],
        optimizer_gib=parts["optimizer"],
        activations_gib=parts["activations"],
        logits_gib=parts["logits"],
        grouped_experts_gib=parts["grouped"],
        weight_bucket_gib=0.0,
        overhead_gib=overhead,
        total_gib=sum(parts.values()) + overhead,
        host_optimizer_gib=(optimizer + host_grads) / GIB if offload else 0.0,
    )


def grouped_experts_bytes(
    model: ModelConfig, par: ParallelLayout, layers: tuple[int, ...]
) -> float:
    """The megatron trainer's grouped experts (rlpost.backends.megatron.layers.GroupedExperts)
    stack an MoE layer's local expert weights for each grouped GEMM and drop them after it;
    the largest moment is fc1's backward, its stacked weights and its stacked weight gradient
    together. Nothing on a stage without MoE layers, or with grouped_gemm off."""
    moe = model.moe
    if moe is None or not moe.grouped_gemm or not any(is_moe_layer(model, i) for i in layers):
        return 0.0
    fc1 = moe.num_experts // par.ep * 2 * moe.expert_ffn_hidden_size // par.etp
    return 2.0 * fc1 * model.hidden_size * weight_bytes(model)


def pipeline_stages(model: ModelConfig, par: ParallelLayout) -> tuple[int, ...]:
    """Layers per stage; an uneven split the checks reject is spread as evenly as possible."""
    split = stage_layers(
        model.num_layers,
        par.pp,
        par.num_layers_in_first_pipeline_stage,
        par.num_layers_in_last_pipeline_stage,
    )
    if split is not None:
        return split
    base, extra = divmod(model.num_layers, par.pp)
    return tuple(base + (1 if i < extra else 0) for i in range(par.pp))


def estimate_train(
    model: ModelConfig,
    recipe: RecipeConfig,
    hardware: HardwareConfig,
    par: ParallelLayout,
    colocate: bool,
) -> TrainMemory:
    """Per-GPU training memory on the stage that needs the most."""
    stages = params_per_stage(model, pipeline_stages(model, par))
    estimates = [
        _stage_memory(model, recipe, hardware, par, stage, i, colocate)
        for i, stage in enumerate(stages)
    ]
    return max(estimates, key=lambda m: m.total_gib)


@dataclass(frozen=True)
class HostMemory:
    """One node's host memory: offloaded optimizer state and reference weights per rank."""

    ranks_per_node: int
    optimizer_gib: float
    reference_weights_gib: float
    processes_gib: float
    total_gib: float
    host_gib: float


def estimate_host(
    model: ModelConfig,
    recipe: RecipeConfig,
    hardware: HardwareConfig,
    train: TrainMemory,
    sizes: Sizes,
    trains: bool = True,
) -> HostMemory:
    """Ranks on the fullest node x (offloaded optimizer + reference weights kept on the host
    between uses when the reference runs at all, 2 bytes/param) + per-process overhead.
    `trains` false (mode=eval's train ranks): no optimizer is built and no reference loaded,
    whatever the layout's training side (shown unchecked where no train rank starts) holds."""
    ranks = min(sizes.train_gpus, hardware.gpus_per_node)
    optimizer = ranks * train.host_optimizer_gib if trains else 0.0
    reference = 0.0
    if trains and recipe.algo.reference_interval > 0:
        reference = ranks * train.host_reference_gib(model)
    processes = ranks * HOST_PER_PROCESS_GIB
    return HostMemory(
        ranks_per_node=ranks,
        optimizer_gib=optimizer,
        reference_weights_gib=reference,
        processes_gib=processes,
        total_gib=optimizer + reference + processes,
        host_gib=hardware.host_memory_gib,
    )


def fp8_update_buffer_bytes(model: ModelConfig, bucket_bytes: int) -> float:
    """Quantising an update for FP8 engines on the trainer (rlpost.backends.fp8.quantize):
    the bucket's FP8 copy (half of the bf16 bucket; scales are 1/4096 of that at 128 x 128),
    and, while the largest linear weight is quantised, its float32 working copy and the
    scaled float32 result (8 bytes an element). Embeddings and the output head are not
    quantised."""
    largest = max(
        model.ffn_hidden_size * model.hidden_size,
        model.num_attention_heads * model.head_dim * model.hidden_size,
        model.moe.expert_ffn_hidden_size * model.hidden_size if model.moe else 0,
    )
    return bucket_bytes / 2 + 8 * largest


@dataclass(frozen=True)
class MemoryPlan:
    """Both peaks against the GPU, the host against its memory, and the verdicts."""

    gpu_gib: float
    params_total: int
    params_active: int
    train: TrainMemory
    rollout: RolloutMemory
    host: HostMemory
    # FP8 engines: what quantising an update takes on a trainer GPU during weight sync
    # (fp8_update_buffer_bytes), after the step's activations and logits are freed
    fp8_update_buffer_gib: float = 0.0

    @property
    def weight_sync_gib(self) -> float:
        """A trainer GPU while it sends weights: the step's state without its activations,
        plus the FP8 quantisation buffer."""
        t = self.train
        transient = t.activations_gib + t.logits_gib + t.grouped_experts_gib
        return t.total_gib - transient + self.fp8_update_buffer_gib

    @property
    def train_margin_gib(self) -> float:
        return self.gpu_gib - max(self.train.total_gib, self.weight_sync_gib)

    @property
    def rollout_margin_gib(self) -> float:
        """Headroom at the rollout peak; a KV cache that cannot hold one sample counts as the
        memory still missing for it (with the weights' excess over the pool, if any)."""
        margin = self.gpu_gib - self.rollout.total_gib
        r = self.rollout
        if not r.holds_one_sample:
            missing = (r.longest_sample_tokens - r.kv_cache_tokens_per_gpu) * (
                r.kv_bytes_per_token_per_gpu / GIB
            )
            # weights past the pool: that much more before the first KV token fits
            margin = min(margin, -missing - max(0.0, -r.kv_cache_gib))
        return margin

    @property
    def host_margin_gib(self) -> float:
        return self.host.host_gib - self.host.total_gib

    @property
    def train_fits(self) -> bool:
        return self.train_margin_gib >= 0

    @property
    def rollout_fits(self) -> bool:
        return self.rollout_margin_gib >= 0 and self.rollout.holds_one_sample

    @property
    def host_fits(self) -> bool:
        return self.host_margin_gib >= 0

    @property
    def fits(self) -> bool:
        return self.train_fits and self.rollout_fits and self.host_fits
