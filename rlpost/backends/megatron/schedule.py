"""Forward (and backward) over packed micro-batches with megatron-core's pipeline schedules.

megatron-core picks the schedule from the process groups: no pipelining when pp = 1, 1F1B
otherwise. Losses are already divided by step-wide denominators (rlpost.algo.losses), so the
config asks for per-token loss handling (no division by the micro-batch count) and gradients
are summed, not averaged, across data-parallel ranks (`finalize_grads` drops megatron's
division by the token count).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core.distributed import finalize_model_grads
from megatron.core.pipeline_parallel import get_forward_backward_func
from torch import Tensor, nn

from rlpost.backends.megatron.batches import MicroBatch

LossFn = Callable[[MicroBatch, Tensor], tuple[Tensor, dict[str, Any]]]
"""(micro-batch, logits [1, t_local, V/tp]) -> (loss, what to hand back from the last stage)."""


def finalize_grads(
    model: list[nn.Module], num_tokens: Tensor | None = None, *args: Any, **kwargs: Any
) -> None:
    """Data-parallel grad sync and the TP/PP reductions, without scaling by the token count."""
    finalize_model_grads(model, None, *args, **kwargs)


def _forward_step(
    loss_fn: LossFn, data: Iterator[MicroBatch], model: nn.Module
) -> tuple[Tensor, Callable[..., Any]]:
    batch = next(data)
    mtp = {} if batch.mtp is None else {"mtp_targets": batch.mtp}  # MTP training (mtp.py)
    output = model(batch.input_ids, batch.position_ids, None, packed_seq_params=batch.packed, **mtp)

    def loss_func(output_tensor: Tensor) -> tuple[Tensor, Tensor, dict[str, Any]]:
        loss, extras = loss_fn(batch, output_tensor)
        return loss, torch.ones((), dtype=torch.int), extras

    return output, loss_func


def run_micro_batches(
    model: nn.Module,
    micro_batches: Sequence[MicroBatch],
    loss_fn: LossFn,
    forward_only: bool,
) -> list[dict[str, Any]]:
    """One pass over `micro_batches`; what `loss_fn` returned, per micro-batch, on the last
    pipeline stage (an empty list elsewhere)."""
    if not micro_batches:
        return []
    schedule = get_forward_backward_func()
    longest = max(mb.local_tokens for mb in micro_batches)
    outputs = schedule(
        forward_step_func=partial(_forward_step, loss_fn),
        data_iterator=iter(micro_batches),
        model=[model],
        num_microbatches=len(micro_batches),
        seq_length=longest,
        micro_batch_size=1,
        forward_only=forward_only,
    )
    return list(outputs)


def from_last_stage(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last pipeline stage's per-micro-batch outputs, on every stage."""
    if ps.get_pipeline_model_parallel_world_size() == 1:
        return outputs
    group = ps.get_pipeline_model_parallel_group()
    last = dist.get_process_group_ranks(group)[-1]
    box = [outputs if dist.get_rank() == last else None]
    dist.broadcast_object_list(box, src=last, group=group)
    return box[0]  # type: ignore[return-value]
