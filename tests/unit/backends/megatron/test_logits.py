"""Logprobs from hidden states through a vocabulary-parallel output layer: the chunked kernel
gives plain autograd's values and gradients (hidden states and weight, entropy with and without
its gradient), with the vocabulary split over TP ranks and padded beyond the real vocabulary,
and never keeps the logits for backward."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from rlpost.backends import logprobs
from rlpost.backends.megatron import logits as logits_module
from rlpost.backends.megatron.config import ParallelSizes
from rlpost.backends.megatron.distributed import ProcessPlace, destroy_parallel, init_parallel

TOKENS, PADDED_VOCAB, TRUE_VOCAB, TEMPERATURE = 37, 48, 45, 0.7


HIDDEN = 16


def linear_reference(seed: int) -> dict[str, torch.Tensor]:
    """Plain autograd through logits = hidden @ weight.T over the real vocabulary: logp and
    entropy, and the gradients of hidden and weight for per-token upstream weights on both."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(TOKENS, HIDDEN, generator=gen, dtype=torch.float64)
    weight = torch.randn(PADDED_VOCAB, HIDDEN, generator=gen, dtype=torch.float64)
    targets = torch.randint(0, TRUE_VOCAB, (TOKENS,), generator=gen)
    up_logp = torch.randn(TOKENS, generator=gen, dtype=torch.float64)
    up_entropy = torch.randn(TOKENS, generator=gen, dtype=torch.float64)
    h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    log_probs = torch.log_softmax((h @ w[:TRUE_VOCAB].t()) / TEMPERATURE, dim=-1)
    logp = log_probs.gather(-1, targets[:, None]).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    grads = {}
    for name, total in (("logp", (logp * up_logp).sum()),
                        ("both", (logp * up_logp + entropy * up_entropy).sum())):  # fmt: skip
        gh, gw = torch.autograd.grad(total, (h, w), retain_graph=True)
        grads[name] = (gh, gw)
    return {"hidden": hidden, "weight": weight, "targets": targets, "up_logp": up_logp,
            "up_entropy": up_entropy, "logp": logp.detach(), "entropy": entropy.detach(),
            "grads": grads}  # fmt: skip


def linear_on_rank(
    rank: int, world: int, port: int, seed: int, chunk_bytes: int, entropy: str
) -> dict[str, float]:
    sizes = ParallelSizes(world, 1, 1, 1, 1, 1)
    init_parallel(ProcessPlace(rank, world, "127.0.0.1", port), sizes, seed=0)
    try:
        logprobs.CHUNK_BYTES = chunk_bytes
        ref = linear_reference(seed)
        width = PADDED_VOCAB // world
        h = ref["hidden"].float().requires_grad_(True)
        w = ref["weight"][rank * width : (rank + 1) * width].float().requires_grad_(True)
        out = logits_module.hidden_logprobs(h, w, ref["targets"], TRUE_VOCAB, TEMPERATURE, entropy)
        total = (out.logp * ref["up_logp"].float()).sum()
        if entropy == "grad":
            assert out.entropy is not None
            total = total + (out.entropy * ref["up_entropy"].float()).sum()
        total.backward()
        assert h.grad is not None and w.grad is not None
        # each rank's hidden gradient is its vocabulary slice's share; the TP region sums them
        grad_h = h.grad.clone()
        torch.distributed.all_reduce(grad_h)
        exp_h, exp_w = ref["grads"]["both" if entropy == "grad" else "logp"]
        errors = {
            "logp": float((out.logp - ref["logp"]).abs().max()),
            "grad_hidden": float((grad_h - exp_h).abs().max()),
            "grad_weight": float((w.grad - exp_w[rank * width : (rank + 1) * width]).abs().max()),
        }
        if entropy != "none":
            assert out.entropy is not None
            errors["entropy"] = float((out.entropy - ref["entropy"]).abs().max())
        return errors
    finally:
        destroy_parallel()


@pytest.mark.parametrize("entropy", ["none", "detached", "grad"])
@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize(
    "chunk_bytes", [1, 4 * TOKENS * 16, 1 << 30], ids=["1-column", "16-columns", "one-chunk"]
)
def test_hidden_logprobs_match_autograd_through_the_output_layer(
    world: Callable[..., list[Any]], tp: int, chunk_bytes: int, entropy: str
) -> None:
    """logp, entropy and both gradients (hidden, this rank's weight slice) equal plain autograd
    through the full logits, with per-token upstream gradients, the vocabulary split over TP
    and padded past the real vocabulary, in chunks of the vocabulary of one column, of 16 (the
    last one short) and all of it."""
    for errors in world(linear_on_rank, tp, 5, chunk_bytes, entropy):
        assert all(value < 5e-5 for value in errors.values()), errors


def test_hidden_logprobs_never_hold_the_logits(world: Callable[..., list[Any]]) -> None:
    """Bytes alive for backward: the hidden states and the weight, not [tokens x vocab]."""

    def saved(rank: int, world_size: int, port: int) -> tuple[int, int]:
        init_parallel(ProcessPlace(rank, world_size, "127.0.0.1", port),
                      ParallelSizes(1, 1, 1, 1, 1, 1), seed=0)  # fmt: skip
        try:
            tokens, hidden, vocab = 512, 8, 4096
            h = torch.randn(tokens, hidden, requires_grad=True)
            w = torch.randn(vocab, hidden, requires_grad=True)
            kept: dict[int, int] = {}

            def pack(t: torch.Tensor) -> torch.Tensor:
                kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = logits_module.hidden_logprobs(h, w, torch.zeros(tokens, dtype=torch.long),
                                                    vocab, 1.0, "detached")  # fmt: skip
            del out
            return sum(kept.values()), tokens * vocab * 4
        finally:
            destroy_parallel()

    [(kept_bytes, logits_bytes)] = world(saved, 1)
    assert kept_bytes < logits_bytes / 10, (kept_bytes, logits_bytes)
