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

Activations follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", section 4: a layer stores s*b*h*(34 + 5*a*s/h) bytes for tokens s*b and
hidden h; tensor parallelism splits 24 of the 34 (the attention and MLP interiors), sequence
parallelism the other 10 as well; selective recompute and flash attention drop the 5*a*s/h
softmax term. The MLP interior 16 = 4*ffn/h generalises to 6*ffn/h for gated MLPs (gate and
up outputs plus their product) and to top_k expert MLPs plus shared experts for MoE layers.
Full recompute keeps only each layer's input (2*s*h bytes, split by TP under SP) and rebuilds
one layer at a time. Pipeline stage i of p holds p - i micro-batches in flight under 1F1B
(section 4.2.3). The output layer's fp32 logits take vocab/TP x tokens x 4 bytes.
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
from rlpost.plan.layout import ParallelLayout, Sizes
from rlpost.plan.params import StageParams, is_moe_layer, params_per_stage, stage_layers
from rlpost.schema import HardwareConfig, ModelConfig, RecipeConfig

TRAIN_WORKSPACE_GIB = 2.0
"""NCCL buffers, cuBLAS workspaces and allocator fragmentation beyond the CUDA context."""
ENGINE_RESIDUAL_GIB = 1.0
"""Colocated: an engine process's CUDA context, left on the GPU after it releases memory."""
HOST_PER_PROCESS_GIB = 2.0
"""Host memory of one train rank's process (Python, CUDA host allocations, pinned buffers)."""
LOGPROB_CHUNK_BYTES = 256 << 20
"""float32 logits of one chunk of tokens in the trainers' log-prob kernel: the logits are
never whole in memory (rlpost.backends.megatron.logits)."""
REPLICATED_ACTIVATION_FACTOR = 10
"""Korthikanti's per-layer terms outside TP: two norm inputs (4), QKV and MLP inputs (4),
two dropout masks (2), in units of s*h bytes."""


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


def _layer_activation_coef(model: ModelConfig, index: int) -> float:
    """Bytes per token per hidden unit inside TP (attention 8 + MLP interior)."""
    gate = 6 if model.activation == "swiglu" else 4
    moe = model.moe
    if moe is not None and is_moe_layer(model, index):
        shared = moe.shared_expert_ffn_hidden_size or moe.num_shared_experts * (
            moe.expert_ffn_hidden_size
        )
        ffn = moe.top_k * moe.expert_ffn_hidden_size + shared
        return 8 + gate * ffn / model.hidden_size + 2 * moe.top_k
    return 8 + gate * model.ffn_hidden_size / model.hidden_size


@lru_cache(maxsize=1024)
def _stage_coefs(model: ModelConfig, layers: tuple[int, ...]) -> tuple[float, float]:
    """(sum, max) of the stage's layers' activation coefficients (cached per stage split)."""
    coefs = [_layer_activation_coef(model, i) for i in layers]
    return sum(coefs), max(coefs)


def _stage_activation_bytes(
    model: ModelConfig, stage: StageParams, index: int, tokens: int, par: ParallelLayout
) -> float:
    """Per layer s*h*(10 + inner/tp), or s*h*(10 + inner)/tp under SP, summed or maxed."""
    layers = tuple(range(stage.first_layer, stage.first_layer + stage.num_layers))
    if index == par.pp - 1:
        layers += (model.num_layers,) * model.mtp_num_layers
    in_flight = par.pp - index
    sh = tokens * model.hidden_size
    inner_sum, inner_max = _stage_coefs(model, layers)
    r = REPLICATED_ACTIVATION_FACTOR

    def bytes_of(count: int, inner: float) -> float:
        if par.sequence_parallel:
            return sh * (r * count + inner) / par.tp
        return sh * (r * count + inner / par.tp)

    if par.recompute != "full":
        return in_flight * bytes_of(len(layers), inner_sum)
    layer_input = 2 * tokens * model.hidden_size / (par.tp if par.sequence_parallel else 1)
    group = par.recompute_num_layers
    kept = math.ceil(len(layers) / group) * layer_input
    return in_flight * kept + group * bytes_of(1, inner_max)


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
    activations = _stage_activation_bytes(model, stage, index, tokens, par)
    logits = model.vocab_size / par.tp * tokens * 4 if index == par.pp - 1 else 0.0
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
        overhead_gib=overhead,
        total_gib=sum(parts.values()) + overhead,
        host_optimizer_gib=(optimizer + host_grads) / GIB if offload else 0.0,
    )


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
) -> HostMemory:
    """Ranks on the fullest node x (offloaded optimizer + reference weights kept on the host
    between uses when the reference runs at all, 2 bytes/param) + per-process overhead."""
    ranks = min(sizes.train_gpus, hardware.gpus_per_node)
    optimizer = ranks * train.host_optimizer_gib
    reference = 0.0
    if recipe.algo.reference_interval > 0:
        reference = ranks * train.params_per_gpu * weight_bytes(model) / GIB
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
        return t.total_gib - t.activations_gib - t.logits_gib + self.fp8_update_buffer_gib

    @property
    def train_margin_gib(self) -> float:
        return self.gpu_gib - max(self.train.total_gib, self.weight_sync_gib)

    @property
    def rollout_margin_gib(self) -> float:
        """Headroom at the rollout peak; a KV cache that cannot hold one sample counts as the
        memory still missing for it."""
        margin = self.gpu_gib - self.rollout.total_gib
        r = self.rollout
        if not r.holds_one_sample:
            missing = (r.longest_sample_tokens - r.kv_cache_tokens_per_gpu) * (
                r.kv_bytes_per_token_per_gpu / GIB
            )
            margin = min(margin, -missing)
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
