"""transformers' decoder layers on the kernels the megatron trainer runs, on CUDA.

transformers computes what lies between a layer's matmuls eagerly, one kernel per operation
(its RMSNorm in float32 copies, RoPE as five kernels for q and five for k, the MLP's silu and
product), and keeps more for backward than the arithmetic needs. On a device of
KERNEL_DEVICES (CUDA) `fuse_kernels` routes, in a Llama-style model (Llama, Mistral, Qwen2/3
and any model built the same way):
- each RMSNorm module that computes weight * x / rms(x) through rlpost.backends.rms_norm
  (torch's fused kernels: `rms_norm.fuse_rms_norms`);
- each MLP that computes down(silu(gate) * up) from its gate and up projections, or from one
  merged projection (GLM-4, Phi-3), through rlpost.backends.swiglu (keeps gate and up for
  backward, not silu(gate) as well; one compiled kernel each way);
- the rotary embedding its attention applies through rlpost.backends.rope (one compiled
  kernel each way for q and for k, keeping only the cos/sin table every layer shares).
Each is probed first on small random inputs, and one that computes anything else keeps its own
forward: Gemma's GeGLU MLP or its 1 + weight norm, GLM-4's interleaved partial rotary.
Parameters, their names and the state dict are unchanged.

transformers' attention classes call their modeling module's `apply_rotary_pos_emb` by name,
so the rotary function is replaced in that module, for the whole process: the replacement runs
rlpost's kernel for a packed row on a device of KERNEL_DEVICES (one row of samples, the
table as wide as a head) and transformers' own function for anything else, so another model
of the same architecture elsewhere in the process (on the CPU, or batched) computes as before.
"""

from __future__ import annotations

import copy
import functools
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlpost.backends import rms_norm, rope, swiglu

KERNEL_DEVICES = frozenset({"cuda"})
"""Devices on which the torch trainer's transformers layers run rlpost's MLP and RoPE kernels
(the RMSNorm kernels where rms_norm.FUSED_RMS_NORM_DEVICES also has the device)."""
ROTARY_FUNCTION = "apply_rotary_pos_emb"
ORIGINAL_ATTR = "rlpost_original"


@dataclass(frozen=True)
class Fused:
    """How many of a model's modules `fuse_kernels` routed through rlpost's kernels."""

    norms: int
    mlps: int
    rotary: int  # modeling modules whose rotary function was replaced (0 or 1 per model)


def fuse_kernels(model: nn.Module, device_type: str) -> Fused:
    """Route `model`'s standard norms, MLPs and rotary embedding through rlpost's kernels when
    its layers run on `device_type` (the module docstring); nothing elsewhere."""
    norms = 0
    if device_type in rms_norm.FUSED_RMS_NORM_DEVICES:
        norms = rms_norm.fuse_rms_norms(model)
    if device_type not in KERNEL_DEVICES:
        return Fused(norms, 0, 0)
    return Fused(norms, fuse_mlps(model), fuse_rotary(model))


# ---- the MLP ----------------------------------------------------------------------------------

SPLIT = ("gate_proj", "up_proj", "down_proj")  # Llama, Mistral, Qwen2/3
MERGED = ("gate_up_proj", "down_proj")  # GLM-4, Phi-3: gate then up in one projection


def fuse_mlps(model: nn.Module) -> int:
    """Give every gated MLP of `model` that computes down(silu(gate) * up) from its own
    projections (`mlp_form`) a forward through rlpost.backends.swiglu; returns how many."""
    fused = 0
    for module in model.modules():
        form = mlp_form(module)
        if form is None:
            continue

        def forward(x: Tensor, _module: nn.Module = module, _form: object = form) -> Tensor:
            project = _module.get_submodule
            if _form == MERGED:
                hidden = swiglu.swiglu(project("gate_up_proj")(x))
            else:
                hidden = swiglu.swiglu_pair(project("gate_proj")(x), project("up_proj")(x))
            return cast(Tensor, project("down_proj")(hidden))

        module.forward = forward
        fused += 1
    return fused


def mlp_form(module: nn.Module) -> tuple[str, ...] | None:
    """SPLIT or MERGED when `module`'s own forward computes down(silu(gate) * up) from those
    projections, else None. Tried on a copy of the module whose projections are small random
    ones (a module on the meta device, as every rank but the one that reads the checkpoint
    builds it, can be tried too)."""
    if "forward" in vars(module):
        return None
    for form in (SPLIT, MERGED):
        if all(isinstance(getattr(module, name, None), nn.Linear) for name in form):
            return form if _computes_swiglu(module, form) else None
    return None


def _computes_swiglu(module: nn.Module, form: tuple[str, ...]) -> bool:
    generator = torch.Generator().manual_seed(0)
    hidden, width = 4, 6
    shapes = {"gate_proj": (hidden, width), "up_proj": (hidden, width),
              "gate_up_proj": (hidden, 2 * width), "down_proj": (width, hidden)}  # fmt: skip
    probe = copy.copy(module)  # its attributes (act_fn, config) shared, its children its own
    probe._modules = dict(module._modules)
    for name in form:
        layer = nn.Linear(*shapes[name], bias=getattr(module, name).bias is not None)
        with torch.no_grad():
            for p in layer.parameters():
                p.copy_(torch.randn(p.shape, generator=generator))
        probe._modules[name] = layer
    x = torch.randn(2, 3, hidden, generator=generator)
    try:
        with torch.no_grad():
            theirs = type(module).forward(probe, x)
            out = {name: probe.get_submodule(name)(x) for name in form[:-1]}
            if form == MERGED:
                gate, up = out["gate_up_proj"].chunk(2, dim=-1)
            else:
                gate, up = out["gate_proj"], out["up_proj"]
            ours = probe.get_submodule("down_proj")(F.silu(gate) * up)
    except Exception:
        return False
    return (
        isinstance(theirs, Tensor)
        and theirs.shape == ours.shape
        and torch.allclose(theirs, ours, rtol=1e-5, atol=1e-6)
    )


# ---- the rotary embedding ---------------------------------------------------------------------


def fuse_rotary(model: nn.Module) -> int:
    """Replace the rotary function of the modeling module(s) whose attention classes `model`
    uses (`_rotary_module`) with one that runs `rope.rope` for packed rows; returns how many
    modules now have it (a module already replaced counts again)."""
    modules = {m for m in map(_rotary_module, model.modules()) if m is not None}
    for module in modules:
        current = getattr(module, ROTARY_FUNCTION)
        if not hasattr(current, ORIGINAL_ATTR):
            setattr(module, ROTARY_FUNCTION, _packed_rotary(current))
    return len(modules)


def _rotary_module(attention: nn.Module) -> Any | None:
    """The modeling module whose `apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`
    `attention`'s forward calls by name, when that function computes q cos + rotate_half(q)
    sin (`_is_standard_rotary`); None for any other module."""
    forward = getattr(type(attention), "forward", None)
    code = getattr(inspect.unwrap(forward), "__code__", None) if callable(forward) else None
    if code is None or ROTARY_FUNCTION not in code.co_names:
        return None
    module = sys.modules.get(type(attention).__module__)
    function = getattr(module, ROTARY_FUNCTION, None)
    if function is None or not callable(function):
        return None
    original = getattr(function, ORIGINAL_ATTR, function)
    return module if _is_standard_rotary(original) else None


@functools.cache
def _is_standard_rotary(function: Callable[..., Any]) -> bool:
    """Whether transformers' `function` takes (q, k, cos, sin, unsqueeze_dim) and computes, on
    random inputs and an arbitrary table, what `rope.rope` computes. Transformers 5.2x hands
    the function to the `kernels` package, which wraps it in a module taking (*args,
    **kwargs): such a wrapper is judged by what it computes alone."""
    try:
        names = list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return False
    if names not in (["q", "k", "cos", "sin", "unsqueeze_dim"], ["args", "kwargs"]):
        return False
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, heads, 5, 8, generator=generator) for heads in (4, 2))
    cos, sin = (torch.randn(1, 5, 8, generator=generator) for _ in range(2))
    try:
        with torch.no_grad():
            theirs = function(q, k, cos, sin, 1)
    except Exception:
        return False
    c, s = _table(cos), _table(sin)
    ours = [_rows(rope._rope.fn(_tokens(x), c, s, False, False)) for x in (q, k)]
    return (
        isinstance(theirs, tuple)
        and len(theirs) == 2
        and all(
            isinstance(t, Tensor) and t.shape == o.shape and torch.allclose(t, o, atol=1e-6)
            for t, o in zip(theirs, ours, strict=True)
        )
    )


def _tokens(x: Tensor) -> Tensor:
    """[1, heads, t, d] -> [t, heads, d] (a view)."""
    return x[0].transpose(0, 1)


def _rows(x: Tensor) -> Tensor:
    """[t, heads, d] -> [1, heads, t, d] (a view)."""
    return x.transpose(0, 1).unsqueeze(0)


def _table(x: Tensor) -> Tensor:
    """cos or sin [1, t, d] -> [t, 1, d]."""
    return x[0].unsqueeze(1)


def packed_rotary_applies(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, dim: int) -> bool:
    """A packed row (batch 1) on a device of KERNEL_DEVICES, q and k [1, heads, t, d] with a
    table [1, t, d] of their dtype that wants no gradient, unsqueezed at dim 1."""
    return (
        dim == 1
        and q.device.type in KERNEL_DEVICES
        and q.dim() == k.dim() == 4
        and cos.dim() == sin.dim() == 3
        and q.shape[0] == k.shape[0] == cos.shape[0] == sin.shape[0] == 1
        and q.shape[2] == k.shape[2] == cos.shape[1] == sin.shape[1]
        and q.shape[-1] == k.shape[-1] == cos.shape[-1] == sin.shape[-1]
        and q.dtype == k.dtype == cos.dtype == sin.dtype
        and not (cos.requires_grad or sin.requires_grad)
    )


def _packed_rotary(original: Callable[..., tuple[Tensor, Tensor]]) -> Callable[..., Any]:
    """transformers' rotary function, running `rope.rope` where `packed_rotary_applies`."""

    def apply_rotary_pos_emb(
        q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1
    ) -> tuple[Tensor, Tensor]:
        if not packed_rotary_applies(q, k, cos, sin, unsqueeze_dim):
            return original(q, k, cos, sin, unsqueeze_dim)
        c, s = _table(cos), _table(sin)
        return _rows(rope.rope(_tokens(q), c, s)), _rows(rope.rope(_tokens(k), c, s))

    setattr(apply_rotary_pos_emb, ORIGINAL_ATTR, original)
    return apply_rotary_pos_emb
