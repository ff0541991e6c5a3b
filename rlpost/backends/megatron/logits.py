"""Per-token logprobs and entropy from vocabulary-parallel logits.

Each tensor-parallel rank holds a slice of the vocabulary. The softmax normaliser, the target's
logit and the entropy's expectation are sums over the whole vocabulary: each is computed on the
local slice and summed across the group with megatron-core's all-reduce (identity backward,
which is the right gradient because every rank computes the same loss from the sums). The max
subtracted for stability is detached; log-softmax does not depend on it. Columns of the padded
vocabulary (beyond the real vocabulary) are left out.

Without an entropy bonus the logprobs come from `_LeanLogprobs`: it walks the logits in chunks
of rows and keeps only the logits themselves for the backward pass, which recomputes the
softmax chunk by chunk. The plain path keeps several fp32 copies of [tokens, V/tp] (about 10 GB
each for 16k tokens of a 150k vocabulary), which would dominate a GPU's training memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.tensor_parallel import reduce_from_tensor_model_parallel_region
from torch import Tensor


@dataclass(frozen=True)
class TokenLogprobs:
    logp: Tensor
    entropy: Tensor | None


def _tp_sum(x: Tensor) -> Tensor:
    return reduce_from_tensor_model_parallel_region(x)


CHUNK_BYTES = 256 << 20  # fp32 working set per chunk of rows


@dataclass(frozen=True)
class _Slice:
    """This TP rank's columns of the vocabulary: [start, start + valid) are real tokens."""

    start: int
    valid: int
    temperature: float

    def rows_per_chunk(self, width: int) -> int:
        return max(1, CHUNK_BYTES // (4 * max(width, 1)))

    def scaled(self, logits: Tensor) -> Tensor:
        return logits[:, : self.valid].float() / self.temperature


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


class _LeanLogprobs(torch.autograd.Function):
    """logp [t] of `targets` under softmax(logits / T) over the whole (TP-split) vocabulary,
    and the detached entropy; saves only the logits for backward."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, logits: Tensor, targets: Tensor, part: _Slice, with_entropy: bool
    ) -> tuple[Tensor, Tensor]:
        rows, fp32 = logits.shape[0], torch.float32
        peak = logits.new_full((rows,), -1e30, dtype=fp32)
        step = part.rows_per_chunk(logits.shape[-1])
        if part.valid:
            for lo in range(0, rows, step):
                peak[lo : lo + step] = part.scaled(logits[lo : lo + step]).max(dim=-1).values
        _reduce(peak, dist.ReduceOp.MAX)
        sums = logits.new_zeros((3, rows), dtype=fp32)  # sum exp, picked logit, sum exp * x
        in_slice, index = _targets_in_slice(targets, part)
        if part.valid:
            for lo in range(0, rows, step):
                hi = lo + step
                shifted = part.scaled(logits[lo:hi]) - peak[lo:hi, None]
                exp = shifted.exp()
                sums[0, lo:hi] = exp.sum(dim=-1)
                sums[1, lo:hi] = shifted.gather(-1, index[lo:hi, None]).squeeze(-1)
                if with_entropy:
                    sums[2, lo:hi] = (exp * shifted).sum(dim=-1)
        sums[1] *= in_slice
        _reduce(sums, dist.ReduceOp.SUM)
        log_z = sums[0].log()
        ctx.save_for_backward(logits, targets, peak + log_z)
        ctx.part = part
        entropy = log_z - sums[2] / sums[0]
        ctx.mark_non_differentiable(entropy)
        return sums[1] - log_z, entropy

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_logp: Tensor, grad_entropy: Tensor | None
    ) -> tuple[Tensor | None, None, None, None]:
        logits, targets, lse = ctx.saved_tensors
        part: _Slice = ctx.part
        grad = torch.zeros_like(logits)
        in_slice, index = _targets_in_slice(targets, part)
        step = part.rows_per_chunk(logits.shape[-1])
        for lo in range(0, logits.shape[0] if part.valid else 0, step):
            hi = lo + step
            # d logp / d x_j = (1[j = target] - softmax_j) / T, on this rank's columns
            chunk = -(part.scaled(logits[lo:hi]) - lse[lo:hi, None]).exp()
            chunk.scatter_add_(-1, index[lo:hi, None], in_slice[lo:hi, None].to(chunk.dtype))
            chunk *= grad_logp[lo:hi, None] / part.temperature
            grad[lo:hi, : part.valid] = chunk.to(grad.dtype)
        return grad, None, None, None


def vocab_parallel_logprobs(
    logits: Tensor,
    targets: Tensor,
    true_vocab_size: int,
    temperature: float = 1.0,
    entropy: str = "none",
) -> TokenLogprobs:
    """logits [t, V/tp] (this rank's vocabulary slice), targets [t] -> logp [t] (+ entropy).

    `entropy`: "none", "detached" or "grad" (kept in the graph for an entropy bonus).
    """
    width = logits.shape[-1]
    start = parallel_state.get_tensor_model_parallel_rank() * width
    part = _Slice(start, max(0, min(width, true_vocab_size - start)), temperature)
    if entropy != "grad" or not torch.is_grad_enabled():
        logp, ent = _LeanLogprobs.apply(logits, targets, part, entropy != "none")
        return TokenLogprobs(logp, None if entropy == "none" else ent)
    return _differentiable(logits, targets, part)


def _differentiable(logits: Tensor, targets: Tensor, part: _Slice) -> TokenLogprobs:
    """Logprobs and entropy both in the autograd graph (an entropy bonus trains on it)."""
    local = part.scaled(logits)
    if part.valid:
        peak = local.max(dim=-1).values.detach()
    else:
        peak = local.new_full((len(local),), -1e30)
    _reduce(peak, dist.ReduceOp.MAX)
    shifted = local - peak.unsqueeze(-1)
    exp = shifted.exp()
    normaliser = _tp_sum(exp.sum(dim=-1))
    log_z = normaliser.log()
    in_slice, index = _targets_in_slice(targets, part)
    if part.valid:
        picked = shifted.gather(-1, index.unsqueeze(-1)).squeeze(-1)
    else:
        picked = shifted.new_zeros(len(local))
    logp = _tp_sum(picked * in_slice) - log_z
    expected = _tp_sum((exp * shifted).sum(dim=-1)) / normaliser
    return TokenLogprobs(logp, log_z - expected)
