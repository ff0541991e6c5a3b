"""FP8 weights as the published DeepSeek-V3 and GLM-4.5 FP8 checkpoints store them.

A linear layer's weight W (out x in) is stored as float8_e4m3fn Q with a float32
`weight_scale_inv` S holding one scale per block of `block_size` (rows x columns):
W ~= Q * S (S broadcast over its block). The scale of a block is its absolute maximum over
e4m3's largest finite value (448), so every block uses the format's whole range and the
rounding error of an element is at most half a step of e4m3 at its magnitude (3 mantissa
bits: a relative error of 2^-4), or the format's subnormal step (2^-9) times the scale for
the smallest values. `strategy: channel` is the same with one scale per output row
(block_size = [1, in]).

Which weights: the 2-D `.weight` of linear layers, never norms, embeddings, the output head
or an MoE router's gate (their FP8 versions would cost accuracy for little memory), as in
the published checkpoints. config.json carries `quantization_config`:
`{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
"weight_block_size": [128, 128]}`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping

import torch
from torch import Tensor

from rlpost.backends.fp8_format import SCALE_SUFFIX, Fp8Error, Fp8Format, folder_format

__all__ = ["SCALE_SUFFIX", "Fp8Error", "Fp8Format", "folder_format"]

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
# Weights kept in their own dtype: embeddings, output heads (an MTP layer's `shared_head.head`
# too), norms, an MoE router's gate (DeepSeek-V3 / GLM-4.5 `mlp.gate`, Qwen-MoE
# `shared_expert_gate`).
KEPT = re.compile(
    r"(embed_tokens|embed|wte|lm_head|output_layer|shared_head\.head|norm|\.mlp\.gate\."
    r"|shared_expert_gate\.)"
)


def quantized(name: str, shape: tuple[int, ...]) -> bool:
    """Whether a weight of this name and shape is stored in FP8 (see the module docstring)."""
    return len(shape) == 2 and name.endswith(".weight") and KEPT.search(name) is None


def quantize(weight: Tensor, fmt: Fp8Format) -> tuple[Tensor, Tensor]:
    """(float8_e4m3fn weight, float32 scale_inv per block), on the weight's device."""
    rows, cols = fmt.blocks(tuple(weight.shape))
    out, inp = weight.shape
    grid_r, grid_c = fmt.scale_shape(tuple(weight.shape))
    if (grid_r * rows, grid_c * cols) == (out, inp):
        padded = weight.float()
    else:
        padded = weight.new_zeros((grid_r * rows, grid_c * cols), dtype=torch.float32)
        padded[:out, :inp] = weight
    blocks = padded.view(grid_r, rows, grid_c, cols)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    scaled = (blocks / scale[:, None, :, None]).clamp_(-FP8_MAX, FP8_MAX)
    q = scaled.to(FP8_DTYPE).view(grid_r * rows, grid_c * cols)
    if q.shape != weight.shape:
        q = q[:out, :inp].contiguous()
    return q, scale.contiguous()


def dequantize(q: Tensor, scale_inv: Tensor, fmt: Fp8Format, dtype: torch.dtype) -> Tensor:
    """Q x S per block, as `dtype`."""
    rows, cols = fmt.blocks(tuple(q.shape))
    if tuple(scale_inv.shape) != fmt.scale_shape(tuple(q.shape)):
        raise Fp8Error(
            f"a weight of shape {list(q.shape)} has scales of shape {list(scale_inv.shape)}, "
            f"not {list(fmt.scale_shape(tuple(q.shape)))} for blocks of {rows}x{cols}: the "
            "config's weight_block_size does not match the checkpoint"
        )
    expanded = scale_inv.float().repeat_interleave(rows, 0)[: q.shape[0]]
    expanded = expanded.repeat_interleave(cols, 1)[:, : q.shape[1]]
    return (q.float() * expanded).to(dtype)


def quantize_named(
    tensors: Iterable[tuple[str, Tensor]], fmt: Fp8Format
) -> Iterator[tuple[str, Tensor]]:
    """Each weight as the FP8 checkpoint stores it: quantised ones as the FP8 weight and its
    `<name>_scale_inv`, the others as they are."""
    for name, tensor in tensors:
        if quantized(name, tuple(tensor.shape)):
            q, scale = quantize(tensor, fmt)
            yield name, q
            yield name + SCALE_SUFFIX, scale
        else:
            yield name, tensor


def dequantize_state(
    state: Mapping[str, Tensor], fmt: Fp8Format, dtype: torch.dtype
) -> dict[str, Tensor]:
    """A state dict with every FP8 weight dequantised (its scale consumed) to `dtype`."""
    out: dict[str, Tensor] = {}
    for name, tensor in state.items():
        if name.endswith(SCALE_SUFFIX) and name.removesuffix(SCALE_SUFFIX) in state:
            continue
        if tensor.dtype == FP8_DTYPE:
            scale = state.get(name + SCALE_SUFFIX)
            if scale is None:
                raise Fp8Error(f"FP8 weight '{name}' has no '{name}{SCALE_SUFFIX}'")
            out[name] = dequantize(tensor, scale, fmt, dtype)
        else:
            out[name] = tensor
    return out
