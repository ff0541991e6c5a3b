"""A tiny random Qwen3 with a word-level tokenizer, saved as a local HF folder."""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from rlpost.schema import AlgoConfig, OptimConfig, TrainConfig
from rlpost.types import TrainSample

VOCAB_SIZE = 64


def save_tiny_qwen3(
    path: Path, *, layers: int = 2, hidden: int = 64, seed: int = 0, tied: bool = True
) -> Path:
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=1024,
        tie_word_embeddings=tied,
    )
    Qwen3ForCausalLM(config).save_pretrained(path)
    _save_tokenizer(path)
    return path


def save_tiny_qwen3_moe(path: Path, *, layers: int = 2, hidden: int = 64, seed: int = 0) -> Path:
    """A random Qwen3-MoE: 4 experts of FFN 32, top-2, in every layer."""
    torch.manual_seed(seed)
    config = Qwen3MoeConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        moe_intermediate_size=hidden // 2,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    Qwen3MoeForCausalLM(config).save_pretrained(path)
    _save_tokenizer(path)
    return path


def _save_tokenizer(path: Path) -> None:
    vocab = {"<pad>": 0, "<eos>": 1} | {f"w{i}": i for i in range(2, VOCAB_SIZE)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>"
    )
    tokenizer.save_pretrained(path)


@pytest.fixture(autouse=True)
def no_process_group_left() -> Iterator[None]:
    """A one-rank trainer makes a one-rank process group in the test process; it goes with
    the test, so that ranks forked by later tests do not inherit it. So do the trainer's
    objects that still hold it from a reference cycle: collected here, where the group's gloo
    threads are; a forked rank that collected them would wait forever to join threads it does
    not have (~ProcessGroupGloo)."""
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_qwen3(tmp_path_factory.mktemp("tiny_qwen3"))


@pytest.fixture(scope="session")
def tiny_moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_qwen3_moe(tmp_path_factory.mktemp("tiny_qwen3_moe"))


def random_samples(
    count: int, *, seed: int = 0, min_len: int = 5, max_len: int = 24, with_rollout: bool = False
) -> list[TrainSample]:
    rng = random.Random(seed)
    samples = []
    for _ in range(count):
        length = rng.randint(min_len, max_len)
        response = rng.randint(1, length - 1)
        tokens = [rng.randrange(2, VOCAB_SIZE) for _ in range(length)]
        mask = [int(rng.random() > 0.2) for _ in range(response)]
        mask[-1] = 1
        rollout = [-rng.uniform(3.0, 5.0) for _ in range(response)] if with_rollout else None
        reward = rng.choice([-1.0, -0.5, 0.5, 1.0])
        samples.append(TrainSample(tokens, response, reward, rollout, mask))
    return samples


def random_groups(
    groups: int, per_group: int, *, seed: int = 0, with_rollout: bool = False
) -> list[TrainSample]:
    """GRPO-shaped: `per_group` samples of each of `groups` prompts, the groups interleaved
    (a micro-batch need not hold a group together)."""
    rng = random.Random(seed)
    prompts = [
        [rng.randrange(2, VOCAB_SIZE) for _ in range(rng.randint(1, 9))] for _ in range(groups)
    ]
    samples = []
    for _ in range(per_group):
        for prompt in prompts:
            n = rng.randint(1, 12)
            mask = [int(rng.random() > 0.2) for _ in range(n - 1)] + [1]
            rollout = [-rng.uniform(3.0, 5.0) for _ in range(n)] if with_rollout else None
            response = [rng.randrange(2, VOCAB_SIZE) for _ in range(n)]
            reward = rng.choice([-1.0, -0.5, 0.5, 1.0])
            samples.append(TrainSample(prompt + response, n, reward, rollout, mask))
    return samples


@pytest.fixture
def make_groups() -> Callable[..., list[TrainSample]]:
    return random_groups


@pytest.fixture
def make_samples() -> Callable[..., list[TrainSample]]:
    return random_samples


def configs(
    gbs: int, *, algo: dict | None = None, optim: dict | None = None, train: dict | None = None
) -> tuple[AlgoConfig, OptimConfig, TrainConfig]:
    return (
        AlgoConfig(**(algo or {})),
        OptimConfig(**({"lr": 1e-3, "clip_grad": 0.0} | (optim or {}))),
        TrainConfig(**({"global_batch_size": gbs} | (train or {}))),
    )


@pytest.fixture
def make_configs() -> Callable[..., tuple[AlgoConfig, OptimConfig, TrainConfig]]:
    return configs


def join_ranks(ranks: Any, what: str, timeout_s: float = 120.0) -> None:
    """Wait for forked ranks (`mp.start_processes(..., join=False)`); a deadline turns a
    hang into a failure naming `what`."""
    deadline = time.monotonic() + timeout_s
    while not ranks.join(timeout=1):
        if time.monotonic() > deadline:
            for process in ranks.processes:
                process.kill()
            pytest.fail(f"{what} did not finish in {timeout_s:g} s")
