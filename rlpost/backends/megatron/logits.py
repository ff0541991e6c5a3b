"""Logprobs over megatron-core's vocabulary-parallel output layer, from final hidden states.

The models hand out their final hidden states (provider.py; mtp.py for models with MTP layers,
whose loss goes through the same kernel) and the output layer runs inside the chunked kernel
of rlpost.backends.logprobs, so the `[tokens x vocab]` logits are never whole. Each
tensor-parallel rank holds a slice of the vocabulary; `output_layer_input` gives every rank the
hidden states, with the backward that sums the ranks' partial gradients, as megatron-core's
ColumnParallelLinear would.
"""

from __future__ import annotations

from megatron.core import parallel_state
from megatron.core.tensor_parallel import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
)
from torch import Tensor

from rlpost.backends.logprobs import TokenLogprobs, linear_logprobs


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
    tp = parallel_state.get_tensor_model_parallel_world_size()
    group = parallel_state.get_tensor_model_parallel_group() if tp > 1 else None
    start = parallel_state.get_tensor_model_parallel_rank() * weight.shape[0]
    return linear_logprobs(
        hidden, weight, targets, true_vocab_size, temperature, entropy,
        vocab_start=start, group=group,
    )  # fmt: skip


def output_layer_input(hidden: Tensor, sequence_parallel: bool) -> Tensor:
    """Final hidden states [t(/tp), h] as the output layer's input on every TP rank, with the
    backward that sums the ranks' partial gradients (what ColumnParallelLinear does)."""
    if parallel_state.get_tensor_model_parallel_world_size() == 1:
        return hidden
    if sequence_parallel:
        gathered: Tensor = gather_from_sequence_parallel_region(
            hidden, tensor_parallel_output_grad=True
        )
        return gathered
    copied: Tensor = copy_to_tensor_model_parallel_region(hidden)
    return copied
