"""Per-token logprobs and entropy over a vocabulary-parallel output layer.

`hidden_logprobs` is the training path: it takes the final hidden states and the output
layer's weight and never holds the `[tokens x vocab]` logits whole. It walks the tokens in
chunks of rows: each chunk's logits are computed, reduced to four numbers per token (the
chunk's max, sum of exponentials, the target's logit and, for the entropy, the expected logit)
and dropped; one max and one sum across the tensor-parallel group combine the vocabulary
slices. The backward pass recomputes each chunk's logits from the saved hidden states and
turns them straight into that chunk's gradients of the hidden states and of the weight, each
token weighted by its own upstream gradient (a policy-gradient loss weights every token; a
kernel that folds one scalar gradient into its forward, as fused cross-entropy kernels do,
cannot serve it). Memory: one chunk of float32 logits (`LOGPROB_CHUNK_BYTES`) instead of the
logits, their float32 copies and their gradient.

The models hand out their final hidden states for this (provider.py; mtp.py for models with
MTP layers, whose loss goes through the same kernel); `output_layer_input` gives the kernel
the hidden states every tensor-parallel rank needs, as the output layer would have.

Each tensor-parallel rank holds a slice of the vocabulary. The softmax normaliser, the target's
logit and the entropy's expectation are sums over the whole vocabulary: each is computed on the
local slice and combined across the group. Columns of the padded vocabulary (beyond the real
vocabulary) are left out. Every rank's gradient of the hidden states covers its own slice; the
tensor-parallel region around the kernel sums them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.tensor_parallel import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
)
from torch import Tensor

from rlpost.plan.memory import LOGPROB_CHUNK_BYTES


@dataclass(frozen=True)
class TokenLogprobs:
    logp: Tensor
    entropy: Tensor | None


CHUNK_BYTES = LOGPROB_CHUNK_BYTES  # fp32 working set per chunk of rows


@dataclass(frozen=True)
class _Slice:
    """This TP rank's columns of the vocabulary: [start, start + valid) are real tokens."""

    start: int
    valid: int
    temperature: float

    def rows_per_chunk(self, width: int) -> int:
        return max(1, CHUNK_BYTES // (4 * max(width, 1)))

    def logits(self, hidden: Tensor, weight: Tensor) -> Tensor:
        """float32 logits / T of a chunk of hidden states over this rank's real columns."""
        return (hidden @ weight[: self.valid].t()).float() / self.temperature


def _tp_group() -> dist.ProcessGroup | None:
    if parallel_state.get_tensor_model_parallel_world_size() == 1:
        return None
    return parallel_state.get_tensor_model_parallel_group()


def _reduce(x: Tensor, op: dist.ReduceOp.RedOpType) -> Tensor:
    group = _tp_group()
    if group is not None:
        dist.all_reduce(x, op=op, group=group)
    return x


def _targets_in_slice(targets: Tensor, part: _Slice) -> tuple[Tensor, Tensor]:
    in_slice = (targets >= part.start) & (targets < part.start + part.valid)
    index = (targets - part.start).clamp(0, max(part.valid - 1, 0))
    return in_slice, index


class _LinearLogprobs(torch.autograd.Function):
    """logp [t] and entropy [t] of softmax(hidden @ weight.T / T) over the whole (TP-split)
    vocabulary; saves the hidden states, the weight and two floats per token."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: Tensor, weight: Tensor, targets: Tensor, part: _Slice, entropy: str
    ) -> tuple[Tensor, Tensor]:
        rows, fp32 = hidden.shape[0], torch.float32
        # per token: this slice's max, sum exp(x - max), target logit, sum exp(x - max) * x
        local = hidden.new_zeros((4, rows), dtype=fp32)
        local[0] = -1e30
        in_slice, index = _targets_in_slice(targets, part)
        step = part.rows_per_chunk(part.valid)
        for lo in range(0, rows if part.valid else 0, step):
            hi = lo + step
            x = part.logits(hidden[lo:hi], weight)
            peak = x.max(dim=-1).values
            exp = (x - peak[:, None]).exp()
            local[0, lo:hi] = peak
            local[1, lo:hi] = exp.sum(dim=-1)
            local[2, lo:hi] = x.gather(-1, index[lo:hi, None]).squeeze(-1)
            if entropy != "none":
                local[3, lo:hi] = (exp * x).sum(dim=-1)
        peak = _reduce(local[0].clone(), dist.ReduceOp.MAX)
        rescale = (local[0] - peak).exp()
        sums = torch.stack((local[1] * rescale, local[2] * in_slice, local[3] * rescale))
        _reduce(sums, dist.ReduceOp.SUM)
        lse = peak + sums[0].log()
        mean_logit = sums[2] / sums[0]
        ctx.save_for_backward(hidden, weight, targets, lse, mean_logit)
        ctx.part, ctx.entropy = part, entropy
        ent = lse - mean_logit
        if entropy != "grad":
            ctx.mark_non_differentiable(ent)
        return sums[1] - lse, ent

    @staticmethod
    def backward(  # type: ignore[override]
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
        for lo in range(0, hidden.shape[0] if part.valid else 0, step):
            hi = lo + step
            h = hidden[lo:hi]
            x = part.logits(h, weight)
            probs = (x - lse[lo:hi, None]).exp()
            # d logp / dx_j = 1[j = target] - p_j;  d entropy / dx_j = -p_j (x_j - E[x])
            grad = probs * -grad_logp[lo:hi, None]
            picked = (in_slice[lo:hi] * grad_logp[lo:hi])[:, None].to(grad.dtype)
            grad.scatter_add_(-1, index[lo:hi, None], picked)
            if with_entropy:
                assert grad_entropy is not None
                grad -= probs * (x - mean_logit[lo:hi, None]) * grad_entropy[lo:hi, None]
            grad = (grad / part.temperature).to(hidden.dtype)  # through x = logits / T
            if grad_hidden is not None:
                grad_hidden[lo:hi] = grad @ weight[: part.valid]
            if grad_weight is not None:
                grad_weight[: part.valid] += (grad.t() @ h).float()
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None


def hidden_logprobs(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    true_vocab_size: int,
    temperature: float = 1.0,
    entropy: str = "none",
) -> TokenLogprobs:
    """hidden [t, h] (every TP rank's copy, whole sequence), weight [V/tp, h] (this rank's
    vocabulary slice of the output layer), targets [t] -> logp [t] (+ entropy).

    `entropy`: "none", "detached" or "grad" (kept in the graph for an entropy bonus).
    """
    width = weight.shape[0]
    start = parallel_state.get_tensor_model_parallel_rank() * width
    part = _Slice(start, max(0, min(width, true_vocab_size - start)), temperature)
    logp, ent = _LinearLogprobs.apply(hidden, weight, targets, part, entropy)
    return TokenLogprobs(logp, None if entropy == "none" else ent)


def output_layer_input(hidden: Tensor, sequence_parallel: bool) -> Tensor:
    """Final hidden states [t(/tp), h] as the output layer's input on every TP rank, with the
    backward that sums the ranks' partial gradients (what ColumnParallelLinear does)."""
    if parallel_state.get_tensor_model_parallel_world_size() == 1:
        return hidden
    if sequence_parallel:
        return gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=True)
    return copy_to_tensor_model_parallel_region(hidden)
