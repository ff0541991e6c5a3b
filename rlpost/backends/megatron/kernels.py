"""The elementwise pieces of a decoder layer, each behind one function with a torch path.

Every function here computes in the activations' own dtype wherever the arithmetic allows it,
instead of a float32 copy of the activations and a cast back:
- `rms_norm` (rlpost.backends.rms_norm, shared with the torch trainer): on CUDA torch's fused
  RMSNorm forward and backward kernels, elsewhere `F.rms_norm`'s forward keeping only the
  input and a float32 backward.
- `apply_rope`: rotary embeddings from a per-micro-batch cos/sin table (`rope_table`) in the
  compute dtype (rlpost.backends.rope, shared with the torch trainer): no trigonometry per
  layer, no host reads.
- `packed_mla_rope`: megatron-core's multi-latent attention applies its own RoPE and, for a
  packed batch, splits it by sample with `cu_seqlens.tolist()` and `.item()` on the host for q
  and k in every layer. This one takes each token's position from the micro-batch (attached to
  its cu_seqlens, `attach_positions`) and gathers the angles in one indexing op.
- `packed_attention`: causal attention within each packed sample. Where torch's flash-attention
  varlen kernel applies (CUDA, bf16/fp16, no CP, no dropout) it runs on the THD tensors as they
  are, its work and memory proportional to the real tokens; elsewhere SDPA over the samples as
  padded batches, one per group of samples of similar lengths (`[S, W]`, W the group's longest
  sample; at most 1.25 rows a token), which the CPU tests run.
- `swiglu` (rlpost.backends.swiglu, shared with the torch trainer): silu(gate) * up as one
  autograd function that keeps only its input for backward (megatron-core's unfused path also
  keeps silu(gate), a third tensor of the MLP's width).
- `fuse_adam`: torch's fused AdamW kernel for the optimizer megatron-core builds without
  TransformerEngine or Apex (one kernel per step instead of a dozen per parameter).
RoPE and SwiGLU are autograd functions whose forward and backward arithmetic is compiled on
CUDA (rlpost.backends.compiled: a Triton kernel or two each, instead of one kernel per
operation) and eager elsewhere; RoPE keeps nothing for backward but the micro-batch's table.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlpost import switches
from rlpost.backends import rope as rotary
from rlpost.backends import sdpa
from rlpost.backends.megatron.packed import AttentionIndex, RopeTable
from rlpost.backends.rms_norm import rms_norm
from rlpost.backends.swiglu import swiglu

__all__ = ["fuse_adam", "packed_attention", "rms_norm", "swiglu"]

log = logging.getLogger(__name__)


# ---- rotary embeddings ------------------------------------------------------------------------


def inverse_frequencies(head_dim: int, rotary_percent: float, base: float) -> Tensor:
    """megatron-core's RotaryEmbedding.inv_freq: the rotary part of each head, in float32."""
    dim = int(head_dim * rotary_percent) if rotary_percent < 1.0 else head_dim
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))


def rope_table(
    positions: Tensor, inv_freq: Tensor, interleaved: bool, dtype: torch.dtype, scale: float = 1.0
) -> RopeTable:
    """cos/sin [t, 1, rotary dim] for token positions [t], on the positions' device, times
    `scale` (YaRN's attention factor, `rope.scaled_frequencies`). The angle is taken in
    float32 (as megatron-core does), the table is stored in the compute dtype."""
    angles = torch.outer(positions.to(torch.float32), inv_freq.to(positions.device))
    if interleaved:
        angles = angles.repeat_interleave(2, dim=-1)
    else:
        angles = torch.cat((angles, angles), dim=-1)
    angles = angles.unsqueeze(1)
    cos, sin = angles.cos(), angles.sin()
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return RopeTable(cos.to(dtype), sin.to(dtype))


def apply_rope(x: Tensor, rope: RopeTable, interleaved: bool) -> Tensor:
    """x [t, heads, d] rotated by each token's angles; the dims past the rotary part (partial
    rotary, GLM-4) pass through."""
    return rotary.rope(x, rope.cos, rope.sin, interleaved)


# ---- RoPE inside multi-latent attention ---------------------------------------------------------

POSITIONS_ATTR = "rlpost_positions"
"""The attribute of a micro-batch's cu_seqlens tensors that holds each local token's position in
its sample ([t_local], on the device): megatron-core's MLA hands RoPE the cu_seqlens alone."""


def attach_positions(cu_seqlens: Sequence[Tensor | None], positions: Tensor) -> None:
    """Give `packed_mla_rope` the tokens' positions through the cu_seqlens MLA passes it."""
    for cu in cu_seqlens:
        if cu is not None:
            setattr(cu, POSITIONS_ATTR, positions)


def packed_mla_rope(
    t: Tensor,
    freqs: Tensor,
    config: Any,
    cu_seqlens: Tensor | None = None,
    mscale: float = 1.0,
    cp_group: Any = None,
) -> Tensor:
    """megatron-core's `apply_rotary_pos_emb` as MLA calls it. For a packed micro-batch of
    rlpost's (cu_seqlens carrying positions) t [t, heads, d] is rotated by freqs [max_s, 1, 1,
    d] at each token's position in one gather: what megatron-core computes sample by sample
    (rope_utils._apply_rotary_pos_emb_thd, the CP chunks included, as positions are this rank's
    own), without reading cu_seqlens on the host. Anything else goes to megatron-core's."""
    from megatron.core.models.common.embeddings import rope_utils

    positions = getattr(cu_seqlens, POSITIONS_ATTR, None)
    if positions is None or config.apply_rope_fusion:
        applied = rope_utils.apply_rotary_pos_emb(t, freqs, config, cu_seqlens, mscale, cp_group)
        return cast(Tensor, applied)
    return cast(
        Tensor,
        rope_utils._apply_rotary_pos_emb_bshd(
            t.unsqueeze(1),
            freqs[positions],
            rotary_interleaved=config.rotary_interleaved,
            multi_latent_attention=config.multi_latent_attention,
            mscale=mscale,
        ).squeeze(1),
    )


# ---- attention over packed samples ------------------------------------------------------------


def _varlen_kernel() -> tuple[Callable[..., Any] | None, bool]:
    """torch's `varlen_attn` where this torch has it with the keywords used here (scale and a
    causal window), else None; and whether it takes `enable_gqa`. torch 2.11's has no such
    keyword and runs flash attention's own kernel, which takes fewer key/value heads than query
    heads as they are; later torch asks for `enable_gqa=True` before it does the same."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None, False
    keywords = inspect.signature(varlen_attn).parameters
    if not {"scale", "window_size"} <= keywords.keys():
        return None, False
    return varlen_attn, "enable_gqa" in keywords


VARLEN_ATTN, VARLEN_GQA_KEYWORD = _varlen_kernel()
VARLEN_DTYPES = (torch.bfloat16, torch.float16)
VARLEN_MAX_HEAD_DIM = 256
"""Flash attention's head sizes: a multiple of 8, at most 256 (at most 192 for a backward on
sm86/sm89, whose shared memory is smaller)."""


def varlen_applies(
    query: Tensor, key: Tensor, value: Tensor, index: AttentionIndex, dropout_p: float
) -> bool:
    """Whether `packed_attention` runs torch's flash-attention varlen kernel. All must hold:
    - torch has `torch.nn.attention.varlen.varlen_attn` with scale and window_size;
    - the micro-batch carries `index.cu_seqlens` (no context parallelism: each sample's rows are
      one contiguous run, packed.attention_index; under CP each query sees keys gathered from
      the whole group through a mask, which the kernel does not take);
    - no attention dropout (the kernel has none);
    - query, key and value are CUDA tensors of one dtype, bf16 or fp16, on a GPU of compute
      capability 8.0 or later;
    - query, key and value share one head size, a multiple of 8 and at most 256 (192 when a
      gradient is wanted on sm86/sm89). Multi-latent attention's query and value head sizes
      differ, so it takes the padded path.
    Everything here is known on the host (shapes, dtypes, the device's properties): nothing is
    read from a tensor."""
    if VARLEN_ATTN is None or index.cu_seqlens is None or dropout_p > 0.0:
        return False
    if not (query.is_cuda and query.dtype in VARLEN_DTYPES):
        return False
    if not query.dtype == key.dtype == value.dtype:
        return False
    head_dim = query.shape[-1]
    if not (key.shape[-1] == value.shape[-1] == head_dim and head_dim % 8 == 0):
        return False
    capability = torch.cuda.get_device_capability(query.device)
    wants_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    small_smem = capability in ((8, 6), (8, 9)) and wants_grad
    return capability >= (8, 0) and head_dim <= (192 if small_smem else VARLEN_MAX_HEAD_DIM)


def packed_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    index: AttentionIndex,
    *,
    scale: float,
    dropout_p: float = 0.0,
) -> Tensor:
    """Causal attention within each sample of a packed micro-batch: query [t, hq, d], key and
    value [tk, hkv, d] and [tk, hkv, dv] (tk = t, or under CP the group's gathered keys, which
    `index` addresses) -> [t, hq * dv]. `varlen_attention` where `varlen_applies` (its rule is
    there) unless `padded_pays` for this micro-batch, else `padded_attention`; the two compute
    the same function. An error of the varlen kernel propagates: it is never retried on the
    other path."""
    if varlen_applies(query, key, value, index, dropout_p) and not padded_pays(
        query, key, value, index, scale
    ):
        ATTENTION_PATHS["varlen"] += 1
        return varlen_attention(query, key, value, index, scale=scale)
    ATTENTION_PATHS["padded"] += 1
    return padded_attention(query, key, value, index, scale=scale, dropout_p=dropout_p)


ATTENTION_PATHS: Counter[str] = Counter()
"""packed_attention's calls in this process by the path they took ("varlen", "padded");
benchmarks/megatron_train.py prints the padded share."""


PADDED_MARGIN = 0.9
"""The padded path is taken when its predicted time is under this share of the varlen
kernel's, so that a measurement's noise cannot move a micro-batch to the slower path."""
MEASURE_MIN_TOKENS = 4096
"""The fewest tokens a micro-batch needs for the paths to be timed on it: on fewer, kernel
launches rather than the attention would decide (such micro-batches keep the varlen kernel
until one large enough comes)."""
_padded_speedups: dict[tuple[Any, ...], float] = {}
"""Per GPU, head shape and dtype: the padded path's speed over the varlen kernel's per unit
of attention work, as measured (0.0: not to be taken)."""


def padded_pays(
    query: Tensor, key: Tensor, value: Tensor, index: AttentionIndex, scale: float
) -> bool:
    """Whether the padded path (SDPA over the samples padded to their group's longest; on
    Hopper cuDNN's attention) beats the varlen kernel on this micro-batch: its extra work for
    the padding (`index.padded_work`, known on the host) under PADDED_MARGIN times its speed
    over the varlen kernel's. That speed is measured once per process, GPU, head shape and
    dtype, on the first micro-batch of at least MEASURE_MIN_TOKENS tokens
    (`measure_padded_speedup`), and logged; a failed measurement leaves the varlen kernel.
    RLPOST_PACKED_ATTENTION=varlen skips all of it."""
    if switches.PACKED_ATTENTION.value() == "varlen" or not index.padded_work:
        return False
    shape = (query.device, query.shape[1], key.shape[1], query.shape[2], query.dtype)
    speedup = _padded_speedups.get(shape)
    if speedup is None:
        if query.shape[0] < MEASURE_MIN_TOKENS:
            return False
        try:
            speedup = measure_padded_speedup(query, key, value, index, scale)
        except Exception as error:  # measuring must not stop training: the varlen kernel stays
            log.warning("packed attention: measuring the padded path failed (%s: %s); the "
                        "varlen kernel stays", type(error).__name__, error)  # fmt: skip
            speedup = 0.0
        _padded_speedups[shape] = speedup
        log.info(
            "packed attention, %d/%d heads of %d (%s) on %s: the padded path runs %.2fx the "
            "varlen kernel's speed per unit of work; micro-batches whose padding adds less "
            "than %.2fx the work take it (RLPOST_PACKED_ATTENTION=varlen: never)",
            query.shape[1], key.shape[1], query.shape[2], query.dtype, query.device,
            speedup, PADDED_MARGIN * speedup,
        )  # fmt: skip
    if sdpa.cudnn_device(query) and not sdpa.planned(padded_shapes(query, key, index)):
        return False  # cuDNN would build a plan for each new shape (sdpa.CUDNN_PLANS)
    return index.padded_work < PADDED_MARGIN * speedup


def padded_shapes(query: Tensor, key: Tensor, index: AttentionIndex) -> list[sdpa.Shape]:
    """The shapes of the padded path's SDPA calls on this micro-batch, one per group."""
    shapes = []
    for group in index.groups:
        samples, width = group.rows.shape
        keys = group.rows if group.keys is None else group.keys
        shapes.append(sdpa.shape_of(
            query,
            (samples, query.shape[1], width, query.shape[2]),
            (samples, key.shape[1], keys.shape[1], key.shape[2]),
            masked=group.mask is not None,  # gathered rows: the BSHD layout
        ))  # fmt: skip
    return shapes


def measure_padded_speedup(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    index: AttentionIndex,
    scale: float,
    *,
    repeats: int = 3,
    synchronize: Callable[[], None] | None = None,
) -> float:
    """The padded path's speed over the varlen kernel's per unit of attention work: each one's
    forward and backward on copies of this micro-batch's query, key and value (the best of
    `repeats` after a warm-up, between two device synchronisations), the varlen kernel's time
    over the padded path's, times the padded path's extra work (`index.padded_work`). Runs
    with gradients on whatever the caller's mode (a recompute's first forward runs without)."""
    sync = synchronize or (lambda: torch.cuda.synchronize(query.device))
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (query, key, value))
    leaves = (q, k, v)

    def varlen() -> Tensor:
        return varlen_attention(q, k, v, index, scale=scale)

    def padded() -> Tensor:
        return padded_attention(q, k, v, index, scale=scale)

    def seconds(path: Callable[[], Tensor]) -> float:
        best = float("inf")
        for attempt in range(repeats + 1):
            sync()
            start = time.perf_counter()
            out = path()
            torch.autograd.grad(out, leaves, out.detach())
            sync()
            if attempt:  # the first is the warm-up
                best = min(best, time.perf_counter() - start)
        return best

    with torch.enable_grad():
        return seconds(varlen) / seconds(padded) * index.padded_work


def varlen_attention(
    query: Tensor, key: Tensor, value: Tensor, index: AttentionIndex, *, scale: float
) -> Tensor:
    """torch's flash-attention varlen kernel on the THD tensors: no padding, no gather or
    scatter, and for backward it keeps query, key, value, its output and the float32
    log-sum-exp per query row and head. Sample boundaries and the longest sample's length come
    from packing (`index.cu_seqlens`, `index.max_seqlen`), so nothing is read on the host."""
    if VARLEN_ATTN is None:
        raise ValueError(
            f"varlen_attention: torch {torch.__version__} has no "
            "torch.nn.attention.varlen.varlen_attn taking scale and window_size; "
            "call packed_attention, which takes the padded path there"
        )
    if index.cu_seqlens is None:
        raise ValueError(
            "varlen_attention: index.cu_seqlens is None (a micro-batch packed with context "
            "parallelism, whose samples are not contiguous runs of local rows); call "
            "packed_attention, which takes the padded path for it"
        )
    gqa = {"enable_gqa": key.shape[1] != query.shape[1]} if VARLEN_GQA_KEYWORD else {}
    out = VARLEN_ATTN(
        query,
        key,
        value,
        index.cu_seqlens,
        index.cu_seqlens,
        index.max_seqlen,
        index.max_seqlen,
        scale=scale,
        window_size=(-1, 0),  # causal: each row sees its own sample's rows up to itself
        **gqa,
    )
    return cast(Tensor, out).flatten(1)


def padded_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    index: AttentionIndex,
    *,
    scale: float,
    dropout_p: float = 0.0,
) -> Tensor:
    """SDPA over the samples as padded batches, one per group of samples of similar lengths
    (packed.AttentionIndex): gather each group's rows into [S, hq, W, d] (under CP its keys by
    `keys`), attend, and put each real row back (`index.slots`). Runs on any device and dtype,
    with dropout and the CP mask; on Hopper SDPA tries cuDNN's attention first
    (rlpost.backends.sdpa)."""
    outs = []
    for group in index.groups:
        k_rows = group.rows if group.keys is None else group.keys
        q = query[group.rows].transpose(1, 2)  # [S, np, W, d]
        k = key[k_rows].transpose(1, 2)
        with sdpa.preferred_backends(q, k, masked=group.mask is not None):
            out = F.scaled_dot_product_attention(
                q,
                k,
                value[k_rows].transpose(1, 2),
                # one sample per batch entry, padding after it: without context parallelism
                # plain causal attention is exact for every real row (no mask, so flash kernels
                # apply)
                attn_mask=group.mask,
                dropout_p=dropout_p,
                is_causal=group.mask is None,
                scale=scale,
                enable_gqa=key.shape[1] != query.shape[1],
            )
            outs.append(out.transpose(1, 2).flatten(0, 1))  # [S * W, np, dv]
    if not outs:  # no local rows
        return query.new_empty(0, query.shape[1] * value.shape[-1])
    padded = outs[0] if len(outs) == 1 else torch.cat(outs)
    return padded[index.slots].flatten(1)


# ---- SwiGLU -----------------------------------------------------------------------------------


class SwiGLU(nn.Module):
    """The MLP activation module megatron-core's MLP calls on fc1's whole output."""

    def __init__(self, config: Any = None) -> None:
        super().__init__()

    def forward(self, x: Tensor) -> Tensor:
        return swiglu(x)

    def sharded_state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {}  # no weights (megatron-core's MLP asks each child for its checkpoint entries)


# ---- the optimizer ----------------------------------------------------------------------------


def fuse_adam(optimizer: Any, devices: tuple[str, ...] = ("cuda",)) -> int:
    """Switch every torch Adam/AdamW inside megatron-core's optimizer wrappers to torch's
    fused kernel where all its parameters are on `devices`; returns how many were switched.
    Call it again after loading optimizer state: torch restores each group's saved flags."""
    switched = 0
    for inner in _torch_optimizers(optimizer):
        if not isinstance(inner, torch.optim.Adam | torch.optim.AdamW):
            continue
        params = [p for group in inner.param_groups for p in group["params"]]
        on_devices = all(p.device.type in devices and p.is_floating_point() for p in params)
        if not params or not on_devices:
            continue
        for group in inner.param_groups:
            group["fused"], group["foreach"] = True, False
        inner.defaults["fused"], inner.defaults["foreach"] = True, False
        switched += 1
    return switched


def _torch_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    """The torch optimizers under megatron-core's (chained, mixed-precision) wrappers."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return [optimizer]
    chained = getattr(optimizer, "chained_optimizers", None)
    if chained is not None:
        return [inner for child in chained for inner in _torch_optimizers(child)]
    inner = getattr(optimizer, "optimizer", None)
    return [] if inner is None or inner is optimizer else _torch_optimizers(inner)
