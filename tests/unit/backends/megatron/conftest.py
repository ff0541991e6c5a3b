"""Shared pieces of the Megatron backend tests: tiny random HF checkpoints of each
architecture with the model YAML (ModelConfig) describing each, rollouts, and a launcher that
runs a function on N forked ranks (gloo on CPU).

Every megatron-core process group lives in a forked child, never in the pytest process, so
tests can use any layout in any order. fork, not spawn: children reuse the parent's imports
(megatron-core costs seconds per process to import on two cores).
"""

from __future__ import annotations

import os
import random
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from transformers import (
    Glm4Config,
    Glm4ForCausalLM,
    Glm4MoeConfig,
    Glm4MoeForCausalLM,
    Glm4MoeLiteConfig,
    Glm4MoeLiteForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from rlpost.plan.layout import ParallelLayout
from rlpost.schema import AlgoConfig, ModelConfig, OptimConfig, TrainConfig
from rlpost.types import TrainSample

RANK_TIMEOUT_S = 180.0

# ---- tiny random HF checkpoints of each architecture, and their model YAML --------------

VOCAB = 96
HALF_ROTARY = {"rope_theta": 10000.0, "partial_rotary_factor": 0.5, "rope_type": "default"}
HIDDEN = 64


def _model_config(path: Path, **fields: Any) -> ModelConfig:
    base: dict[str, Any] = {
        "name": path.name,
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "max_position_embeddings": 256,
        "params_dtype": "fp32",
        "hf_checkpoint": str(path),
    }
    return ModelConfig(**(base | fields))


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


def qwen3(path: Path, *, tied: bool = True, layers: int = 2, seed: int = 0) -> ModelConfig:
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rope_theta=1000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tied,
    )
    _save(Qwen3ForCausalLM(config), path, seed)
    return _model_config(
        path,
        family="qwen3",
        hf_architecture="Qwen3ForCausalLM",
        num_layers=layers,
        ffn_hidden_size=128,
        num_attention_heads=4,
        num_query_groups=2,
        kv_channels=16,
        rotary_base=1000.0,
        norm_epsilon=1e-6,
        qk_layernorm=True,
        tie_word_embeddings=tied,
    )


def glm4(path: Path, *, layers: int = 2, seed: int = 0) -> ModelConfig:
    config = Glm4Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=96,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rope_parameters={
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "rope_type": "default",
        },
        rms_norm_eps=1e-5,
        attention_bias=True,
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=1,
    )
    _save(Glm4ForCausalLM(config), path, seed)
    return _model_config(
        path,
        family="glm4",
        hf_architecture="Glm4ForCausalLM",
        num_layers=layers,
        ffn_hidden_size=96,
        num_attention_heads=4,
        num_query_groups=2,
        kv_channels=16,
        rotary_base=10000.0,
        rotary_percent=0.5,
        rotary_interleaved=True,
        norm_epsilon=1e-5,
        add_qkv_bias=True,
        post_self_attn_layernorm=True,
        post_mlp_layernorm=True,
    )


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


def glm4_moe(path: Path, *, layers: int = 2, seed: int = 0) -> ModelConfig:
    config = Glm4MoeConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rope_parameters={
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "rope_type": "default",
        },
        rms_norm_eps=1e-5,
        attention_bias=True,
        use_qk_norm=True,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        first_k_dense_replace=1,
        routed_scaling_factor=2.5,
        num_nextn_predict_layers=0,
        tie_word_embeddings=False,
    )
    _save(Glm4MoeForCausalLM(config), path, seed)
    return _model_config(
        path,
        family="glm4_moe",
        hf_architecture="Glm4MoeForCausalLM",
        num_layers=layers,
        ffn_hidden_size=96,
        num_attention_heads=4,
        num_query_groups=2,
        kv_channels=16,
        rotary_base=10000.0,
        rotary_percent=0.5,
        norm_epsilon=1e-5,
        qk_layernorm=True,
        add_qkv_bias=True,
        moe=MOE_FIELDS,
    )


def glm4_moe_lite(path: Path, *, layers: int = 2, seed: int = 0) -> ModelConfig:
    config = Glm4MoeLiteConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=24,
        kv_lora_rank=16,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=12,
        max_position_embeddings=256,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
        rms_norm_eps=1e-5,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        routed_scaling_factor=1.8,
        mlp_layer_types=["dense"] + ["sparse"] * (layers - 1),
        tie_word_embeddings=False,
    )
    _save(Glm4MoeLiteForCausalLM(config), path, seed)
    return _model_config(
        path,
        family="glm4_moe_lite",
        hf_architecture="Glm4MoeLiteForCausalLM",
        num_layers=layers,
        ffn_hidden_size=96,
        num_attention_heads=4,
        num_query_groups=4,
        rotary_base=10000.0,
        norm_epsilon=1e-5,
        qk_layernorm=True,
        mla={
            "q_lora_rank": 24,
            "kv_lora_rank": 16,
            "qk_head_dim": 16,
            "qk_pos_emb_head_dim": 8,
            "v_head_dim": 12,
        },
        moe=MOE_FIELDS | {"router_topk_scaling_factor": 1.8},
    )


def qwen3_untied(path: Path, *, layers: int = 2, seed: int = 0) -> ModelConfig:
    return qwen3(path, tied=False, layers=layers, seed=seed)


ARCHITECTURES: dict[str, Callable[..., ModelConfig]] = {
    "qwen3": qwen3,
    "qwen3_untied": qwen3_untied,
    "glm4": glm4,
    "glm4_moe": glm4_moe,
    "glm4_moe_lite": glm4_moe_lite,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(
    rank: int, fn: Callable[..., Any], world: int, port: int, out: str, args: tuple[Any, ...]
) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    if torch.distributed.is_initialized():
        raise RuntimeError(
            "the pytest process holds a torch.distributed group, which forked ranks inherit; "
            "a test that initialises one must do so in a child process"
        )
    torch.save(fn(rank, world, port, *args), Path(out) / f"rank{rank}.pt")


def run_world(fn: Callable[..., Any], world: int, *args: Any) -> list[Any]:
    """fn(rank, world_size, master_port, *args) on `world` forked ranks; their return values."""
    with tempfile.TemporaryDirectory() as out:
        ranks = mp.start_processes(
            _rank_main,
            args=(fn, world, free_port(), out, args),
            nprocs=world,
            join=False,
            start_method="fork",
        )
        deadline = time.monotonic() + RANK_TIMEOUT_S
        while not ranks.join(timeout=1):
            if time.monotonic() > deadline:
                for process in ranks.processes:
                    process.kill()
                pytest.fail(f"{world} ranks did not finish in {RANK_TIMEOUT_S:.0f} s")
        return [torch.load(Path(out) / f"rank{r}.pt", weights_only=False) for r in range(world)]


def layout(**sizes: Any) -> ParallelLayout:
    """A ParallelLayout of all ones unless given; world = tp x pp x cp x dp."""
    base: dict[str, Any] = {
        "tp": 1,
        "pp": 1,
        "cp": 1,
        "ep": 1,
        "etp": 1,
        "dp": 1,
        "sequence_parallel": False,
        "recompute": "none",
        "recompute_method": "uniform",
        "recompute_num_layers": 1,
        "distributed_optimizer": True,
    }
    return ParallelLayout(**(base | sizes))


def rollout(count: int, *, seed: int = 0, min_len: int = 5, max_len: int = 24) -> list[TrainSample]:
    """Random token rollouts with masks, rewards and engine logprobs."""
    rng = random.Random(seed)
    samples = []
    for _ in range(count):
        length = rng.randint(min_len, max_len)
        response = rng.randint(1, length - 1)
        tokens = [rng.randrange(2, VOCAB) for _ in range(length)]
        mask = [int(rng.random() > 0.2) for _ in range(response)]
        mask[-1] = 1
        logprobs = [-rng.uniform(3.0, 5.0) for _ in range(response)]
        reward = rng.choice([-1.0, -0.5, 0.5, 1.0])
        samples.append(TrainSample(tokens, response, reward, logprobs, mask))
    return samples


Configs = tuple[AlgoConfig, OptimConfig, TrainConfig]


def configs(
    gbs: int = 8, *, algo: dict | None = None, optim: dict | None = None, train: dict | None = None
) -> Configs:
    return (
        AlgoConfig(**({"loss_reduction": "token_mean"} | (algo or {}))),
        OptimConfig(**({"lr": 1e-3, "adam_eps": 1e-4, "clip_grad": 1.0} | (optim or {}))),
        TrainConfig(
            **(
                {"global_batch_size": gbs, "use_dynamic_batch_size": True, "max_tokens_per_gpu": 48}
                | (train or {})
            )
        ),
    )


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], ModelConfig]:
    """Architecture name -> the ModelConfig of a tiny random HF checkpoint (built once)."""
    root = tmp_path_factory.mktemp("megatron_tiny")
    built: dict[str, ModelConfig] = {}

    def get(arch: str) -> ModelConfig:
        if arch not in built:
            built[arch] = ARCHITECTURES[arch](root / arch)
        return built[arch]

    return get


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture
def world() -> Callable[..., list[Any]]:
    return run_world


@pytest.fixture
def make_layout() -> Callable[..., ParallelLayout]:
    return layout


@pytest.fixture
def make_rollout() -> Callable[..., list[TrainSample]]:
    return rollout


@pytest.fixture
def make_configs() -> Callable[..., Configs]:
    return configs
