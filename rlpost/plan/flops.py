"""Model FLOPs and MFU: the one definition the cost model, the benchmark and every run's
`perf/mfu` use.

A forward pass over a sample of s tokens costs, per token, 2 N + 4 L a s FLOPs (PaLM,
Chowdhery et al. 2022, appendix B; Narayanan et al. 2021, section 5.1): N the parameters the
token goes through in matmuls (the decoder layers' active parameters, MoE experts at top_k,
plus the V x h output projection, a matmul even when tied to the embedding, which is a
lookup), L layers, a the attention width (heads x head_dim: 2048 for Qwen3-0.6B on a hidden
size of 1024; for multi-latent attention the mean of the query-key and value widths), and the
4 L a s of the score and value matmuls over the whole sample (not halved for causality).
A training step costs 3 forwards (the backward is two); each no-grad forward a rollout runs
(the old policy's logprobs, the reference model's) adds one. Recompute is not model work:
MFU counts it nowhere, and what it costs shows as a lower MFU. MTP layers are not counted.

MFU = model FLOPs / (seconds x GPUs x the hardware profile's `peak_bf16_tflops`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from rlpost.plan.params import count_params
from rlpost.schema import ModelConfig

TRAIN_FORWARDS = 3.0
"""Forward-equivalents of a training forward and its backward."""


def matmul_params(model: ModelConfig) -> int:
    """Parameters a token meets in matmuls: the decoder layers' active ones and the output
    projection (the input embedding is a lookup; norms are counted, they are few)."""
    params = count_params(model)
    layers_active = params.active - params.embedding - params.output - model.hidden_size
    return layers_active + model.vocab_size * model.hidden_size


def attention_width(model: ModelConfig) -> float:
    """The `a` of 4 L a s: heads x head_dim, or heads x the mean of the query-key and value
    head widths for multi-latent attention."""
    if model.mla is not None:
        mla = model.mla
        qk = mla.qk_head_dim + mla.qk_pos_emb_head_dim
        return model.num_attention_heads * (qk + mla.v_head_dim) / 2
    return float(model.num_attention_heads * model.head_dim)


@dataclass(frozen=True)
class ForwardFlops:
    """A forward's FLOPs per token of a sample of s tokens: `matmul` + `attention` x s."""

    matmul: float  # 2 N
    attention: float  # 4 L a

    def per_token(self, seq_len: int) -> float:
        return self.matmul + self.attention * seq_len

    def over(self, lengths: Iterable[int], forwards: float) -> float:
        """`forwards` forward passes over samples of these lengths."""
        return forwards * sum(s * self.per_token(s) for s in lengths)


@lru_cache(maxsize=64)
def forward_flops(model: ModelConfig) -> ForwardFlops:
    """Cached: the layout search plans thousands of grids of one model."""
    return ForwardFlops(
        matmul=2.0 * matmul_params(model),
        attention=4.0 * model.num_layers * attention_width(model),
    )


def mfu(flops: float, seconds: float, gpus: int, peak_tflops: float) -> float:
    """Model FLOPs utilisation of `gpus` GPUs that did `flops` of model work in `seconds`."""
    return flops / (seconds * gpus * peak_tflops * 1e12)
