"""Vocabulary-parallel logprobs: the chunked, memory-lean path gives log_softmax's values and
gradients, with the vocabulary split over TP ranks and padded beyond the real vocabulary."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from rlpost.backends.megatron import logits as logits_module
from rlpost.backends.megatron.config import ParallelSizes
from rlpost.backends.megatron.distributed import ProcessPlace, destroy_parallel, init_parallel

TOKENS, PADDED_VOCAB, TRUE_VOCAB, TEMPERATURE = 37, 48, 45, 0.7


def reference(seed: int) -> dict[str, torch.Tensor]:
    """Plain autograd over the whole (unpadded) vocabulary."""
    gen = torch.Generator().manual_seed(seed)
    full = torch.randn(TOKENS, PADDED_VOCAB, generator=gen, dtype=torch.float64) * 3
    targets = torch.randint(0, TRUE_VOCAB, (TOKENS,), generator=gen)
    upstream = torch.randn(TOKENS, generator=gen, dtype=torch.float64)
    x = full.clone().requires_grad_(True)
    log_probs = torch.log_softmax(x[:, :TRUE_VOCAB] / TEMPERATURE, dim=-1)
    logp = log_probs.gather(-1, targets[:, None]).squeeze(-1)
    (logp * upstream).sum().backward()
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    assert x.grad is not None
    return {"full": full, "targets": targets, "upstream": upstream, "logp": logp.detach(),
            "entropy": entropy.detach(), "grad": x.grad}  # fmt: skip


def on_rank(rank: int, world: int, port: int, seed: int, chunk_bytes: int) -> dict[str, Any]:
    sizes = ParallelSizes(world, 1, 1, 1, 1, 1)
    init_parallel(ProcessPlace(rank, world, "127.0.0.1", port), sizes, seed=0)
    try:
        logits_module.CHUNK_BYTES = chunk_bytes
        ref = reference(seed)
        width = PADDED_VOCAB // world
        local = ref["full"][:, rank * width : (rank + 1) * width].float().requires_grad_(True)
        out = logits_module.vocab_parallel_logprobs(
            local, ref["targets"], TRUE_VOCAB, TEMPERATURE, "detached"
        )
        (out.logp * ref["upstream"].float()).sum().backward()
        assert local.grad is not None and out.entropy is not None
        expected_grad = ref["grad"][:, rank * width : (rank + 1) * width].float()
        return {
            "logp": float((out.logp - ref["logp"].float()).abs().max()),
            "entropy": float((out.entropy - ref["entropy"].float()).abs().max()),
            "grad": float((local.grad - expected_grad).abs().max()),
        }
    finally:
        destroy_parallel()


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("chunk_bytes", [1, 1 << 30], ids=["row-chunks", "one-chunk"])
def test_lean_logprobs_match_log_softmax(
    world: Callable[..., list[Any]], tp: int, chunk_bytes: int
) -> None:
    for errors in world(on_rank, tp, 3, chunk_bytes):
        assert errors["logp"] < 1e-5 and errors["entropy"] < 1e-5, errors
        assert errors["grad"] < 1e-5, errors
