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

import math
from typing import Any, cast

import torch
from torch import Tensor

from rlpost.backends.compiled import compiled
from rlpost.schema.model import RopeScalingConfig


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


# ---- context extension ---------------------------------------------------------------------------


def scaled_frequencies(
    inv_freq: Tensor, scaling: RopeScalingConfig | None, base: float
) -> tuple[Tensor, float]:
    """The inverse frequencies of the rotary dims under `scaling` (model.rope_scaling), and the
    factor cos and sin are multiplied by; unscaled, `inv_freq` and 1. The formulas are those
    transformers' rotary embeddings use for the same config (the checkpoint's own):
    - llama3 (Llama 3.1): wavelengths longer than the original context / low_freq_factor are
      stretched by `factor`, shorter than it / high_freq_factor kept, those between blended;
    - yarn (Peng et al. 2023, "YaRN"): each dim blended between the original frequency and one
      interpolated by `factor`, by a linear ramp over the dims that turn between beta_fast and
      beta_slow times over the original context; cos and sin scaled by the attention
      temperature 0.1 ln(factor) + 1, or with mscale_all_dim the ratio of the two mscales."""
    if scaling is None:
        return inv_freq, 1.0
    if scaling.type == "llama3":
        return _llama3(inv_freq, scaling), 1.0
    return _yarn(inv_freq, scaling, base), _yarn_attention_factor(scaling)


def _llama3(inv_freq: Tensor, s: RopeScalingConfig) -> Tensor:
    original = s.original_max_position_embeddings
    long_wave, short_wave = original / s.low_freq_factor, original / s.high_freq_factor
    wavelength = 2 * math.pi / inv_freq
    stretched = torch.where(wavelength > long_wave, inv_freq / s.factor, inv_freq)
    blend = (original / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    blended = (1 - blend) * stretched / s.factor + blend * stretched
    between = (wavelength >= short_wave) & (wavelength <= long_wave)
    return torch.where(between, blended, stretched)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature for a context stretched `factor` times (its eq. 21)."""
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def _yarn_attention_factor(s: RopeScalingConfig) -> float:
    if s.mscale and s.mscale_all_dim:
        return yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim)
    return yarn_mscale(s.factor)


def _yarn(inv_freq: Tensor, s: RopeScalingConfig, base: float) -> Tensor:
    dim = 2 * inv_freq.numel()

    def turning_dim(rotations: float) -> float:
        """The dim whose frequency turns `rotations` times over the original context."""
        context = s.original_max_position_embeddings / (rotations * 2 * math.pi)
        return dim * math.log(context) / (2 * math.log(base))

    low = max(math.floor(turning_dim(s.beta_fast)), 0)
    high: float = min(math.ceil(turning_dim(s.beta_slow)), dim - 1)
    if low == high:
        high += 0.001  # a ramp of no width: a step
    dims = torch.arange(dim // 2, dtype=torch.float32, device=inv_freq.device)
    ramp = (dims - low) / (high - low)
    extrapolated = 1 - ramp.clamp(0, 1)  # 1: the original frequency, 0: interpolated
    return inv_freq / s.factor * (1 - extrapolated) + inv_freq * extrapolated
