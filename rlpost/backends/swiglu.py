"""SwiGLU, silu(gate) * up, as an autograd function that keeps only gate and up for backward.

Autograd over the two operations keeps silu(gate) as well, a third tensor of the MLP's width,
and runs five kernels backward. Here the forward and backward arithmetic are one compiled
function each (rlpost.backends.compiled: a Triton kernel on CUDA, eager elsewhere), silu
recomputed from the gate. Two forms: `swiglu` on one projection's output [..., 2f], gate then
up (megatron-core's fc1; transformers' merged gate_up_proj in GLM-4 and Phi-3), and
`swiglu_pair` on two projections' outputs (transformers' gate_proj and up_proj). The megatron
trainer's MLP calls the first (megatron.kernels), the torch trainer's transformers MLPs either
(torch_trainer.kernels).
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from rlpost.backends.compiled import compiled


def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    return F.silu(gate) * up


def silu_mul_grads(grad: Tensor, gate: Tensor, up: Tensor) -> tuple[Tensor, Tensor]:
    """The gate's and up's gradients: silu's own backward kernel (grad * sig * (1 + gate *
    (1 - sig)) in one pass, float32 inside the kernel) for the gate, silu recomputed for up."""
    return torch.ops.aten.silu_backward(grad * up, gate), grad * F.silu(gate)


@compiled
def _swiglu_forward(x: Tensor) -> Tensor:
    gate, up = x.chunk(2, dim=-1)
    return silu_mul(gate, up)


@compiled
def _swiglu_backward(grad: Tensor, x: Tensor) -> Tensor:
    gate, up = x.chunk(2, dim=-1)
    return torch.cat(silu_mul_grads(grad, gate, up), dim=-1)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return _swiglu_forward(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return _swiglu_backward(grad, x)


def swiglu(x: Tensor) -> Tensor:
    """[..., 2f] (gate then up) -> silu(gate) * up [..., f], keeping only x for backward."""
    width = x.shape[-1]
    out = _SwiGLU.apply(x.reshape(-1, width))  # type: ignore[no-untyped-call]
    return cast(Tensor, out).view(*x.shape[:-1], width // 2)


@compiled
def _pair_forward(gate: Tensor, up: Tensor) -> Tensor:
    return silu_mul(gate, up)


@compiled
def _pair_backward(grad: Tensor, gate: Tensor, up: Tensor) -> tuple[Tensor, Tensor]:
    return silu_mul_grads(grad, gate, up)


class _SwiGLUPair(torch.autograd.Function):
    """gate and up [t, f] (tokens first: the compiled functions' dynamic dimension)."""

    @staticmethod
    def forward(ctx: Any, gate: Tensor, up: Tensor) -> Tensor:
        ctx.save_for_backward(gate, up)
        return _pair_forward(gate, up)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor]:
        gate, up = ctx.saved_tensors
        return _pair_backward(grad, gate, up)


def swiglu_pair(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up for two tensors of one shape [..., f], keeping gate and up alone."""
    width = gate.shape[-1]
    out = _SwiGLUPair.apply(gate.reshape(-1, width), up.reshape(-1, width))  # type: ignore[no-untyped-call]
    return cast(Tensor, out).view(gate.shape)
