"""Which of SDPA's backends the trainers' padded attention asks for first.

Both trainers attend over packed samples gathered into padded batches on some path (the
megatron trainer's padded path, megatron.kernels.padded_attention; the torch trainer's packed
attention, torch_trainer.attention), and call `F.scaled_dot_product_attention` there inside
`preferred_backends(query, key)`: on a GPU of CUDNN_FIRST_CAPABILITIES SDPA tries cuDNN's
attention first for the shapes cuDNN has a plan for or may still build one (CUDNN_PLANS),
elsewhere its own order.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
from collections.abc import Sequence
from typing import Any, cast

import torch
from torch import Tensor

from rlpost import switches

CUDNN_FIRST_CAPABILITIES = frozenset({(9, 0)})
"""GPUs on which the padded attention asks SDPA for cuDNN's attention before flash attention's:
Hopper, where cuDNN's kernels train 1.7-2.3x faster for training shapes, and not elsewhere
(slower on Ampere and Blackwell by the same published measurements). A preference, not a
restriction: a call cuDNN cannot serve goes to the next backend, as SDPA chooses by default.
RLPOST_CUDNN_ATTENTION=0 leaves SDPA's own order."""

CUDNN_PLANS = 16
"""Distinct input shapes per process for which the padded attention asks cuDNN first. cuDNN's
attention builds an execution plan for each new shape of its inputs, forward and backward
(reported at 55-70 ms a plan on recent GPUs, longer when a kernel must be compiled; torch
caches them by shape), where flash attention builds nothing. Equal samples make one or a few
shapes, which the plans soon serve; samples of ragged lengths make a new shape nearly every
micro-batch, where the builds would cost more than cuDNN's faster kernels save. So past this
many shapes a new one takes SDPA's own order (flash attention first), and the megatron
trainer its varlen kernel (megatron.kernels.padded_pays)."""

RAGGED_PLANS_ENV = "TORCH_CUDNN_SDPA_AVOID_RECOMPILE"
"""torch's switch (experimental, off by default, read once a process) under which cuDNN's
attention keys its plans by the sequence lengths rounded up to powers of two, for calls
without a mask whose query, key, value and output are in the BSHD layout (both trainers' padded
calls are): samples of ragged lengths then share a few plans. The batch stays in the key."""

log = logging.getLogger(__name__)
Shape = tuple[Any, ...]
_cudnn_shapes: set[Shape] = set()
"""The shapes this process has asked cuDNN first for (at most CUDNN_PLANS)."""
_refused = False  # whether a new shape was refused (noted the first time)


def sdpa_preference() -> list[Any]:
    """SDPA's backends with cuDNN first, then its default order, each only if it is enabled
    (torch.backends.cuda's switches); [] where this torch cannot set a priority."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if "set_priority" not in inspect.signature(sdpa_kernel).parameters:
        return []
    cuda: Any = torch.backends.cuda  # its switch functions are untyped
    order = [
        (SDPBackend.CUDNN_ATTENTION, cuda.cudnn_sdp_enabled),
        (SDPBackend.FLASH_ATTENTION, cuda.flash_sdp_enabled),
        (SDPBackend.EFFICIENT_ATTENTION, cuda.mem_efficient_sdp_enabled),
        (SDPBackend.MATH, cuda.math_sdp_enabled),
    ]
    return [backend for backend, enabled in order if enabled()]


CUDNN_DTYPES = (torch.bfloat16, torch.float16)
"""What cuDNN's attention computes in; a float32 call (model.params_dtype=fp32) never reaches
it, so it neither asks for cuDNN nor spends a plan of the budget."""


def cudnn_device(query: Tensor) -> bool:
    """Whether SDPA calls on `query` ask cuDNN first at all: bf16 or fp16 on a GPU of
    CUDNN_FIRST_CAPABILITIES, unless RLPOST_CUDNN_ATTENTION=0."""
    if not query.is_cuda or switches.CUDNN_ATTENTION.value() == "0":
        return False
    if query.dtype not in CUDNN_DTYPES:
        return False
    return torch.cuda.get_device_capability(query.device) in CUDNN_FIRST_CAPABILITIES


@functools.cache
def ragged_plans() -> bool:
    """Whether RAGGED_PLANS_ENV is on, read once as torch reads it ("1" and nothing else)."""
    return os.environ.get(RAGGED_PLANS_ENV) == "1"


def power_of_two(n: int) -> int:
    """The least power of two at or above `n` (1 for 0), as torch rounds cuDNN's keys."""
    return 1 << max(n - 1, 0).bit_length()


def shape_of(
    query: Tensor,
    query_shape: Sequence[int],
    key_shape: Sequence[int],
    *,
    masked: bool = False,
    bshd: bool = True,
) -> Shape:
    """What tells one cuDNN plan from another: the device, the dtype and the query's and key's
    shapes ([batch, heads, rows, head size]); under RAGGED_PLANS_ENV, for a call without a mask
    on tensors in the BSHD layout, the rows rounded up to a power of two."""
    q, k = list(query_shape), list(key_shape)
    if ragged_plans() and bshd and not masked:
        q[2], k[2] = power_of_two(q[2]), power_of_two(k[2])
    return (query.device, query.dtype, tuple(q), tuple(k))


def is_bshd(*tensors: Tensor) -> bool:
    """Whether each [batch, heads, rows, head size] tensor is a view of a contiguous [batch,
    rows, heads, head size] one."""
    return all(t.dim() == 4 and t.transpose(1, 2).is_contiguous() for t in tensors)


def planned(shapes: Sequence[Shape], take: bool = False) -> bool:
    """Whether cuDNN has, or may still build, a plan for every one of `shapes`: each is one
    this process asked cuDNN first for, or the new ones fit in CUDNN_PLANS; with `take` the new
    ones are counted from now on (the caller makes the calls)."""
    global _refused
    new = set(shapes) - _cudnn_shapes
    if len(_cudnn_shapes) + len(new) > CUDNN_PLANS:
        if not _refused:
            _refused = True
            log.info(
                "padded attention: %d input shapes asked for cuDNN's attention first, which "
                "builds a plan for each new shape; new shapes no longer do (the megatron "
                "trainer takes its varlen kernel for them, the torch trainer SDPA's own order)",
                len(_cudnn_shapes),
            )
        return False
    if take:
        _cudnn_shapes.update(new)
    return True


def cudnn_plans() -> tuple[int, bool]:
    """(how many shapes this process has asked cuDNN first for, whether a new one was refused
    since CUDNN_PLANS were taken): for the benchmarks' report."""
    return len(_cudnn_shapes), _refused


def preferred_backends(
    query: Tensor, key: Tensor, *, masked: bool = False
) -> contextlib.AbstractContextManager[Any]:
    """cuDNN first for an SDPA call on `query` and `key` ([batch, heads, rows, head size]; with
    an attention mask when `masked`) on a GPU of CUDNN_FIRST_CAPABILITIES, for a shape it has or
    may still build a plan for (`planned`); nothing for any other call."""
    if not cudnn_device(query):
        return contextlib.nullcontext()
    shape = shape_of(query, query.shape, key.shape, masked=masked, bshd=is_bshd(query, key))
    if not planned([shape], take=True):
        return contextlib.nullcontext()
    backends = sdpa_preference()
    if not backends:
        return contextlib.nullcontext()
    from torch.nn.attention import sdpa_kernel

    return cast(contextlib.AbstractContextManager[Any], sdpa_kernel(backends, set_priority=True))
