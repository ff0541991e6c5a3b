"""Per-token logprobs and entropy from vocabulary-parallel logits.

Each tensor-parallel rank holds a slice of the vocabulary. The softmax normaliser, the target's
logit and the entropy's expectation are sums over the whole vocabulary: each is computed on the
local slice and summed across the group with megatron-core's all-reduce (identity backward,
which is the right gradient because every rank computes the same loss from the sums). The max
subtracted for stability is detached; log-softmax does not depend on it. Columns of the padded
vocabulary (beyond the real vocabulary) are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    width = logits.shape[-1]
    start = tp_rank * width
    valid = max(0, min(width, true_vocab_size - start))
    local = logits[:, :valid].float() / temperature
    peak = local.max(dim=-1).values.detach() if valid else local.new_full((len(local),), -1e30)
    if parallel_state.get_tensor_model_parallel_world_size() > 1:
        dist.all_reduce(
            peak, op=dist.ReduceOp.MAX, group=parallel_state.get_tensor_model_parallel_group()
        )
    shifted = local - peak.unsqueeze(-1)
    exp = shifted.exp()
    normaliser = _tp_sum(exp.sum(dim=-1))
    log_z = normaliser.log()
    in_slice = (targets >= start) & (targets < start + valid)
    index = (targets - start).clamp(0, max(valid - 1, 0)).unsqueeze(-1)
    picked = shifted.gather(-1, index).squeeze(-1) if valid else shifted.new_zeros(len(local))
    logp = _tp_sum(picked * in_slice) - log_z
    if entropy == "none":
        return TokenLogprobs(logp, None)
    with torch.set_grad_enabled(entropy == "grad" and torch.is_grad_enabled()):
        expected = _tp_sum((exp * shifted).sum(dim=-1)) / normaliser
        return TokenLogprobs(logp, log_z - expected)
