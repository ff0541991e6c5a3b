"""Tiny random HF checkpoints of each architecture the Megatron backend builds, each with the
model YAML (ModelConfig) that describes it.

Each builder names the HF config fields and the ModelConfig fields of its architecture; what
every tiny checkpoint shares (vocabulary, width, heads, positions) is added by `_build`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import (
    Glm4ForCausalLM,
    Glm4MoeForCausalLM,
    Glm4MoeLiteForCausalLM,
    LlamaForCausalLM,
    PreTrainedModel,
    Qwen3ForCausalLM,
)

from rlpost.schema import ModelConfig

VOCAB = 96
HIDDEN = 64
HEADS = 4
POSITIONS = 256
HALF_ROTARY = {"rope_theta": 10000.0, "partial_rotary_factor": 0.5, "rope_type": "default"}

# grouped-query attention of 4 heads over 2 KV groups of 16 channels: HF fields, then ModelConfig's
GQA_HF: dict[str, Any] = {"num_key_value_heads": 2, "head_dim": 16}
GQA: dict[str, Any] = {"num_query_groups": 2, "kv_channels": 16}

# GLM-4's attention and dense MLP, shared by the dense and the MoE checkpoint
GLM4_HF: dict[str, Any] = GQA_HF | {
    "intermediate_size": 96,
    "rms_norm_eps": 1e-5,
    "attention_bias": True,
    "tie_word_embeddings": False,
}
GLM4: dict[str, Any] = GQA | {
    "ffn_hidden_size": 96,
    "rotary_base": 10000.0,
    "rotary_percent": 0.5,
    "norm_epsilon": 1e-5,
    "add_qkv_bias": True,
}

# 4 routed experts (top 2) and a shared one, after a dense first layer
MOE_HF: dict[str, Any] = {
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
}
MOE_FIELDS: dict[str, Any] = {
    "num_experts": 4,
    "top_k": 2,
    "expert_ffn_hidden_size": 32,
    "num_shared_experts": 1,
    "shared_expert_ffn_hidden_size": 32,
    "first_k_dense_layers": 1,
    "router_score": "sigmoid",
    "router_expert_bias": True,
    "router_topk_scaling_factor": 2.5,
    "router_num_groups": 1,
    "router_group_topk": 1,
}


def _save(model: torch.nn.Module, path: Path, seed: int) -> None:
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            # norms and biases away from their 1/0 init, so a misplaced one shows
            scale = 0.2 if param.ndim == 1 else 0.08
            param.copy_(torch.randn_like(param) * scale + (1.0 if "norm" in name else 0.0))
        for name, buffer in model.named_buffers():
            if "e_score_correction_bias" in name:
                buffer.copy_(torch.rand_like(buffer) * 0.1)
    model.save_pretrained(path)


def _build(
    path: Path,
    hf_class: type[PreTrainedModel],
    layers: int,
    seed: int,
    hf: dict[str, Any],
    **fields: Any,
) -> ModelConfig:
    """Save a random `hf_class` of `layers` layers with the config fields `hf`; the
    ModelConfig of `fields` that describes it."""
    shared = {"vocab_size": VOCAB, "hidden_size": HIDDEN, "max_position_embeddings": POSITIONS}
    config = hf_class.config_class(
        **shared, num_hidden_layers=layers, num_attention_heads=HEADS, **hf
    )
    _save(hf_class(config), path, seed)
    return ModelConfig(
        **shared,
        name=path.name,
        params_dtype="fp32",
        hf_checkpoint=str(path),
        hf_architecture=hf_class.__name__,
        num_layers=layers,
        num_attention_heads=HEADS,
        **fields,
    )


def qwen3(path: Path, *, tied: bool = True, layers: int = 2, seed: int = 0) -> ModelConfig:
    hf = GQA_HF | {
        "intermediate_size": 128,
        "rope_theta": 1000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": tied,
    }
    return _build(
        path,
        Qwen3ForCausalLM,
        layers,
        seed,
        hf,
        **GQA,
        family="qwen3",
        ffn_hidden_size=128,
        rotary_base=1000.0,
        norm_epsilon=1e-6,
        qk_layernorm=True,
        tie_word_embeddings=tied,
    )


# context extension over an original context of 16 positions: the samples reach past it
LLAMA3_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
YARN_SCALING = {"factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 8.0}


def llama_llama3_rope(path: Path, *, layers: int = 2, seed: int = 0) -> ModelConfig:
    """Llama 3.1's RoPE scaling."""
    hf = GQA_HF | {
        "intermediate_size": 128,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "rope_parameters": {"rope_theta": 5000.0, "rope_type": "llama3", **LLAMA3_SCALING},
    }
    return _build(
        path,
        LlamaForCausalLM,
        layers,
        seed,
        hf,
        **GQA,
        family="llama",
        ffn_hidden_size=128,
        rotary_base=5000.0,
        norm_epsilon=1e-5,
        rope_scaling={"type": "llama3", **LLAMA3_SCALING},
    )


def qwen3_yarn(path: Path, *, layers: int = 2, seed: int = 0) -> ModelConfig:
    """Qwen3's long-context YaRN: cos and sin scaled by its attention temperature."""
    hf = GQA_HF | {
        "intermediate_size": 128,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "rope_parameters": {"rope_theta": 1000.0, "rope_type": "yarn", **YARN_SCALING},
    }
    return _build(
        path,
        Qwen3ForCausalLM,
        layers,
        seed,
        hf,
        **GQA,
        family="qwen3",
        ffn_hidden_size=128,
        rotary_base=1000.0,
        norm_epsilon=1e-6,
        qk_layernorm=True,
        tie_word_embeddings=True,
        rope_scaling={"type": "yarn", **YARN_SCALING},
    )


def qwen3_untied(path: Path, *, layers: int = 2, seed: int = 0) -> ModelConfig:
    return qwen3(path, tied=False, layers=layers, seed=seed)


def glm4(path: Path, *, layers: int = 2, seed: int = 0) -> ModelConfig:
    hf = GLM4_HF | {"rope_parameters": dict(HALF_ROTARY), "pad_token_id": 0, "eos_token_id": 1}
    return _build(
        path,
        Glm4ForCausalLM,
        layers,
        seed,
        hf,
        **GLM4,
        family="glm4",
        rotary_interleaved=True,
        post_self_attn_layernorm=True,
        post_mlp_layernorm=True,
    )


def glm4_moe(path: Path, *, layers: int = 2, seed: int = 0) -> ModelConfig:
    hf = GLM4_HF | MOE_HF | {"rope_parameters": dict(HALF_ROTARY), "use_qk_norm": True}
    hf |= {"first_k_dense_replace": 1, "routed_scaling_factor": 2.5, "num_nextn_predict_layers": 0}
    return _build(
        path,
        Glm4MoeForCausalLM,
        layers,
        seed,
        hf,
        **GLM4,
        family="glm4_moe",
        qk_layernorm=True,
        moe=MOE_FIELDS,
    )


def glm4_moe_lite(path: Path, *, layers: int = 2, seed: int = 0, yarn: bool = False) -> ModelConfig:
    """Multi-latent attention: 4 heads, queries and KV through low-rank projections; with
    `yarn`, DeepSeek-V3's RoPE scaling (its mscales fold into the softmax scale too)."""
    rope: dict[str, Any] = {"rope_theta": 10000.0, "rope_type": "default"}
    scaling = YARN_SCALING | {"mscale": 0.707, "mscale_all_dim": 1.0}
    if yarn:
        rope = {"rope_theta": 10000.0, "rope_type": "yarn", **scaling}
    hf = MOE_HF | {
        "num_key_value_heads": HEADS,
        "q_lora_rank": 24,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 12,
        "rope_parameters": rope,
        "rms_norm_eps": 1e-5,
        "routed_scaling_factor": 1.8,
        "mlp_layer_types": ["dense"] + ["sparse"] * (layers - 1),
        "tie_word_embeddings": False,
    }
    mla = {
        "q_lora_rank": 24,
        "kv_lora_rank": 16,
        "qk_head_dim": 16,
        "qk_pos_emb_head_dim": 8,
        "v_head_dim": 12,
    }
    return _build(
        path,
        Glm4MoeLiteForCausalLM,
        layers,
        seed,
        hf,
        family="glm4_moe_lite",
        ffn_hidden_size=96,
        num_query_groups=HEADS,
        rotary_base=10000.0,
        norm_epsilon=1e-5,
        qk_layernorm=True,
        mla=mla,
        moe=MOE_FIELDS | {"router_topk_scaling_factor": 1.8},
        rope_scaling={"type": "yarn", **scaling} if yarn else None,
    )


def glm4_moe_lite_yarn(path: Path, *, layers: int = 2, seed: int = 0) -> ModelConfig:
    return glm4_moe_lite(path, layers=layers, seed=seed, yarn=True)


ARCHITECTURES: dict[str, Callable[..., ModelConfig]] = {
    "qwen3": qwen3,
    "qwen3_untied": qwen3_untied,
    "glm4": glm4,
    "glm4_moe": glm4_moe,
    "glm4_moe_lite": glm4_moe_lite,
    "llama_llama3_rope": llama_llama3_rope,
    "qwen3_yarn": qwen3_yarn,
    "glm4_moe_lite_yarn": glm4_moe_lite_yarn,
}
