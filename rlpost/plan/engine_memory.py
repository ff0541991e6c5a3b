"""Rollout-side memory: an engine GPU's weight shard, its KV cache and SGLang's fractions.

SGLang sizes memory with one knob, `mem_fraction_static`: the fraction of a GPU's memory for
the static pool, model weights plus KV cache. At start-up it measures free memory after
loading weights and keeps `total x (1 - mem_fraction_static)` for activations and CUDA graphs;
the rest becomes the KV cache (model_runner's profile_max_num_token). Hence, per GPU:

    kv_cache = mem_fraction_static x gpu - weight_shard - cuda_context

KV bytes per token (bf16 cache, all layers): 2 (K and V) x layers x kv_heads x head_dim x 2;
with multi-latent attention the cache holds the compressed latent and the shared RoPE key:
(kv_lora_rank + rope_head_dim) x layers x 2 (DeepSeek-V2, section 2.1.2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rlpost.backends.fp8_format import Fp8Error, Fp8Format, folder_format
from rlpost.plan.params import layer_params, mtp_layer_params
from rlpost.schema import HardwareConfig, ModelConfig, RecipeConfig, RunConfig

GIB = 1024**3
MIB_PER_GIB = 1024
CUDA_CONTEXT_GIB = 1.0
"""CUDA context, cuBLAS/NCCL workspaces of one process (about 0.5-1 GiB on H100)."""
TRAINER_RESIDUAL_GIB = 5e9 / GIB
"""Colocated: what Megatron keeps on a GPU after offloading; slime measured 3-5 GB."""
CPU_MEM_FRACTION = 0.9
"""CPU engines have no static pool; the nominal fraction of a device slot they may fill."""

_FP8_NAMES = ("fp8", "int8", "w8a8")


def _quantized_bytes(options: dict[str, Any]) -> float:
    quant = str(options.get("quantization") or "")
    return 1.0 if any(name in quant for name in _FP8_NAMES) else 2.0


def checkpoint_fp8(hf_checkpoint: str) -> Fp8Format | None:
    """The FP8 format of the checkpoint the engines serve, when its folder is here to read
    (config.json only); None for an unquantised or absent one (check_fp8_checkpoint refuses
    one that cannot be read)."""
    try:
        return folder_format(hf_checkpoint)
    except (Fp8Error, OSError, ValueError):
        return None


def engine_weight_bytes(
    model: ModelConfig,
    params: float,
    attention_tp: int,
    options: dict[str, Any],
    fp8: Fp8Format | None,
) -> float:
    """An engine GPU's weight bytes. From an FP8 checkpoint: one byte per parameter, plus a
    float32 scale per block of the linear weights, plus a second byte for the embedding and
    output head, which stay bf16 (rlpost.backends.fp8); norms and router gates are too
    small to count. Otherwise two bytes, or one under an FP8/INT8 `quantization` option."""
    if fp8 is None:
        return params * _quantized_bytes(options)
    block = fp8.block_size or (1, model.hidden_size)
    embeddings = model.vocab_size * model.hidden_size * (1 if model.tie_word_embeddings else 2)
    return params * (1 + 4 / (block[0] * block[1])) + embeddings / attention_tp


def _kv_dtype_bytes(options: dict[str, Any]) -> int:
    return 1 if str(options.get("kv_cache_dtype", "auto")).startswith("fp8") else 2


def speculative(options: dict[str, Any]) -> bool:
    """EAGLE/MTP drafts load the model's MTP layers and add their KV cache."""
    return options.get("speculative_algorithm") not in (None, "", "NGRAM")


def kv_bytes_per_token(model: ModelConfig, layers: int | None = None, dtype_bytes: int = 2) -> int:
    """KV-cache bytes one token takes in the whole model (one replica, no sharding)."""
    layers = model.num_layers if layers is None else layers
    if model.mla is not None:
        return (model.mla.kv_lora_rank + model.mla.qk_pos_emb_head_dim) * layers * dtype_bytes
    return 2 * layers * model.num_query_groups * model.head_dim * dtype_bytes


def kv_bytes_per_token_per_gpu(
    model: ModelConfig, attention_tp: int, options: dict[str, Any]
) -> int:
    """KV heads split over the attention-TP group, replicated when there are fewer heads than
    ranks; the MLA latent is not split (every rank keeps the whole latent)."""
    layers = model.num_layers + (model.mtp_num_layers if speculative(options) else 0)
    full = kv_bytes_per_token(model, layers, _kv_dtype_bytes(options))
    if model.mla is not None:
        return full
    heads_per_gpu = max(1, math.ceil(model.num_query_groups / attention_tp))
    return full * heads_per_gpu // model.num_query_groups


def engine_params_per_gpu(
    model: ModelConfig, gpus_per_engine: int, attention_tp: int, options: dict[str, Any]
) -> float:
    """Parameters one engine GPU loads.

    Attention (and norms, routers) split over the attention-TP group; routed and shared experts
    over the whole engine (EP x MoE-TP = tp_size), with redundant expert copies added; dense
    MLPs over `moe_dense_tp_size` when set; the embedding is replicated under dp-attention, the
    LM head split over the attention group with `enable_dp_lm_head`; MTP layers only when a
    speculative algorithm drafts with them.
    """
    dp_attention = bool(options.get("enable_dp_attention"))
    dense_mlp_tp = options.get("moe_dense_tp_size") or gpus_per_engine
    if model.moe is None:
        dense_mlp_tp = attention_tp
    redundancy = 1.0
    if model.moe is not None:
        redundancy += options.get("ep_num_redundant_experts", 0) / model.moe.num_experts
    blocks = [layer_params(model, i) for i in range(model.num_layers)]
    if speculative(options):
        blocks += [mtp_layer_params(model) for _ in range(model.mtp_num_layers)]
    params = 0.0
    for block in blocks:
        params += (block.attention + block.norms + block.router) / attention_tp
        params += block.mlp / dense_mlp_tp
        params += (block.shared_experts + block.experts * redundancy) / gpus_per_engine
    vocab = model.vocab_size * model.hidden_size
    params += vocab / (1 if dp_attention else gpus_per_engine)
    if not model.tie_word_embeddings:
        head_tp = attention_tp if options.get("enable_dp_lm_head") else gpus_per_engine
        params += vocab / head_tp
    return params


def _graph_defaults(gpu_mib: float, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, cuda_graph_max_bs) SGLang picks by GPU memory capacity."""
    small_tp = tp < 4
    if gpu_mib < 20 * 1024:
        return 2048, 8
    if gpu_mib < 35 * 1024:
        return 2048, 24 if small_tp else 80
    if gpu_mib < 60 * 1024:
        return 4096, 32 if small_tp else 160
    if gpu_mib < 160 * 1024:
        return 8192, 256 if small_tp else 512
    return 16384, 512


def _graph_settings(gpu_mib: float, tp: int, options: dict[str, Any]) -> tuple[int, int]:
    chunked, graph_bs = _graph_defaults(gpu_mib, tp)
    chunked = int(options.get("chunked_prefill_size") or chunked)
    if chunked <= 0:
        chunked = int(options.get("max_prefill_tokens") or 16384)
    # SGLang 0.5.2x splits the graph settings into decode and prefill ones
    for name in ("cuda_graph_bs", "cuda_graph_bs_decode"):
        if options.get(name):
            graph_bs = max(int(b) for b in options[name])
    for name in ("cuda_graph_max_bs", "cuda_graph_max_bs_decode"):
        graph_bs = int(options.get(name) or graph_bs)
    return chunked, graph_bs


def activation_reserve_gib(
    hardware: HardwareConfig, gpus_per_engine: int, options: dict[str, Any]
) -> float:
    """Memory SGLang needs outside its static pool: prefill activations and CUDA graphs.

    SGLang's own estimate (server_args._handle_gpu_memory_settings, v0.5): 512 MiB of
    metadata, 1.5 MiB per chunked-prefill token, 2 MiB per CUDA-graph batch size, 2 GiB for an
    EAGLE draft. Its parallel-size padding terms are left out: they are safety margin, and the
    seeds' colocated runs fit without them.
    """
    if hardware.kind == "cpu":
        return 0.0
    gpu_mib = hardware.gpu_memory_gib * MIB_PER_GIB
    chunked, graph_bs = _graph_settings(gpu_mib, gpus_per_engine, options)
    reserve_mib = 512 + max(chunked, 2048) * 1.5 + graph_bs * 2
    if speculative(options):
        reserve_mib += 2048
    return reserve_mib / MIB_PER_GIB


def default_mem_fraction(
    hardware: HardwareConfig,
    gpus_per_engine: int,
    dp_size: int,
    options: dict[str, Any],
    colocate: bool,
) -> float:
    """SGLang's default `mem_fraction_static`, less the trainer's residue when colocated.

    SGLang (server_args._handle_gpu_memory_settings): reserve 512 MiB + 1.5 MiB per
    chunked-prefill token + 2 MiB per CUDA-graph batch size + tp/8 GiB, plus dp-attention
    padding (3 MiB per graph batch per DP rank, 1.5 more above 300), at least 10 GiB on GPUs
    over 60 GiB; fraction = (gpu - reserve) / gpu. SGLang cannot see that a colocated trainer
    keeps some memory while the engines run, so that residue comes off as well.
    """
    if hardware.kind == "cpu":
        return CPU_MEM_FRACTION
    gpu_mib = hardware.gpu_memory_gib * MIB_PER_GIB
    chunked, graph_bs = _graph_settings(gpu_mib, gpus_per_engine, options)
    reserve = 512 + max(chunked, 2048) * 1.5 + graph_bs * 2 + gpus_per_engine / 8 * 1024
    if options.get("enable_dp_attention"):
        reserve += graph_bs * dp_size * 3
        if graph_bs > 300:
            reserve += graph_bs * dp_size * 1.5
    if gpu_mib > 60 * 1024:
        reserve = max(reserve, 10 * 1024)
    if speculative(options):
        reserve += 2048
    if colocate:
        reserve += TRAINER_RESIDUAL_GIB * MIB_PER_GIB
    return round((gpu_mib - reserve) / gpu_mib, 3)


@dataclass(frozen=True)
class RolloutMemory:
    """One engine GPU during generation (colocated: with the trainer's residue beside it)."""

    mem_fraction_static: float
    params_per_gpu: float
    weights_gib: float
    context_gib: float
    kv_cache_gib: float
    kv_bytes_per_token_per_gpu: int
    kv_cache_tokens_per_gpu: int
    kv_cache_tokens_per_engine: int
    activation_reserve_gib: float
    trainer_residual_gib: float
    total_gib: float
    longest_sample_tokens: int  # the longest request an engine takes (longest_request)
    longest_sample_keys: tuple[str, str]  # what bounds it: its response's key, its prompt's

    @property
    def holds_one_sample(self) -> bool:
        return self.kv_cache_tokens_per_gpu >= self.longest_sample_tokens


def longest_sample_tokens(recipe: RecipeConfig) -> int:
    """Prompt + response; an unset max_prompt_len counts as 0 (the plan says so)."""
    return (recipe.data.max_prompt_len or 0) + recipe.rollout.max_response_len


@dataclass(frozen=True)
class EngineRequest:
    """The longest request (prompt + response) an engine takes, with the keys that bound it:
    its response length's and its prompt's (an unset prompt bound counts as 0)."""

    tokens: int
    response_key: str
    prompt_key: str


def longest_request(cfg: RunConfig) -> EngineRequest:
    """The longest request the engines must hold: training's sample or an evaluation set's
    request, whichever is longer; in mode=eval, an evaluation set's alone, since nothing
    else is generated (training's lengths bound nothing it sends)."""
    recipe = cfg.recipe
    trained = EngineRequest(
        longest_sample_tokens(recipe),
        "recipe.rollout.max_response_len",
        "recipe.data.max_prompt_len",
    )
    evaluated = [
        EngineRequest(tokens, f"recipe.{key}", "recipe.eval.max_prompt_len")
        for key, tokens in recipe.eval_set_requests()
    ]
    found = evaluated if cfg.mode == "eval" and evaluated else [trained, *evaluated]
    return max(found, key=lambda request: request.tokens)  # training's first on a tie


def estimate_rollout(
    model: ModelConfig,
    request: EngineRequest,
    hardware: HardwareConfig,
    gpus_per_engine: int,
    dp_size: int,
    mem_fraction_static: float,
    options: dict[str, Any],
    colocate: bool,
    fp8: Fp8Format | None = None,
) -> RolloutMemory:
    """Weight shard, KV cache left under the static fraction, and the peak per engine GPU,
    which must hold `request` (longest_request) at least. `fp8`: the engines serve an FP8
    checkpoint of that format (engine_weight_bytes)."""
    on_gpu = hardware.kind == "gpu"
    attention_tp = max(1, gpus_per_engine // dp_size)
    params = engine_params_per_gpu(model, gpus_per_engine, attention_tp, options)
    weights_gib = engine_weight_bytes(model, params, attention_tp, options, fp8) / GIB
    context_gib = CUDA_CONTEXT_GIB if on_gpu else 0.0
    static_gib = mem_fraction_static * hardware.gpu_memory_gib
    kv_gib = static_gib - weights_gib - context_gib
    per_token = kv_bytes_per_token_per_gpu(model, attention_tp, options)
    tokens_per_gpu = max(0, int(kv_gib * GIB // per_token))
    residual = TRAINER_RESIDUAL_GIB if colocate and on_gpu else 0.0
    reserve = activation_reserve_gib(hardware, gpus_per_engine, options)
    return RolloutMemory(
        mem_fraction_static=mem_fraction_static,
        params_per_gpu=params,
        weights_gib=weights_gib,
        context_gib=context_gib,
        kv_cache_gib=kv_gib,
        kv_bytes_per_token_per_gpu=per_token,
        kv_cache_tokens_per_gpu=tokens_per_gpu,
        kv_cache_tokens_per_engine=tokens_per_gpu * dp_size,
        activation_reserve_gib=reserve,
        trainer_residual_gib=residual,
        total_gib=max(static_gib, weights_gib + context_gib) + residual + reserve,
        longest_sample_tokens=request.tokens,
        longest_sample_keys=(request.response_key, request.prompt_key),
    )
