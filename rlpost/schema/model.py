"""Model architecture facts and checkpoint locations (conf/model/*.yaml)."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from rlpost.schema.base import InvariantError, LocalPath, Section, refuse_unused

Family = Literal[
    "qwen3", "qwen3_moe", "glm4", "glm4_moe", "glm4_moe_lite", "llama", "deepseek_v3", "generic"
]
"""The seven named families are the architectures megatron-core's layer specs express.
`generic` is any other HF causal LM, described by the facts its config.json states: the torch
trainer loads it with transformers and trains it; the plan counts it from these fields."""
GENERIC_FAMILY = "generic"


class MoEConfig(Section):
    """Mixture-of-experts block; absent for dense models."""

    num_experts: PositiveInt
    top_k: PositiveInt
    expert_ffn_hidden_size: PositiveInt
    num_shared_experts: NonNegativeInt = 0
    shared_expert_ffn_hidden_size: NonNegativeInt = 0
    first_k_dense_layers: NonNegativeInt = 0
    router_score: Literal["softmax", "sigmoid"] = "softmax"
    router_expert_bias: bool = False
    router_topk_scaling_factor: PositiveFloat = 1.0
    router_dtype: Literal["fp32", "bf16"] = "fp32"
    router_num_groups: PositiveInt | None = None
    router_group_topk: PositiveInt | None = None
    norm_topk_prob: bool = True
    grouped_gemm: bool = True

    @model_validator(mode="after")
    def check_top_k_within_experts(self) -> MoEConfig:
        if self.top_k > self.num_experts:
            raise InvariantError(
                f"top_k={self.top_k} exceeds num_experts={self.num_experts}; "
                "a token cannot be routed to more experts than exist",
                fields=("top_k",),
                fix=f"set top_k <= {self.num_experts} (the HF config's num_experts_per_tok)",
            )
        return self


class MLAConfig(Section):
    """Multi-latent attention (DeepSeek-V3 style) head geometry."""

    q_lora_rank: PositiveInt | None = None
    kv_lora_rank: PositiveInt
    qk_head_dim: PositiveInt
    qk_pos_emb_head_dim: PositiveInt
    v_head_dim: PositiveInt


RopeScalingType = Literal["llama3", "yarn"]
ROPE_SCALING_FIELDS: dict[RopeScalingType, tuple[str, ...]] = {
    "llama3": ("low_freq_factor", "high_freq_factor"),
    "yarn": ("beta_fast", "beta_slow", "mscale", "mscale_all_dim"),
}
"""The fields only one type reads (rlpost.backends.rope); type, factor and
original_max_position_embeddings both do."""


class RopeScalingConfig(Section):
    """RoPE context extension, as the HF config's `rope_scaling` states it.

    `llama3` rescales frequency bands (Llama 3.1+); `yarn` interpolates with attention
    temperature (DeepSeek-V3). Fields of the other type (`ROPE_SCALING_FIELDS`) keep their
    defaults: nothing reads them.
    """

    type: RopeScalingType
    factor: PositiveFloat
    original_max_position_embeddings: PositiveInt
    low_freq_factor: PositiveFloat = 1.0
    high_freq_factor: PositiveFloat = 4.0
    beta_fast: PositiveFloat = 32.0
    beta_slow: PositiveFloat = 1.0
    mscale: NonNegativeFloat = 1.0
    mscale_all_dim: NonNegativeFloat = 0.0

    @model_validator(mode="after")
    def check_fields_belong_to_type(self) -> RopeScalingConfig:
        for other, fields in ROPE_SCALING_FIELDS.items():
            for name in fields if other != self.type else ():
                refuse_unused(
                    self,
                    name,
                    why=f"only {other} scaling reads it, and type is {self.type}",
                    fix=f"remove {name}, or set type: {other} if the checkpoint's config.json "
                    f"says rope_type {other}",
                )
        return self


def rope_fields_unread(kind: str) -> frozenset[str]:
    """The RopeScalingConfig fields that scaling of type `kind` never reads (other types')."""
    return frozenset(f for k, fields in ROPE_SCALING_FIELDS.items() if k != kind for f in fields)


class ModelConfig(Section):
    """Everything the planner and the trainers need to know about a model.

    Field names follow megatron-core where one exists; `rlpost.config.hf_fields` maps each to
    the HF config.json key it must agree with.
    """

    name: str
    description: str = ""
    family: Family
    hf_architecture: str
    num_layers: PositiveInt
    hidden_size: PositiveInt
    ffn_hidden_size: PositiveInt
    num_attention_heads: PositiveInt
    num_query_groups: PositiveInt
    kv_channels: PositiveInt | None = None
    vocab_size: PositiveInt
    make_vocab_size_divisible_by: PositiveInt = Field(
        128,
        description="Megatron pads the embedding and output rows to a multiple of this x TP "
        "(its default 128): a torch_dist checkpoint holds the padded rows, so this must be "
        "what the checkpoint was saved with",
    )
    max_position_embeddings: PositiveInt
    rotary_base: PositiveFloat = 10000.0
    rotary_percent: PositiveFloat = 1.0
    rotary_interleaved: bool = False
    rope_scaling: RopeScalingConfig | None = None
    norm_epsilon: PositiveFloat = 1e-6
    qk_layernorm: bool = False
    add_qkv_bias: bool = False
    add_bias_linear: bool = False
    post_self_attn_layernorm: bool = False
    post_mlp_layernorm: bool = False
    sliding_window: PositiveInt | None = Field(
        None,
        description="a generic model's attention window where narrower than the context "
        "(Mistral 7B v0.1, Phi-3): the trainers attend over the whole sample, so every "
        "sample must fit in the window, where windowed attention is full attention",
    )
    tie_word_embeddings: bool = False
    activation: Literal["swiglu", "geglu", "gelu"] = Field(
        "swiglu",
        description="swiglu and geglu MLPs are gated (gate, up and down projections; SiLU or "
        "GELU on the gate), gelu ones are not (two projections)",
    )
    moe: MoEConfig | None = None
    mla: MLAConfig | None = None
    mtp_num_layers: NonNegativeInt = 0
    params_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"

    hf_checkpoint: LocalPath = Field(
        description="the HF folder: architecture, tokenizer, the engines' first weights, and "
        "the policy's unless `load` names others"
    )
    ref_load: LocalPath | None = Field(
        None,
        description="the frozen reference for KL terms: an HF folder (both trainers) or a "
        "torch_dist checkpoint (megatron); read only when the recipe reads the KL",
    )
    load: LocalPath | None = Field(
        None,
        description="the policy's initial weights when not hf_checkpoint's: an HF folder of "
        "the same architecture (both trainers) or a torch_dist checkpoint (megatron); the "
        "engines are sent them before the first rollout. Resuming a run is run.resume",
    )
    save: str | None = Field(
        None,
        description="not used: checkpoints go to <run.dir>/ckpt (recipe.save); kept only to "
        "refuse it with the reason",
    )

    @model_validator(mode="after")
    def check_save_unset(self) -> ModelConfig:
        if self.save is not None:
            raise InvariantError(
                f"save={self.save!r} has no effect: rlpost writes checkpoints under "
                "<run.dir>/ckpt (recipe.save.interval, keep_last) and HF exports under "
                "<run.dir>/hf; mode=slime_args exports slime's --load/--save from run.dir",
                fields=("save",),
                fix="remove model.save, and set run.dir to choose where the run writes",
            )
        return self

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def megatron_kv_channels(self) -> int | None:
        """Megatron's kv_channels: the model's, else for multi-latent attention the V head
        size (MLA reads its own head dims; Megatron's validate_args derives hidden / heads
        otherwise, and refuses sizes that do not divide, as GLM-4.7-Flash's 2048 / 20)."""
        if self.kv_channels:
            return self.kv_channels
        return self.mla.v_head_dim if self.mla is not None else None

    @model_validator(mode="after")
    def check_sliding_window_is_generic(self) -> ModelConfig:
        if self.sliding_window is not None and self.family != GENERIC_FAMILY:
            raise InvariantError(
                f"sliding_window={self.sliding_window} with family {self.family}: "
                "megatron-core's specs for the named families attend over the whole sample",
                fields=("sliding_window",),
                fix="remove sliding_window, or set family: generic (the torch trainer builds "
                "the model with transformers)",
            )
        return self

    @model_validator(mode="after")
    def check_gated_gelu_is_generic(self) -> ModelConfig:
        if self.activation == "geglu" and self.family != GENERIC_FAMILY:
            raise InvariantError(
                f"activation=geglu with family {self.family}: megatron-core's specs for the "
                "named families build SwiGLU MLPs",
                fields=("activation",),
                fix="set family: generic (the torch trainer builds the model with "
                "transformers), or activation: swiglu if the checkpoint's MLP is SiLU-gated",
            )
        return self

    @model_validator(mode="after")
    def check_query_groups_divide_heads(self) -> ModelConfig:
        if self.num_attention_heads % self.num_query_groups:
            raise InvariantError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_query_groups={self.num_query_groups}; GQA shares each KV head among an "
                "equal number of query heads",
                fields=("num_query_groups",),
                fix="set num_query_groups to a divisor of num_attention_heads (the HF "
                "config's num_key_value_heads)",
            )
        return self

    @model_validator(mode="after")
    def check_dense_prefix_fits(self) -> ModelConfig:
        if self.moe and self.moe.first_k_dense_layers > self.num_layers:
            raise InvariantError(
                f"moe.first_k_dense_layers={self.moe.first_k_dense_layers} exceeds "
                f"num_layers={self.num_layers}",
                fields=("moe.first_k_dense_layers",),
                fix=f"set moe.first_k_dense_layers <= {self.num_layers} (the HF config's "
                "first_k_dense_replace)",
            )
        return self
