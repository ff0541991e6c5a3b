"""Rotary embeddings as one autograd function that keeps only the shared cos/sin table.

`rope(x, cos, sin, interleaved)`: x [t, heads, d] (tokens first: the compiled function's
dynamic dimension) rotated pair by pair, x cos + R(x) sin over the first cos.shape[-1] dims,
the rest passed through (partial rotary). The pairs are the two halves of the rotary dims
(transformers' `rotate_half`, megatron-core's default) or neighbours (`interleaved`). The
backward is the exact transpose, grad cos + R^T(grad sin), for any table. Forward and backward
are one compiled function (rlpost.backends.compiled: a Triton kernel on CUDA, eager elsewhere);
autograd over the eager arithmetic would run five kernels each way. Both trainers use it: the
megatron trainer with its per-micro-batch table (megatron.kernels.apply_rope), the torch trainer
with transformers' (torch_trainer.kernels).
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor

from rlpost.backends.compiled import compiled


def _rotate_half(x: Tensor, interleaved: bool, transposed: bool = False) -> Tensor:
    """Each rotary pair (a, b) -> (-b, a); `transposed`: (b, -a), a rotation the other way."""
    if not interleaved:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x2, -x1) if transposed else (-x2, x1), dim=-1)
    pairs = x.unflatten(-1, (-1, 2))  # type: ignore[no-untyped-call]
    a, b = pairs[..., 0], pairs[..., 1]
    return torch.stack((b, -a) if transposed else (-b, a), dim=-1).flatten(-2)


@compiled
def _rope(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, transposed: bool) -> Tensor:
    """x cos + R(x) sin over the rotary dims, the rest passed through. With `transposed`, the
    backward: x cos + R^T(x sin)."""
    rot = cos.shape[-1]
    head = x if rot == x.shape[-1] else x[..., :rot]
    if transposed:
        rotated = head * cos + _rotate_half(head * sin, interleaved, True)
    else:
        rotated = head * cos + _rotate_half(head, interleaved) * sin
    return rotated if rot == x.shape[-1] else torch.cat((rotated, x[..., rot:]), dim=-1)


class _Rope(torch.autograd.Function):
    """Keeps nothing but the cos/sin table, which every layer of a forward shares."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
        ctx.save_for_backward(cos, sin)
        ctx.interleaved = interleaved
        return _rope(x, cos, sin, interleaved, False)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        cos, sin = ctx.saved_tensors
        return _rope(grad, cos, sin, ctx.interleaved, True), None, None, None


def rope(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False) -> Tensor:
    """x [t, heads, d] rotated by each token's angles, cos and sin [t, 1, rotary dims] (in x's
    dtype; no gradient flows to them)."""
    return cast(Tensor, _Rope.apply(x, cos, sin, interleaved))  # type: ignore[no-untyped-call]
