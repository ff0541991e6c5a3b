"""Parameter counts from a model's architecture, split the way parallelism shards them.

Counts follow the module layout of megatron-core's GPT model (and the HF checkpoints it mirrors):
per layer an input norm, attention (GQA or multi-latent), a pre-MLP norm and either a dense MLP
or a mixture of experts (router, routed experts, shared experts); an embedding, a final norm and
an output head (absent when tied to the embedding); each multi-token-prediction (MTP) layer adds
two norms, a 2h -> h projection, one more transformer layer and a norm, sharing embedding and
head. Biases are counted where the model has them; router expert biases are buffers, not
parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from rlpost.schema import ModelConfig


@dataclass(frozen=True)
class LayerParams:
    """One transformer layer: `dense` is sharded by tensor parallelism, `experts` by EP x ETP."""

    attention: int
    mlp: int
    shared_experts: int
    router: int
    experts: int
    norms: int

    @property
    def dense(self) -> int:
        """Everything but the routed experts (replicated across EP, split by TP)."""
        return self.attention + self.mlp + self.shared_experts + self.router + self.norms

    @property
    def total(self) -> int:
        return self.dense + self.experts


@dataclass(frozen=True)
class ParamCount:
    """Whole-model totals, in parameters."""

    total: int
    active: int
    embedding: int
    output: int
    layers: int
    experts: int
    mtp: int

    @property
    def dense(self) -> int:
        return self.total - self.experts


GATED_ACTIVATIONS = ("swiglu", "geglu")


def mlp_params(model: ModelConfig, ffn_hidden_size: int) -> int:
    """Gated (SwiGLU, GeGLU) MLPs have gate, up and down projections; GELU ones have two."""
    gated = model.activation in GATED_ACTIVATIONS
    weights = (3 if gated else 2) * model.hidden_size * ffn_hidden_size
    if not model.add_bias_linear:
        return weights
    fc1_out = ffn_hidden_size * (2 if gated else 1)
    return weights + fc1_out + model.hidden_size


def attention_params(model: ModelConfig) -> int:
    """Query/key/value and output projections (plus QK norms and biases)."""
    if model.mla is not None:
        return _mla_params(model)
    h, heads, groups, hd = (
        model.hidden_size,
        model.num_attention_heads,
        model.num_query_groups,
        model.head_dim,
    )
    qkv_out = (heads + 2 * groups) * hd
    params = h * qkv_out + heads * hd * h
    if model.add_qkv_bias or model.add_bias_linear:
        params += qkv_out
    if model.add_bias_linear:
        params += h
    if model.qk_layernorm:
        params += 2 * hd
    return params


def _mla_params(model: ModelConfig) -> int:
    """Multi-latent attention: low-rank query and joint key-value projections (DeepSeek-V2)."""
    assert model.mla is not None
    mla, h, heads = model.mla, model.hidden_size, model.num_attention_heads
    q_head = mla.qk_head_dim + mla.qk_pos_emb_head_dim
    if mla.q_lora_rank:
        q = h * mla.q_lora_rank + mla.q_lora_rank + mla.q_lora_rank * heads * q_head
    else:
        q = h * heads * q_head
    kv_down = h * (mla.kv_lora_rank + mla.qk_pos_emb_head_dim) + mla.kv_lora_rank
    kv_up = mla.kv_lora_rank * heads * (mla.qk_head_dim + mla.v_head_dim)
    out = heads * mla.v_head_dim * h
    return q + kv_down + kv_up + out


def is_moe_layer(model: ModelConfig, index: int) -> bool:
    return model.moe is not None and index >= model.moe.first_k_dense_layers


@lru_cache(maxsize=4096)
def layer_params(model: ModelConfig, index: int) -> LayerParams:
    """Parameters of layer `index` (0-based); MTP layers use index >= num_layers."""
    h = model.hidden_size
    norms = 2 * h + (h if model.post_self_attn_layernorm else 0)
    norms += h if model.post_mlp_layernorm else 0
    attention = attention_params(model)
    moe = model.moe
    if moe is None or not is_moe_layer(model, index):
        return LayerParams(attention, mlp_params(model, model.ffn_hidden_size), 0, 0, 0, norms)
    shared_ffn = moe.shared_expert_ffn_hidden_size or moe.num_shared_experts * (
        moe.expert_ffn_hidden_size
    )
    return LayerParams(
        attention=attention,
        mlp=0,
        shared_experts=mlp_params(model, shared_ffn) if shared_ffn else 0,
        router=moe.num_experts * h,
        experts=moe.num_experts * mlp_params(model, moe.expert_ffn_hidden_size),
        norms=norms,
    )


def mtp_layer_params(model: ModelConfig) -> LayerParams:
    """One MTP block: its transformer layer plus enorm, hnorm, the 2h->h projection, a norm."""
    inner = layer_params(model, model.num_layers)
    h = model.hidden_size
    extra = 3 * h + 2 * h * h
    return LayerParams(
        inner.attention,
        inner.mlp,
        inner.shared_experts,
        inner.router,
        inner.experts,
        inner.norms + extra,
    )


def count_params(model: ModelConfig) -> ParamCount:
    """Total and per-token active parameters, MTP layers included."""
    embedding = model.vocab_size * model.hidden_size
    output = 0 if model.tie_word_embeddings else embedding
    layers = [layer_params(model, i) for i in range(model.num_layers)]
    mtp = [mtp_layer_params(model) for _ in range(model.mtp_num_layers)]
    blocks = layers + mtp
    experts = sum(layer.experts for layer in blocks)
    layer_total = sum(layer.total for layer in layers)
    mtp_total = sum(layer.total for layer in mtp)
    total = embedding + output + model.hidden_size + layer_total + mtp_total
    inactive = 0
    if model.moe is not None:
        unused = 1 - model.moe.top_k / model.moe.num_experts
        inactive = round(sum(layer.experts for layer in layers) * unused)
    return ParamCount(
        total=total,
        active=total - mtp_total - inactive,
        embedding=embedding,
        output=output,
        layers=layer_total,
        experts=experts,
        mtp=mtp_total,
    )


def stage_layers(
    num_layers: int, pp: int, first: int | None = None, last: int | None = None
) -> tuple[int, ...] | None:
    """Layers per pipeline stage (megatron-core's rule), or None when they do not split evenly.

    With `first`/`last` set (uneven pipelining) those stages take that many layers and the
    rest divide evenly over the middle stages.
    """
    if pp == 1:
        return (num_layers,)
    head = [first] if first is not None else []
    tail = [last] if last is not None else []
    middle_stages = pp - len(head) - len(tail)
    middle_layers = num_layers - sum(head) - sum(tail)
    if middle_stages == 0:
        return tuple(head + tail) if middle_layers == 0 else None
    if middle_layers <= 0 or middle_layers % middle_stages:
        return None
    return tuple(head + [middle_layers // middle_stages] * middle_stages + tail)


@dataclass(frozen=True)
class StageParams:
    """Parameters one pipeline stage holds before TP/EP sharding."""

    dense: int
    experts: int
    first_layer: int
    num_layers: int


@lru_cache(maxsize=1024)
def params_per_stage(
    model: ModelConfig, layers_per_stage: tuple[int, ...]
) -> tuple[StageParams, ...]:
    """Embedding on the first stage; final norm, output head and MTP layers on the last.
    Cached: the layout search sizes thousands of grids with the same few stage splits."""
    stages: list[StageParams] = []
    start = 0
    last = len(layers_per_stage) - 1
    for stage, count in enumerate(layers_per_stage):
        blocks = [layer_params(model, i) for i in range(start, start + count)]
        dense = sum(b.dense for b in blocks)
        experts = sum(b.experts for b in blocks)
        if stage == 0:
            dense += model.vocab_size * model.hidden_size
        if stage == last:
            mtp = [mtp_layer_params(model) for _ in range(model.mtp_num_layers)]
            dense += model.hidden_size + sum(b.dense for b in mtp)
            experts += sum(b.experts for b in mtp)
            if not model.tie_word_embeddings or len(layers_per_stage) > 1:
                # a tied head on another stage keeps its own copy, synced by all-reduce
                dense += model.vocab_size * model.hidden_size
        stages.append(StageParams(dense, experts, start, count))
        start += count
    return tuple(stages)
