"""Megatron's model-architecture flags for a ModelConfig (slime's MODEL_ARGS)."""

from __future__ import annotations

from typing import Any

from rlpost.schema import ModelConfig, RopeScalingConfig

Flag = tuple[str, ...]

LAYER_SPECS = {"glm4": ("slime_plugins.models.glm4", "get_glm_spec")}
"""Families whose blocks need a custom layer spec in slime (GLM-4's sandwich norms)."""


def format_value(value: Any) -> str:
    """Command-line text: whole floats without a fraction, exponents without padding."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return repr(value).replace("e-0", "e-").replace("e+0", "e+")
    return str(value)


def _flag(name: str, *values: Any) -> Flag:
    return (name, *(format_value(v) for v in values))


def _attention_args(m: ModelConfig) -> list[Flag]:
    if m.mla is not None:
        mla = m.mla
        flags: list[Flag] = [("--multi-latent-attention",)]
        flags += [_flag("--q-lora-rank", mla.q_lora_rank)] if mla.q_lora_rank else []
        # ModelConfig.megatron_kv_channels says why (slime's DeepSeek-V3 script gives it too)
        flags.append(_flag("--kv-channels", m.megatron_kv_channels))
        return [
            *flags,
            _flag("--kv-lora-rank", mla.kv_lora_rank),
            _flag("--qk-head-dim", mla.qk_head_dim),
            _flag("--qk-pos-emb-head-dim", mla.qk_pos_emb_head_dim),
            _flag("--v-head-dim", mla.v_head_dim),
        ]
    gqa: list[Flag] = []
    if m.num_query_groups < m.num_attention_heads:
        gqa += [("--group-query-attention",), _flag("--num-query-groups", m.num_query_groups)]
    if m.kv_channels:
        gqa.append(_flag("--kv-channels", m.kv_channels))
    return gqa


def _llama3_scaling(scaling: RopeScalingConfig) -> list[Flag]:
    # megatron-core fixes the frequency bands (1, 4, 8192 tokens); the factor is the one knob
    return [("--use-rope-scaling",), _flag("--rope-scaling-factor", scaling.factor)]


def _yarn_scaling(scaling: RopeScalingConfig) -> list[Flag]:
    # multi-latent attention's YaRN; beta and the original length keep megatron's defaults
    return [
        _flag("--rotary-scaling-factor", scaling.factor),
        _flag("--mscale", scaling.mscale),
        _flag("--mscale-all-dim", scaling.mscale_all_dim),
    ]


ROPE_SCALING_ARGS = {"llama3": _llama3_scaling, "yarn": _yarn_scaling}


def _rope_args(m: ModelConfig) -> list[Flag]:
    flags = [("--position-embedding-type", "rope"), _flag("--rotary-base", m.rotary_base)]
    if m.rotary_percent != 1.0:
        flags.append(_flag("--rotary-percent", m.rotary_percent))
    if m.rotary_interleaved:
        # the fused RoPE kernel has no interleaved layout
        flags += [("--rotary-interleaved",), ("--no-rope-fusion",)]
    if m.rope_scaling is not None:
        flags += ROPE_SCALING_ARGS[m.rope_scaling.type](m.rope_scaling)
    return flags


def _moe_args(m: ModelConfig) -> list[Flag]:
    moe = m.moe
    if moe is None:
        return []
    dense, sparse = moe.first_k_dense_layers, m.num_layers - moe.first_k_dense_layers
    freq = f"[0]*{dense}+[1]*{sparse}" if dense else "1"
    shared = moe.shared_expert_ffn_hidden_size or moe.num_shared_experts * (
        moe.expert_ffn_hidden_size
    )
    flags = [
        _flag("--num-experts", moe.num_experts),
        _flag("--moe-layer-freq", freq),
        _flag("--moe-ffn-hidden-size", moe.expert_ffn_hidden_size),
        _flag("--moe-router-topk", moe.top_k),
        _flag("--moe-router-score-function", moe.router_score),
        _flag("--moe-router-dtype", moe.router_dtype),
    ]
    if shared:
        flags.append(_flag("--moe-shared-expert-intermediate-size", shared))
    if moe.router_expert_bias:
        # the bias is learned in pre-training; RL leaves it fixed
        flags += [("--moe-router-enable-expert-bias",), ("--moe-router-bias-update-rate", "0")]
    if moe.router_topk_scaling_factor != 1.0:
        flags.append(_flag("--moe-router-topk-scaling-factor", moe.router_topk_scaling_factor))
    if moe.router_num_groups:
        flags.append(_flag("--moe-router-num-groups", moe.router_num_groups))
    if moe.router_group_topk:
        flags.append(_flag("--moe-router-group-topk", moe.router_group_topk))
    if moe.grouped_gemm:
        flags.append(("--moe-grouped-gemm",))
    # the RL loss carries no load-balancing term
    flags.append(("--moe-aux-loss-coeff", "0"))
    return flags


def model_args(m: ModelConfig) -> list[Flag]:
    """Architecture flags; slime trains in bf16 unless told fp16 (it has no fp32 switch)."""
    spec = LAYER_SPECS.get(m.family)
    flags: list[Flag] = [("--spec", *spec)] if spec and m.post_mlp_layernorm else []
    flags += [("--swiglu",)] if m.activation == "swiglu" else []
    flags += [
        _flag("--num-layers", m.num_layers),
        _flag("--hidden-size", m.hidden_size),
        _flag("--ffn-hidden-size", m.ffn_hidden_size),
        _flag("--num-attention-heads", m.num_attention_heads),
        *_attention_args(m),
        *_rope_args(m),
        ("--normalization", "RMSNorm"),
        _flag("--norm-epsilon", m.norm_epsilon),
        _flag("--vocab-size", m.vocab_size),
    ]
    if m.make_vocab_size_divisible_by != 128:  # Megatron's default: the padded rows' shape
        flags.append(_flag("--make-vocab-size-divisible-by", m.make_vocab_size_divisible_by))
    flags += [] if m.add_bias_linear else [("--disable-bias-linear",)]
    flags += [("--add-qkv-bias",)] if m.add_qkv_bias else []
    flags += [("--qk-layernorm",)] if m.qk_layernorm else []
    flags += [("--post-self-attn-layernorm",)] if m.post_self_attn_layernorm else []
    flags += [("--post-mlp-layernorm",)] if m.post_mlp_layernorm else []
    flags += [] if m.tie_word_embeddings else [("--untie-embeddings-and-output-weights",)]
    flags += [("--fp16",)] if m.params_dtype == "fp16" else []
    return flags + _moe_args(m)
