"""megatron-core settings for a model and a parallel layout, without building anything.

`megatron_settings` turns a ModelConfig plus the plan's ParallelLayout into megatron-core's own
objects: a TransformerConfig (MLATransformerConfig for multi-latent attention), the GPTModel
arguments, the process-group sizes, the DDP and optimizer configs. Nothing here touches
torch.distributed or allocates a weight, so the seeds' full-size plans can be checked on a
laptop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig
from megatron.core.transformer.enums import AttnBackend
from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

from rlpost.plan.checks import megatron_model_issues
from rlpost.plan.layout import RECOMPUTE_NONE, SELECTIVE_RECOMPUTE_MODULES, ParallelLayout
from rlpost.schema import ModelConfig, OptimConfig

try:
    import transformer_engine  # type: ignore[import-not-found]  # noqa: F401

    HAVE_TE = True
except ImportError:
    HAVE_TE = False

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class UnsupportedModelError(ValueError):
    """The model YAML asks for an architecture this backend cannot express in megatron-core."""


@dataclass(frozen=True)
class ParallelSizes:
    """Arguments of megatron-core's initialize_model_parallel, plus the data-parallel size."""

    tensor_model_parallel_size: int
    pipeline_model_parallel_size: int
    context_parallel_size: int
    expert_model_parallel_size: int
    expert_tensor_parallel_size: int
    data_parallel_size: int

    @property
    def world_size(self) -> int:
        return (
            self.tensor_model_parallel_size
            * self.pipeline_model_parallel_size
            * self.context_parallel_size
            * self.data_parallel_size
        )

    def init_kwargs(self) -> dict[str, int]:
        return {
            "tensor_model_parallel_size": self.tensor_model_parallel_size,
            "pipeline_model_parallel_size": self.pipeline_model_parallel_size,
            "context_parallel_size": self.context_parallel_size,
            "expert_model_parallel_size": self.expert_model_parallel_size,
            "expert_tensor_parallel_size": self.expert_tensor_parallel_size,
        }


@dataclass(frozen=True)
class GPTArgs:
    """GPTModel's constructor arguments besides the config and the layer spec."""

    vocab_size: int  # padded as Megatron pads; logits beyond `true_vocab_size` are masked
    true_vocab_size: int
    max_sequence_length: int
    share_embeddings_and_output_weights: bool
    rotary_percent: float
    rotary_base: float
    position_embedding_type: str = "rope"


@dataclass(frozen=True)
class MegatronSettings:
    transformer: TransformerConfig
    gpt: GPTArgs
    parallel: ParallelSizes
    ddp: DistributedDataParallelConfig
    optimizer: OptimizerConfig | None
    post_self_attn_layernorm: bool
    post_mlp_layernorm: bool
    moe_layer_pattern: tuple[int, ...] = field(default=())

    @property
    def own_rope(self) -> bool:
        """RoPE is applied by rlpost's PackedAttention from a per-micro-batch table (MLA
        applies its own rotary embedding inside megatron-core)."""
        return self.gpt.position_embedding_type == "rope" and not (
            self.transformer.multi_latent_attention
        )


def padded_vocab_size(vocab_size: int, tp: int, divisible_by: int = 128) -> int:
    """Megatron-LM's padding (megatron/training/tokenizer/tokenizer.py, _vocab_size_with_padding):
    rows to a multiple of divisible_by x TP, so a torch_dist checkpoint of Megatron's (slime's)
    has the same embedding shape as rlpost's."""
    multiple = divisible_by * tp
    return int(math.ceil(vocab_size / multiple) * multiple)


def moe_layer_pattern(model: ModelConfig) -> list[int]:
    """1 for an MoE layer, 0 for a dense one (megatron-core's moe_layer_freq as a list)."""
    if model.moe is None:
        return []
    dense = model.moe.first_k_dense_layers
    return [0] * dense + [1] * (model.num_layers - dense)


def _check_layout(model: ModelConfig, par: ParallelLayout) -> None:
    """Layouts megatron-core accepts but trains wrongly (or refuses only mid-step)."""
    problems = []
    if model.moe is not None and par.tp > 1 and not par.sequence_parallel:
        problems.append(
            f"layout.train.tp={par.tp} with a mixture-of-experts model needs "
            "sequence_parallel: true (megatron-core refuses MoE with TP otherwise)"
        )
    if model.moe is not None and par.ep == 1 and par.etp < par.tp:
        problems.append(
            f"layout.train.etp={par.etp} < tp={par.tp} with ep=1: each TP rank routes its own "
            "tokens through replicated experts whose gradients megatron-core never sums "
            f"across the TP group; set etp: {par.tp}, or ep > 1"
        )
    if model.mla is not None and par.tp > 1 and not par.sequence_parallel:
        problems.append(
            f"layout.train.tp={par.tp} with multi-latent attention needs sequence_parallel: "
            "true (the shared rope key's gradient is only summed across TP ranks there)"
        )
    if problems:
        raise UnsupportedModelError("; ".join(problems))


def _check_supported(model: ModelConfig) -> None:
    """What validation refuses for this backend (plan.checks.megatron_model_issues), for a
    trainer built without a plan."""
    issues = megatron_model_issues(model)
    if issues:
        raise UnsupportedModelError("; ".join(f"{i.key}: {i.message}; {i.fix}" for i in issues))


def _moe_kwargs(model: ModelConfig, par: ParallelLayout) -> dict[str, Any]:
    moe = model.moe
    if moe is None:
        return {}
    shared = moe.shared_expert_ffn_hidden_size or moe.num_shared_experts * (
        moe.expert_ffn_hidden_size
    )
    return {
        "num_moe_experts": moe.num_experts,
        "moe_layer_freq": moe_layer_pattern(model),
        "moe_ffn_hidden_size": moe.expert_ffn_hidden_size,
        "moe_router_topk": moe.top_k,
        "moe_router_score_function": moe.router_score,
        "moe_router_dtype": "fp32" if moe.router_dtype == "fp32" else None,
        "moe_shared_expert_intermediate_size": shared or None,
        "moe_router_enable_expert_bias": moe.router_expert_bias,
        # the bias is learned in pre-training; RL leaves it fixed
        "moe_router_bias_update_rate": 0.0,
        "moe_router_topk_scaling_factor": (
            moe.router_topk_scaling_factor if moe.router_topk_scaling_factor != 1.0 else None
        ),
        "moe_router_num_groups": moe.router_num_groups,
        "moe_router_group_topk": moe.router_group_topk,
        "moe_router_pre_softmax": moe.router_score == "softmax" and not moe.norm_topk_prob,
        "moe_grouped_gemm": moe.grouped_gemm,
        "moe_router_load_balancing_type": "none",
        "moe_aux_loss_coeff": 0.0,
        "moe_enable_deepep": par.moe_enable_deepep,
    }


def _mla_kwargs(model: ModelConfig) -> dict[str, Any]:
    mla = model.mla
    if mla is None:
        return {}
    return {
        "multi_latent_attention": True,
        "q_lora_rank": mla.q_lora_rank,
        "kv_lora_rank": mla.kv_lora_rank,
        "qk_head_dim": mla.qk_head_dim,
        "qk_pos_emb_head_dim": mla.qk_pos_emb_head_dim,
        "v_head_dim": mla.v_head_dim,
        "rotary_base": model.rotary_base,
        "rotary_percent": model.rotary_percent,
        **_mla_rope_kwargs(model),
    }


def _mla_rope_kwargs(model: ModelConfig) -> dict[str, Any]:
    """MLA's rotary embedding is megatron-core's own: plain, or YaRN's (DeepSeek-V3), whose
    attention temperature megatron-core also folds into the softmax scale with
    mscale_all_dim, as transformers does."""
    scaling = model.rope_scaling
    if scaling is None:
        return {"rope_type": "rope", "rotary_scaling_factor": 1.0}
    if scaling.type != "yarn":  # refused by _check_supported
        raise UnsupportedModelError(f"multi-latent attention with {scaling.type} RoPE scaling")
    return {
        "rope_type": "yarn",
        "rotary_scaling_factor": scaling.factor,
        "original_max_position_embeddings": scaling.original_max_position_embeddings,
        "beta_fast": scaling.beta_fast,
        "beta_slow": scaling.beta_slow,
        "mscale": scaling.mscale,
        "mscale_all_dim": scaling.mscale_all_dim,
    }


def _mtp_kwargs(model: ModelConfig, mtp_loss_scaling_factor: float | None) -> dict[str, Any]:
    """The MTP block's settings; None builds no MTP layers (their weights pass through)."""
    if mtp_loss_scaling_factor is None:
        return {}
    if model.mtp_num_layers == 0:
        raise UnsupportedModelError(
            f"MTP training asks for multi-token-prediction layers, but model {model.name!r} "
            "has mtp_num_layers=0; set model.mtp_num_layers (the HF config's "
            "num_nextn_predict_layers) or turn recipe.train.mtp_training off"
        )
    return {
        "mtp_num_layers": model.mtp_num_layers,
        "mtp_loss_scaling_factor": mtp_loss_scaling_factor,
    }


def _recompute_kwargs(par: ParallelLayout) -> dict[str, Any]:
    if par.recompute == RECOMPUTE_NONE:
        return {}
    if par.recompute == "selective":
        return {
            "recompute_granularity": "selective",
            "recompute_modules": list(SELECTIVE_RECOMPUTE_MODULES),
        }
    return {
        "recompute_granularity": par.recompute,
        "recompute_method": par.recompute_method,
        "recompute_num_layers": par.recompute_num_layers,
    }


def transformer_config(
    model: ModelConfig,
    par: ParallelLayout,
    on_gpu: bool,
    seed: int = 1234,
    mtp_loss_scaling_factor: float | None = None,
) -> TransformerConfig:
    """megatron-core's TransformerConfig for `model` under `par`; fp32 on CPU. With an MTP
    loss factor it describes the model's MTP layers too."""
    _check_supported(model)
    _check_layout(model, par)
    dtype = DTYPES[model.params_dtype] if on_gpu else torch.float32
    kwargs: dict[str, Any] = {
        "num_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "ffn_hidden_size": model.ffn_hidden_size,
        "num_attention_heads": model.num_attention_heads,
        "num_query_groups": model.num_query_groups,
        "kv_channels": model.megatron_kv_channels,
        "normalization": "RMSNorm",
        "layernorm_epsilon": model.norm_epsilon,
        "gated_linear_unit": True,
        "activation_func": F.silu,
        "add_bias_linear": model.add_bias_linear,
        "add_qkv_bias": model.add_qkv_bias,
        "qk_layernorm": model.qk_layernorm,
        "rotary_interleaved": model.rotary_interleaved,
        "apply_rope_fusion": False,
        "bias_activation_fusion": False,
        # the MLP hands fc1's output to rlpost's SwiGLU module (kernels.swiglu), which keeps
        # only that output for backward; the flag's name is megatron-core's, no TE is needed
        "use_te_activation_func": True,
        "masked_softmax_fusion": False,
        "bias_dropout_fusion": False,
        "persist_layer_norm": False,
        "gradient_accumulation_fusion": False,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "attention_softmax_in_fp32": True,
        "attention_backend": AttnBackend.flash if on_gpu else AttnBackend.local,
        "params_dtype": dtype,
        "pipeline_dtype": dtype,
        "bf16": dtype == torch.bfloat16,
        "fp16": dtype == torch.float16,
        "use_cpu_initialization": not on_gpu,
        "tensor_model_parallel_size": par.tp,
        "pipeline_model_parallel_size": par.pp,
        "context_parallel_size": par.cp,
        "expert_model_parallel_size": par.ep,
        "expert_tensor_parallel_size": par.etp,
        "sequence_parallel": par.sequence_parallel,
        "num_layers_in_first_pipeline_stage": par.num_layers_in_first_pipeline_stage,
        "num_layers_in_last_pipeline_stage": par.num_layers_in_last_pipeline_stage,
        # packed samples: every micro-batch has its own length
        "variable_seq_lengths": True,
        # losses arrive already divided by step-wide denominators (rlpost.algo.losses)
        "calculate_per_token_loss": True,
        "deallocate_pipeline_outputs": True,
        # megatron-core refuses variable lengths with the allgather dispatcher, MoE or not
        "moe_token_dispatcher_type": par.moe_token_dispatcher_type or "alltoall",
        **_recompute_kwargs(par),
        **_moe_kwargs(model, par),
        **_mla_kwargs(model),
        **_mtp_kwargs(model, mtp_loss_scaling_factor),
    }
    config_class = MLATransformerConfig if model.mla is not None else TransformerConfig
    return config_class(**kwargs)


def optimizer_config(
    optim: OptimConfig, par: ParallelLayout, dtype: torch.dtype
) -> OptimizerConfig:
    """Adam as configured. The precision-aware flag is validated against the installed
    TransformerEngine; without TE (CPU) it is recorded after construction, and only a GPU
    machine with TE can build that optimizer."""
    config = OptimizerConfig(
        optimizer=optim.optimizer,
        lr=optim.lr,
        min_lr=optim.min_lr,
        weight_decay=optim.weight_decay,
        adam_beta1=optim.adam_beta1,
        adam_beta2=optim.adam_beta2,
        adam_eps=optim.adam_eps,
        clip_grad=optim.clip_grad,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        params_dtype=dtype,
        use_distributed_optimizer=par.distributed_optimizer,
        optimizer_cpu_offload=optim.cpu_offload,
        overlap_cpu_optimizer_d2h_h2d=optim.overlap_cpu_optimizer_d2h_h2d,
        use_precision_aware_optimizer=optim.precision_aware_optimizer and HAVE_TE,
    )
    config.use_precision_aware_optimizer = optim.precision_aware_optimizer
    return config


def megatron_settings(
    model: ModelConfig,
    par: ParallelLayout,
    optim: OptimConfig | None = None,
    *,
    on_gpu: bool,
    mtp_loss_scaling_factor: float | None = None,
) -> MegatronSettings:
    """Everything megatron-core needs to build and train `model` under `par`; with an MTP loss
    factor, its multi-token-prediction layers as well (rlpost.backends.megatron.mtp)."""
    config = transformer_config(model, par, on_gpu, mtp_loss_scaling_factor=mtp_loss_scaling_factor)
    gpt = GPTArgs(
        vocab_size=padded_vocab_size(model.vocab_size, par.tp, model.make_vocab_size_divisible_by),
        true_vocab_size=model.vocab_size,
        max_sequence_length=model.max_position_embeddings,
        share_embeddings_and_output_weights=model.tie_word_embeddings,
        rotary_percent=model.rotary_percent,
        rotary_base=model.rotary_base,
    )
    sizes = ParallelSizes(par.tp, par.pp, par.cp, par.ep, par.etp, par.dp)
    ddp = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        use_distributed_optimizer=par.distributed_optimizer,
        overlap_grad_reduce=False,
        overlap_param_gather=False,
        average_in_collective=False,
    )
    return MegatronSettings(
        transformer=config,
        gpt=gpt,
        parallel=sizes,
        ddp=ddp,
        optimizer=optimizer_config(optim, par, config.params_dtype) if optim else None,
        post_self_attn_layernorm=model.post_self_attn_layernorm,
        post_mlp_layernorm=model.post_mlp_layernorm,
        moe_layer_pattern=tuple(moe_layer_pattern(model)),
    )
