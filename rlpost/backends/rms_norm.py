"""RMSNorm with a backward that keeps little and, on CUDA, runs fused.

`rms_norm(x, weight, eps)` = weight * x / rms(x) over the last dim, the mean square
accumulated in float32 whatever x's dtype:
- on a device of FUSED_RMS_NORM_DEVICES (CUDA builds of torch 2.8 and later), with weight and
  x of one dtype: torch's fused kernels forward and backward (`aten._fused_rms_norm` and
  `aten._fused_rms_norm_backward`), keeping x, the weight and each row's float32 1/rms;
- elsewhere: `F.rms_norm`'s forward keeping x alone (torch's composite rms_norm, and
  transformers' RMSNorm modules, keep float32 copies of x and of the normalised rows too), and
  a float32 backward that recomputes 1/rms from x: about fifteen elementwise kernels, which
  is what the fused backward saves. On CUDA without the fused ops (or with
  RLPOST_FUSED_RMS_NORM=0) both go through torch.compile (rlpost.backends.compiled), which
  makes each one or two kernels.
The megatron trainer's layers call it (megatron.kernels); the torch trainer puts it in place
of transformers' Llama-style RMSNorm modules on CUDA (`fuse_rms_norms`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlpost import switches
from rlpost.backends.compiled import compiled


def _fused_rms_norm() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    """torch's fused RMSNorm forward and backward ops where this torch has them (2.8 and later:
    `aten._fused_rms_norm` -> (out, rstd), `aten._fused_rms_norm_backward` -> (grad_input,
    grad_weight)), else None."""
    ops = torch.ops.aten
    if not (hasattr(ops, "_fused_rms_norm") and hasattr(ops, "_fused_rms_norm_backward")):
        return None
    return ops._fused_rms_norm.default, ops._fused_rms_norm_backward.default


FUSED_RMS_NORM = _fused_rms_norm()
FUSED_RMS_NORM_DEVICES = frozenset(
    device
    for device in ("cuda",)
    if FUSED_RMS_NORM is not None
    and switches.FUSED_RMS_NORM.value() != "0"
    and torch._C._dispatch_has_kernel_for_dispatch_key("aten::_fused_rms_norm", device.upper())
    and torch._C._dispatch_has_kernel_for_dispatch_key(
        "aten::_fused_rms_norm_backward", device.upper()
    )
)
"""Devices whose fused RMSNorm kernels this torch build has (CUDA builds; a CPU build has
none, and the ops have no CPU kernel), unless RLPOST_FUSED_RMS_NORM=0."""


class _RMSNorm(torch.autograd.Function):
    """On a device of FUSED_RMS_NORM_DEVICES, with weight and input of one dtype: torch's fused
    kernels, keeping the input, the weight and each row's float32 1/rms. Elsewhere: torch's
    rms_norm forward, keeping the input alone (torch's composite rms_norm keeps float32
    copies of the input and the normalised output as well); the backward recomputes the
    reciprocal root mean square from it in float32."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        shape = [x.shape[-1]]
        ctx.fused = (
            FUSED_RMS_NORM is not None
            and x.device.type in FUSED_RMS_NORM_DEVICES
            and weight.dtype == x.dtype
        )
        if ctx.fused:
            assert FUSED_RMS_NORM is not None
            out, rstd = FUSED_RMS_NORM[0](x, shape, weight, eps)
            ctx.save_for_backward(x, weight, rstd)
            return cast(Tensor, out)
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        return _forward(x, weight, eps)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        if ctx.fused:
            assert FUSED_RMS_NORM is not None
            x, weight, rstd = ctx.saved_tensors
            mask = [bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])]
            grad_x, grad_weight = FUSED_RMS_NORM[1](
                grad.contiguous(), x, [x.shape[-1]], rstd, weight, mask
            )
            return grad_x, grad_weight, None
        x, weight = ctx.saved_tensors
        grad_x, grad_weight = _backward(grad, x, weight, ctx.eps)
        return grad_x, grad_weight, None


@compiled
def _forward(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return F.rms_norm(x, [x.shape[-1]], weight, eps)


@compiled
def _backward(grad: Tensor, x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """The input's and the weight's gradients in float32, 1/rms recomputed from the input."""
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    normed = xf * rstd
    g = grad.float()
    grad_weight = (g * normed).reshape(-1, x.shape[-1]).sum(0)
    scaled = g * weight.float()
    grad_x = rstd * (scaled - normed * (scaled * normed).mean(-1, keepdim=True))
    return grad_x.to(x.dtype), grad_weight.to(weight.dtype)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """weight * x / rms(x) over the last dim (the module docstring says what it keeps)."""
    return cast(Tensor, _RMSNorm.apply(x, weight, eps))  # type: ignore[no-untyped-call]


def _standard_eps(module: nn.Module) -> float | None:
    """The epsilon of a transformers RMSNorm module that computes weight * x / rms(x) exactly
    (Llama, Mistral, Qwen2/3, GLM-4 and the like); None for anything else (Gemma's 1 +
    weight, a bias, a norm over more than the last dim)."""
    weight = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if not isinstance(weight, nn.Parameter) or weight.dim() != 1 or not isinstance(eps, float):
        return None
    cls = cast(type, type(module))  # nn.Module declares a __hash__ mypy will not hash
    return eps if _computes_rms_norm(cls, weight.shape[0], eps) else None


@functools.cache
def _computes_rms_norm(cls: type, width: int, eps: float) -> bool:
    """Whether a fresh `cls(width, eps=eps)` computes `rms_norm`'s arithmetic on random rows
    (one probe per class, width and epsilon); a class built otherwise, or whose forward wants
    more, does not."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, width, generator=generator)  # float32, as transformers computes it
    w = 1.0 + torch.randn(width, generator=generator)
    try:
        probe = cls(width, eps=eps).float()
        with torch.no_grad():
            cast(Tensor, probe.weight).copy_(w)
            theirs = probe(x)
        same = isinstance(theirs, Tensor) and theirs.shape == x.shape
    except Exception:
        return False
    ours = w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return same and torch.allclose(theirs, ours, rtol=1e-5, atol=1e-6)


def fuse_rms_norms(model: nn.Module) -> int:
    """Route every transformers RMSNorm module of `model` that computes the standard
    arithmetic (`_standard_eps`) through `rms_norm`; returns how many. Its parameters, their
    names and the state dict are unchanged: only the forward is replaced."""
    fused = 0
    for module in model.modules():
        eps = _standard_eps(module) if type(module).__name__.endswith("RMSNorm") else None
        if eps is None:
            continue

        def forward(x: Tensor, _module: nn.Module = module, _eps: float = eps) -> Tensor:
            return rms_norm(x, cast(Tensor, _module.weight), _eps)

        module.forward = forward
        fused += 1
    return fused
