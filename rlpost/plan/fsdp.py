"""Per-GPU memory of the torch trainer on GPUs: FSDP2 over the data-parallel ranks.

The torch trainer shards every decoder layer and the root (embedding, final norm, output
head) with `fully_shard` over the DP ranks, or over groups of `layout.train.fsdp.
shard_group_size` ranks with replicas across the groups (HSDP). Its mixed precision keeps
the sharded parameters in float32 (the master copy), all-gathers them in the compute dtype
(bf16) and reduce-scatters gradients in float32; AdamW's two moments are float32 too. So
per parameter and GPU, a shard of S ranks holds (4 master + 4 gradient + 8 Adam) / S bytes
(ZeRO stage 3: Rajbhandari et al. 2020, section 5.3). With `layout.train.fsdp.cpu_offload`
(FSDP2's CPUOffloadPolicy) those 16 / S bytes live on the host, copied to the GPU one layer at
a time for the all-gather and back for the optimizer step, which runs on the host.

What a GPU holds besides its shards, during the training step's forward and backward:
- gathered parameters: the root's (FSDP2 keeps the root's parameters gathered from the
  forward to the end of the backward), the layer being computed and the next one, which
  FSDP2 prefetches, or with `layout.train.fsdp.reshard_after_forward: false` every layer's
  (gathered once in the forward and kept for the backward); during a layer's backward, its
  unsharded gradients in the compute dtype and their float32 copy that the reduce-scatter
  reads;
- the reference model (when the reference runs at all): a no-grad FSDP2 shard in the compute
  dtype, (2 / S bytes a parameter), or on the host with cpu_offload;
- activations: what transformers' decoder layers keep for backward under this trainer's
  packed attention (`torch_layer_activation_bytes`), every layer's without recompute, each
  checkpointed layer's input plus one layer's under full recompute (activation checkpointing
  per decoder layer); MoE and multi-latent attention layers with megatron-core's terms
  (rlpost.plan.memory.layer_activation_bytes);
- the log-prob kernel's hidden states, float32 chunks of logits, the output weight's gradient
  and the hidden states' float32 gradient (rlpost.plan.memory.logprob_kernel_bytes): the
  logits are never whole.

The torch trainer has no tensor, pipeline, context or expert parallelism: an MoE model's
experts are all in every gathered layer. MTP layers are not built (it trains the main model).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from rlpost.plan.backends import resolve_trainer_backend
from rlpost.plan.engine_memory import CUDA_CONTEXT_GIB, GIB
from rlpost.plan.layout import PADDED_ROWS_LIMIT, ParallelLayout
from rlpost.plan.memory import (
    ENGINE_RESIDUAL_GIB,
    TRAIN_WORKSPACE_GIB,
    TrainMemory,
    estimate_train,
    layer_activation_bytes,
    layer_input_bytes,
    logprob_kernel_bytes,
    train_tokens_per_gpu,
    weight_bytes,
)
from rlpost.plan.params import count_params, is_moe_layer, layer_params
from rlpost.schema import ModelConfig, RecipeConfig, RunConfig
from rlpost.schema.layout import TrainLayout

SHARDED_STATE_BYTES = 16
"""Per parameter, split over the shard group: float32 master, gradient and two Adam moments."""
MASTER_BYTES = 4
GRAD_BYTES = 4
ADAM_BYTES = 8
GRAD_REDUCE_BYTES = 4
"""The float32 copy of a layer's gradients that the reduce-scatter reads (reduce_dtype)."""
GATHERED_LAYERS = 2
"""The layer being computed and the one FSDP2 prefetches (forward and backward)."""


FSDP_NOTE = (
    "trainer torch on GPUs (FSDP2 over {shards} ranks): the memory counts its float32 shards, "
    "the gathered root and {gathered}, and activations as transformers' Llama-style layers "
    "keep them with rlpost's RMSNorm and SwiGLU kernels (an architecture with other norms or "
    "MLPs may keep more); the step time "
    "assumes megatron's measured MFU, which this trainer's measured step followed within "
    "3-12% on one GPU, and FSDP2's all-gathers and reduce-scatters beside the layers' "
    "compute, waited for only where they outlast it (modelled; never measured on several "
    "GPUs)"
)
FSDP_MOE_NOTE = (
    "; an MoE layer's experts are all gathered at once (no expert parallelism), and the "
    "buffers of transformers' expert dispatch are not counted"
)


@dataclass(frozen=True)
class FsdpOptions:
    """`layout.train.fsdp`, read where the schema has it (defaults where it does not)."""

    cpu_offload: bool = False
    shard_group_size: int | None = None
    reshard_after_forward: bool = True  # on GPUs, where the plan sizes FSDP2

    def shards(self, dp: int) -> int:
        """Ranks each sharded tensor is split over: the HSDP group, or every DP rank."""
        return min(self.shard_group_size or dp, dp)


FSDP_IN_SCHEMA = "fsdp" in TrainLayout.model_fields
"""Whether `layout.train.fsdp` exists to be read and written (the plan reads it defensively)."""
FSDP_OFFLOAD_KEY = "layout.train.fsdp.cpu_offload"
FSDP_RESHARD_KEY = "layout.train.fsdp.reshard_after_forward"
FSDP_GROUP_KEY = "layout.train.fsdp.shard_group_size"


def fsdp_options(cfg: RunConfig) -> FsdpOptions:
    section = getattr(cfg.layout.train, "fsdp", None)
    reshard = getattr(section, "reshard_after_forward", None)
    return FsdpOptions(
        cpu_offload=bool(getattr(section, "cpu_offload", False)),
        shard_group_size=getattr(section, "shard_group_size", None),
        reshard_after_forward=True if reshard is None else bool(reshard),
    )


@dataclass(frozen=True)
class FsdpTrainMemory(TrainMemory):
    """A torch trainer GPU during the step. `weights_gib`, `grads_gib` and `optimizer_gib`
    are the float32 shards (0 when offloaded); `params_per_gpu` the parameters of a shard."""

    shards: int
    cpu_offload: bool
    reshard_after_forward: bool  # false: every layer stays gathered from forward to backward
    gathered_gib: float  # root, two layers (or every layer) and one layer's gradients
    reference_gib: float  # the reference model's shard on the GPU

    def host_reference_gib(self, model: ModelConfig) -> float:
        return 0.0  # sharded on the GPU, or in host_optimizer_gib when offloaded


def trained_params(model: ModelConfig) -> int:
    """What the torch trainer builds: the main model, without MTP layers."""
    params = count_params(model)
    return params.total - params.mtp


def root_params(model: ModelConfig) -> int:
    """The root unit: embedding, final norm and an untied output head."""
    params = count_params(model)
    return params.embedding + params.output + model.hidden_size


def largest_layer_params(model: ModelConfig) -> int:
    return max(layer_params(model, i).total for i in range(model.num_layers))


def gathered_bytes(model: ModelConfig, reshard_after_forward: bool = True) -> float:
    """Unsharded at the peak of a layer's backward: the root's and two layers' parameters in
    the compute dtype (every layer's when the layers are not resharded after their forward),
    and the layer's gradients in the compute dtype and in float32."""
    element = weight_bytes(model)
    layer = largest_layer_params(model)
    if reshard_after_forward:
        params = root_params(model) + GATHERED_LAYERS * layer
    else:
        params = trained_params(model)  # the root and every layer
    return element * params + layer * (element + GRAD_REDUCE_BYTES)


def torch_layer_activation_bytes(
    model: ModelConfig,
    index: int,
    tokens: int,
    par: ParallelLayout,
    fused: bool = True,
    padded_rows: float = PADDED_ROWS_LIMIT,
) -> float:
    """Bytes decoder layer `index` of a transformers model keeps for backward over `tokens`
    tokens under this trainer, in the compute dtype (c bytes; bf16 on GPUs), counted tensor by
    tensor for a Llama-style layer (Llama, Mistral, Qwen2/3, GLM-4):
    - `fused`: the layer runs rlpost's kernels, as the trainer does on CUDA
      (rlpost.backends.torch_trainer.kernels.fuse_kernels); else transformers' own modules, as
      on CPU;
    - each RMSNorm keeps its input and the float32 1/rms of each row when it runs fused;
      as transformers computes it (on CPU) it keeps its input's float32 copy (4 bytes an
      element, the input itself when it is float32 already), the 1/rms and the normed row back
      in the compute dtype; the two layer norms' outputs are the projections' inputs (c each);
      QK-norm does the same per head for queries and keys, and GLM-4's post norms after
      attention and MLP;
    - RoPE keeps only its shared cos and sin tables (counted nowhere: one per forward);
    - the packed attention (rlpost.backends.torch_trainer.attention) gathers Q, K and V into
      padded batches of samples, which SDPA keeps with its output and float32 log-sum-exp
      per head, `padded_rows` rows per token (each group of samples of similar lengths pads
      to its longest: at most PADDED_ROWS_LIMIT, 1.0 for samples of one length); the output
      projection keeps its input;
    - a gated MLP keeps the gate, its activation, the up projection and their product (4 c f);
      fused, a SwiGLU MLP keeps the gate, the up projection and their product (3 c f: the
      activation is recomputed in backward); an ungated one its input and activation (2 c f).
    MoE and multi-latent attention layers are counted with megatron-core's terms
    (rlpost.plan.memory.layer_activation_bytes), which transformers' may not match."""
    if model.mla is not None or is_moe_layer(model, index):
        return layer_activation_bytes(model, index, tokens, par, "none", padded_rows=padded_rows)
    c = float(weight_bytes(model))
    h, f = model.hidden_size, model.ffn_hidden_size
    heads, groups = model.num_attention_heads, model.num_query_groups
    a, g = heads * model.head_dim, groups * model.head_dim

    def norm(width: int, rows: int) -> float:  # per token: the input (or its float32 copy
        # and the normed row), each row's 1/rms
        return (c * width if fused else 4.0 * width + c * width) + 4.0 * rows

    post_norms = int(model.post_self_attn_layernorm) + int(model.post_mlp_layernorm)
    per_token = 2 * (norm(h, 1) + c * h) + post_norms * norm(h, 1)
    if model.qk_layernorm:
        per_token += norm(a, heads) + norm(g, groups)
    per_token += padded_rows * (c * (2 * a + 2 * g) + 4.0 * heads) + c * a  # Q K V, output,
    # lse (padded); o_proj's input
    gated = model.activation in ("swiglu", "geglu")
    per_token += (3 if fused and model.activation == "swiglu" else 4 if gated else 2) * c * f
    return tokens * per_token


def torch_activation_bytes(model: ModelConfig, tokens: int, par: ParallelLayout) -> float:
    """Every decoder layer's activations (`torch_layer_activation_bytes`) for one micro-batch
    of `tokens` tokens; under full recompute (model_io.checkpoint_layers: every layer, or the
    first recompute_num_layers with method `block`) a checkpointed layer keeps its input, and
    the backward recomputes one checkpointed layer at a time."""
    each = [torch_layer_activation_bytes(model, i, tokens, par) for i in range(model.num_layers)]
    # on GPUs the trainer runs rlpost's kernels (the default of torch_layer_activation_bytes)
    if par.recompute == "none":
        return sum(each)
    checkpointed = model.num_layers
    if par.recompute_method == "block":
        checkpointed = min(par.recompute_num_layers, model.num_layers)
    if checkpointed == 0:
        return sum(each)
    inputs = checkpointed * layer_input_bytes(model, tokens, par)
    return inputs + sum(each[checkpointed:]) + max(each[:checkpointed])


def estimate_fsdp_train(
    cfg: RunConfig,
    par: ParallelLayout,
    colocate: bool,
    recipe: RecipeConfig | None = None,
    options: FsdpOptions | None = None,
) -> FsdpTrainMemory:
    """Per-GPU training memory of the torch trainer (`recipe` and `options` replace the
    config's, for trying what would fit)."""
    model = cfg.model
    recipe = recipe or cfg.recipe
    options = options or fsdp_options(cfg)
    shards = options.shards(par.dp)
    shard = trained_params(model) / shards
    offload = options.cpu_offload
    on_gpu = 0.0 if offload else 1.0
    reference = 0.0
    if recipe.algo.reference_interval > 0:
        reference = shard * weight_bytes(model) / GIB
    tokens = train_tokens_per_gpu(recipe, 1)
    activations = torch_activation_bytes(model, tokens, par) / GIB
    logits = logprob_kernel_bytes(model, tokens, par) / GIB
    gathered = gathered_bytes(model, options.reshard_after_forward) / GIB
    overhead = CUDA_CONTEXT_GIB + TRAIN_WORKSPACE_GIB + (ENGINE_RESIDUAL_GIB if colocate else 0.0)
    weights = on_gpu * shard * MASTER_BYTES / GIB
    grads = on_gpu * shard * GRAD_BYTES / GIB
    optimizer = on_gpu * shard * ADAM_BYTES / GIB
    reference_gpu = on_gpu * reference
    total = weights + grads + optimizer + gathered + reference_gpu + activations + logits + overhead
    # offloaded: the shards and the reference live on the host, per rank
    host_state = 0.0 if not offload else shard * SHARDED_STATE_BYTES / GIB + reference
    return FsdpTrainMemory(
        stage=0,
        params_per_gpu=shard,
        tokens_per_gpu=tokens,
        weights_gib=weights,
        grads_gib=grads,
        optimizer_gib=optimizer,
        activations_gib=activations,
        logits_gib=logits,
        grouped_experts_gib=0.0,  # transformers' experts are stacked parameters already
        weight_bucket_gib=0.0,
        overhead_gib=overhead,
        total_gib=total,
        host_optimizer_gib=host_state,
        shards=shards,
        cpu_offload=offload,
        reshard_after_forward=options.reshard_after_forward,
        gathered_gib=gathered,
        reference_gib=reference_gpu,
    )


def fsdp_trains(cfg: RunConfig, backend: str) -> bool:
    """The plan sizes the torch trainer as FSDP2 on GPU profiles (on CPU every figure is
    nominal and the megatron-shaped estimate stands)."""
    return backend == "torch" and cfg.hardware.kind == "gpu"


def estimate_trainer(
    cfg: RunConfig,
    par: ParallelLayout,
    colocate: bool,
    recipe: RecipeConfig | None = None,
    options: FsdpOptions | None = None,
) -> TrainMemory:
    """The training peak per GPU of the backend that trains `par` (`options` replace the
    config's FSDP2 options where the torch trainer trains)."""
    if fsdp_trains(cfg, resolve_trainer_backend(cfg, par)):
        return estimate_fsdp_train(cfg, par, colocate, recipe, options)
    return estimate_train(cfg.model, recipe or cfg.recipe, cfg.hardware, par, colocate)


WEIGHT_BUCKET_COPIES = 2
"""A bucket of weights on its way to the engines: the tensors gathered into it and the one
flat copy the tensor and distributed syncs send (rlpost.backends.sglang.buckets); a tensor
larger than the bucket (the embedding, most often) travels alone."""


def estimate_sender(
    cfg: RunConfig,
    par: ParallelLayout,
    colocate: bool,
    bucket_bytes: int,
    options: FsdpOptions | None = None,
) -> TrainMemory:
    """A train rank of mode=eval (rlpost.plan.work.SEND_WEIGHTS): it builds the policy with
    no optimizer and no reference model, loads the weights (run.resume's checkpoint or
    model.load) and sends them to the engines a bucket at a time, and runs no train step: its
    GPU holds the weights as the trainer keeps them (megatron's in the compute dtype split
    over TP, PP and EP; the torch trainer's float32 FSDP2 shards), the bucket, and the CUDA
    context; no gradients, optimizer state, activations or logits, and no micro-batch (its
    tokens_per_gpu is 0: recipe.train's batch settings are training's alone)."""
    train = estimate_trainer(cfg, par, colocate, options=options)
    model = cfg.model
    largest = model.vocab_size * model.hidden_size * weight_bytes(model)  # travels alone
    bucket = WEIGHT_BUCKET_COPIES * max(bucket_bytes, largest) / GIB
    kept: dict[str, Any] = {
        "tokens_per_gpu": 0,
        "grads_gib": 0.0,
        "optimizer_gib": 0.0,
        "activations_gib": 0.0,
        "logits_gib": 0.0,
        "grouped_experts_gib": 0.0,
        "weight_bucket_gib": bucket,
        "total_gib": train.weights_gib + bucket + train.overhead_gib,
        "host_optimizer_gib": 0.0,
    }
    if isinstance(train, FsdpTrainMemory):
        # offloaded (FSDP2 CPU offload): the float32 shards wait on the host
        shards = train.params_per_gpu * MASTER_BYTES / GIB if train.cpu_offload else 0.0
        kept |= {"gathered_gib": 0.0, "reference_gib": 0.0, "host_optimizer_gib": shards}
    return replace(train, **kept)
