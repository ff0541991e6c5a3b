"""Per-token logprobs and entropy from final hidden states through an output layer, in chunks.

`linear_logprobs` never holds the `[tokens x vocab]` logits whole. It walks the vocabulary in
chunks of columns, all tokens at once: each chunk's logits are computed and folded into four
running numbers per token (the max so far, the sum of exponentials under it, the target's logit
and, for the entropy, the expected logit), the way an online softmax does, and dropped. The
backward pass recomputes each chunk's logits from the saved hidden states and turns them
straight into the gradients: the weight's rows of that chunk in one matmul over every token
(each row written once), the hidden states' gradient added up over chunks in float32. Each token
is weighted by its own upstream gradient (a policy-gradient loss weights every token; a kernel
that folds one scalar gradient into its forward, as fused cross-entropy kernels do, cannot
serve it). Memory: one chunk of float32 logits (`LOGPROB_CHUNK_BYTES`) instead of the logits,
their float32 copies and their gradient; chunking the tokens instead would add a whole float32
weight gradient to every chunk.

The elementwise work of a chunk (the softmax statistics forward, the logits' gradient backward)
is one compiled function each (rlpost.backends.compiled: one or two Triton kernels on CUDA,
eager elsewhere).

The vocabulary may be split over a process group (megatron-core's tensor parallelism): each
rank passes its slice of the weight and where it starts, the per-token sums are combined with
one max and one sum across the group, and each rank's gradient of the hidden states covers its
own slice (the caller's parallel region sums them). Columns past the real vocabulary (padding)
are left out. Both trainers use it: rlpost.backends.megatron.logits and the torch trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from rlpost.backends.compiled import compiled
from rlpost.plan.memory import LOGPROB_CHUNK_BYTES

CHUNK_BYTES = LOGPROB_CHUNK_BYTES  # float32 logits per chunk of the vocabulary


@dataclass(frozen=True)
class TokenLogprobs:
    logp: Tensor
    entropy: Tensor | None


@dataclass(frozen=True)
class _Slice:
    """This rank's columns of the vocabulary: [start, start + valid) are real tokens."""

    start: int
    valid: int
    temperature: float
    group: dist.ProcessGroup | None

    def temperature_on(self, device: torch.device) -> Tensor:
        """The temperature as a float32 scalar on the device: a tensor argument of the compiled
        chunk functions (a Python float argument becomes a host scalar that the compiled code
        reads back with `.item()` on every call; a tensor is one graph for any temperature)."""
        return torch.full((), self.temperature, dtype=torch.float32, device=device)

    def chunks(self, rows: int) -> list[tuple[int, int]]:
        """[lo, hi) column ranges of this slice, each with at most CHUNK_BYTES of float32 logits
        for `rows` tokens; the width a power of two, so that few distinct widths occur."""
        fits = max(1, CHUNK_BYTES // (4 * max(rows, 1)))
        width = min(1 << (fits.bit_length() - 1), max(self.valid, 1))
        return [(lo, min(lo + width, self.valid)) for lo in range(0, self.valid, width)]


def _reduce(x: Tensor, op: dist.ReduceOp.RedOpType, group: dist.ProcessGroup | None) -> Tensor:
    if group is not None:
        dist.all_reduce(x, op=op, group=group)
    return x


def _target_slots(targets: Tensor, part: _Slice) -> tuple[Tensor, Tensor]:
    """Whether each target is in this slice, and its column in the slice (-1 when not)."""
    in_slice = (targets >= part.start) & (targets < part.start + part.valid)
    return in_slice, torch.where(in_slice, targets - part.start, -1)


@compiled
def _chunk_stats(
    hidden: Tensor,
    weight: Tensor,
    slot: Tensor,
    running: Tensor,
    temperature: Tensor,
    entropy: bool,
) -> Tensor:
    """`running` [4, rows] float32 (max, sum exp(x - max), target x, sum exp(x - max) * x over
    the columns so far) updated with one chunk of columns, x = hidden @ weight.T / T. `slot`:
    each token's target column within this chunk (outside [0, chunk) when elsewhere)."""
    x = (hidden @ weight.t()).float() / temperature
    peak = torch.maximum(running[0], x.max(dim=-1).values)
    exp = (x - peak[:, None]).exp()
    rescale = (running[0] - peak).exp()
    hit = (slot >= 0) & (slot < x.shape[-1])
    picked = x.gather(-1, slot.clamp(0, x.shape[-1] - 1)[:, None]).squeeze(-1)
    target = running[2] + torch.where(hit, picked, 0.0)
    expected = running[3] * rescale + (exp * x).sum(dim=-1) if entropy else running[3]
    return torch.stack((peak, running[1] * rescale + exp.sum(dim=-1), target, expected))


@compiled
def _chunk_grad(
    hidden: Tensor,
    weight: Tensor,
    lse: Tensor,
    mean_logit: Tensor,
    slot: Tensor,
    grad_logp: Tensor,
    grad_entropy: Tensor | None,
    temperature: Tensor,
) -> Tensor:
    """The gradient of a chunk's logits [rows, chunk] in the hidden states' dtype, from the
    upstream gradients of logp (and entropy), the logits recomputed from the hidden states.
    d logp / dx_j = 1[j = target] - p_j;  d entropy / dx_j = -p_j (x_j - E[x]); x = logits / T.
    """
    x = (hidden @ weight.t()).float() / temperature
    probs = (x - lse[:, None]).exp()
    grad = probs * -grad_logp[:, None]
    hit = (slot >= 0) & (slot < x.shape[-1])
    grad.scatter_add_(-1, slot.clamp(0, x.shape[-1] - 1)[:, None], (hit * grad_logp)[:, None])
    if grad_entropy is not None:
        grad -= probs * (x - mean_logit[:, None]) * grad_entropy[:, None]
    return (grad / temperature).to(hidden.dtype)


class _LinearLogprobs(torch.autograd.Function):
    """logp [t] and entropy [t] of softmax(hidden @ weight.T / T) over the whole (TP-split)
    vocabulary; saves the hidden states, the weight and two floats per token."""

    @staticmethod
    def forward(
        ctx: Any, hidden: Tensor, weight: Tensor, targets: Tensor, part: _Slice, entropy: str
    ) -> tuple[Tensor, Tensor]:
        in_slice, slot = _target_slots(targets, part)
        local = hidden.new_zeros((4, hidden.shape[0]), dtype=torch.float32)
        local[0] = -1e30
        temperature = part.temperature_on(hidden.device)
        # per token: this slice's max, sum exp(x - max), target logit, sum exp(x - max) * x
        for lo, hi in part.chunks(hidden.shape[0]):
            local = _chunk_stats(
                hidden, weight[lo:hi], slot - lo, local, temperature, entropy != "none"
            )
        peak = _reduce(local[0].clone(), dist.ReduceOp.MAX, part.group)
        rescale = (local[0] - peak).exp()
        sums = torch.stack((local[1] * rescale, local[2] * in_slice, local[3] * rescale))
        _reduce(sums, dist.ReduceOp.SUM, part.group)
        lse = peak + sums[0].log()
        mean_logit = sums[2] / sums[0]
        ctx.save_for_backward(hidden, weight, targets, lse, mean_logit)
        ctx.part, ctx.entropy = part, entropy
        ent = lse - mean_logit
        if entropy != "grad":
            ctx.mark_non_differentiable(ent)
        return sums[1] - lse, ent

    @staticmethod
    def backward(
        ctx: Any, grad_logp: Tensor | None, grad_entropy: Tensor | None
    ) -> tuple[Tensor | None, Tensor | None, None, None, None]:
        hidden, weight, targets, lse, mean_logit = ctx.saved_tensors
        part: _Slice = ctx.part
        wants_hidden, wants_weight = ctx.needs_input_grad[:2]
        # the hidden states' gradient adds up over chunks in float32, rounded once at the end;
        # each of the weight's rows is one matmul over every token (padding rows stay zero)
        grad_hidden = None
        if wants_hidden:
            grad_hidden = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
        grad_weight = torch.zeros_like(weight) if wants_weight else None
        _, slot = _target_slots(targets, part)
        if grad_logp is None:
            grad_logp = lse.new_zeros(lse.shape)
        with_entropy = ctx.entropy == "grad" and grad_entropy is not None
        temperature = part.temperature_on(hidden.device)
        for lo, hi in part.chunks(hidden.shape[0]):
            chunk = weight[lo:hi]
            grad = _chunk_grad(
                hidden, chunk, lse, mean_logit, slot - lo, grad_logp,
                grad_entropy if with_entropy else None, temperature,
            )  # fmt: skip
            if grad_hidden is not None:
                grad_hidden += (grad @ chunk).float()
            if grad_weight is not None:
                grad_weight[lo:hi] = grad.t() @ hidden
        if grad_hidden is not None:
            grad_hidden = grad_hidden.to(hidden.dtype)
        return grad_hidden, grad_weight, None, None, None


def linear_logprobs(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    true_vocab_size: int,
    temperature: float = 1.0,
    entropy: str = "none",
    *,
    vocab_start: int = 0,
    group: dist.ProcessGroup | None = None,
) -> TokenLogprobs:
    """hidden [t, h], weight [V_slice, h] (the output layer's rows from `vocab_start`; the
    whole vocabulary without a group), targets [t] -> logp [t] (+ entropy) under
    softmax(hidden @ weight.T / temperature) over the real vocabulary.

    `entropy`: "none", "detached" or "grad" (kept in the graph for an entropy bonus).
    """
    width = weight.shape[0]
    valid = max(0, min(width, true_vocab_size - vocab_start))
    part = _Slice(vocab_start, valid, temperature, group)
    logp, ent = _LinearLogprobs.apply(  # type: ignore[no-untyped-call]
        hidden, weight, targets, part, entropy
    )
    return TokenLogprobs(logp, None if entropy == "none" else ent)
