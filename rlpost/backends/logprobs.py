"""Per-token logprobs and entropy from final hidden states through an output layer, in chunks.

`linear_logprobs` never holds the `[tokens x vocab]` logits whole. It walks the tokens in chunks
of rows: each chunk's logits are computed, reduced to four numbers per token (the chunk's max,
sum of exponentials, the target's logit and, for the entropy, the expected logit) and dropped.
The backward pass recomputes each chunk's logits from the saved hidden states and turns them
straight into that chunk's gradients of the hidden states and of the weight, each token
weighted by its own upstream gradient (a policy-gradient loss weights every token; a kernel
that folds one scalar gradient into its forward, as fused cross-entropy kernels do, cannot
serve it). Memory: one chunk of float32 logits (`LOGPROB_CHUNK_BYTES`) instead of the logits,
their float32 copies and their gradient.

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

CHUNK_BYTES = LOGPROB_CHUNK_BYTES  # float32 working set per chunk of rows


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

    def rows_per_chunk(self, width: int) -> int:
        return max(1, CHUNK_BYTES // (4 * max(width, 1)))

    def logits(self, hidden: Tensor, weight: Tensor) -> Tensor:
        """float32 logits / T of a chunk of hidden states over this rank's real columns."""
        return (hidden @ weight[: self.valid].t()).float() / self.temperature


def _reduce(x: Tensor, op: dist.ReduceOp.RedOpType, group: dist.ProcessGroup | None) -> Tensor:
    if group is not None:
        dist.all_reduce(x, op=op, group=group)
    return x


def _targets_in_slice(targets: Tensor, part: _Slice) -> tuple[Tensor, Tensor]:
    in_slice = (targets >= part.start) & (targets < part.start + part.valid)
    index = (targets - part.start).clamp(0, max(part.valid - 1, 0))
    return in_slice, index


@compiled
def _chunk_stats(
    hidden: Tensor, weight: Tensor, index: Tensor, temperature: float, entropy: bool
) -> Tensor:
    """[4, rows] float32 per token of a chunk: the max of its logits / T over this slice, the
    sum of exp(x - max), the target's x, and (with `entropy`) sum exp(x - max) * x."""
    x = (hidden @ weight.t()).float() / temperature
    peak = x.max(dim=-1).values
    exp = (x - peak[:, None]).exp()
    target = x.gather(-1, index[:, None]).squeeze(-1)
    expected = (exp * x).sum(dim=-1) if entropy else torch.zeros_like(peak)
    return torch.stack((peak, exp.sum(dim=-1), target, expected))


@compiled
def _chunk_grad(
    hidden: Tensor,
    weight: Tensor,
    lse: Tensor,
    mean_logit: Tensor,
    index: Tensor,
    in_slice: Tensor,
    grad_logp: Tensor,
    grad_entropy: Tensor | None,
    temperature: float,
) -> Tensor:
    """The gradient of a chunk's logits [rows, V_slice] in the hidden states' dtype, from the
    upstream gradients of logp (and entropy), the logits recomputed from the hidden states.
    d logp / dx_j = 1[j = target] - p_j;  d entropy / dx_j = -p_j (x_j - E[x]); x = logits / T.
    """
    x = (hidden @ weight.t()).float() / temperature
    probs = (x - lse[:, None]).exp()
    grad = probs * -grad_logp[:, None]
    picked = (in_slice * grad_logp)[:, None].to(grad.dtype)
    grad.scatter_add_(-1, index[:, None], picked)
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
        rows = hidden.shape[0]
        in_slice, index = _targets_in_slice(targets, part)
        step = part.rows_per_chunk(part.valid)
        weight_rows = weight[: part.valid]
        with_entropy = entropy != "none"
        chunks = [
            _chunk_stats(hidden[lo : lo + step], weight_rows, index[lo : lo + step],
                         part.temperature, with_entropy)
            for lo in range(0, rows if part.valid else 0, step)
        ]  # fmt: skip
        # per token: this slice's max, sum exp(x - max), target logit, sum exp(x - max) * x
        if chunks:
            local = torch.cat(chunks, dim=1)
        else:
            local = hidden.new_zeros((4, rows), dtype=torch.float32)
            local[0] = -1e30
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
        grad_hidden = torch.zeros_like(hidden) if wants_hidden else None
        # the weight's gradient adds up over chunks in float32, rounded once at the end
        grad_weight = None
        if wants_weight:
            grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        in_slice, index = _targets_in_slice(targets, part)
        if grad_logp is None:
            grad_logp = lse.new_zeros(lse.shape)
        with_entropy = ctx.entropy == "grad" and grad_entropy is not None
        step = part.rows_per_chunk(part.valid)
        weight_rows = weight[: part.valid]
        for lo in range(0, hidden.shape[0] if part.valid else 0, step):
            hi = lo + step
            h = hidden[lo:hi]
            grad = _chunk_grad(
                h, weight_rows, lse[lo:hi], mean_logit[lo:hi], index[lo:hi],
                in_slice[lo:hi], grad_logp[lo:hi],
                grad_entropy[lo:hi] if with_entropy and grad_entropy is not None else None,
                part.temperature,
            )  # fmt: skip
            if grad_hidden is not None:
                grad_hidden[lo:hi] = grad @ weight_rows
            if grad_weight is not None:
                grad_weight[: part.valid] += (grad.t() @ h).float()
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
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
