"""Modules rlpost's layer specs put into megatron-core's blocks.

- `RMSNorm`: HF's RMSNorm arithmetic (normalise in fp32, scale in the input dtype), marked for
  sequence parallelism so megatron-core all-reduces its gradient across the TP group.
- `LatentRMSNorm`: the MLA latent norms, whose epsilon HF fixes at 1e-6 whatever rms_norm_eps.
- `PackedAttention`: core attention over packed samples (megatron's THD layout), with context
  parallelism: K and V are gathered across the CP group and each local query attends to the
  keys at or before its position in its own sample.
- `PostNormRowParallelLinear`: a row-parallel projection followed by an RMSNorm, i.e. GLM-4's
  extra norms after attention and after the MLP (applied before the residual add).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.tensor_parallel import RowParallelLinear
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from torch import Tensor, nn

LATENT_NORM_EPS = 1e-6


class RMSNorm(nn.Module):
    def __init__(
        self, config: TransformerConfig, hidden_size: int, eps: float = 1e-6, **kwargs: Any
    ) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        self.weight.sequence_parallel = config.sequence_parallel  # type: ignore[attr-defined]

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class LatentRMSNorm(RMSNorm):
    """Under sequence parallelism MLA scatters the latents back to sequence shards before
    normalising them, so like the other norms their gradients are summed across TP."""

    def __init__(
        self, config: TransformerConfig, hidden_size: int, eps: float = 1e-6, **kwargs: Any
    ) -> None:
        super().__init__(config, hidden_size, LATENT_NORM_EPS)


class PostNormRowParallelLinear(RowParallelLinear):
    def __init__(self, input_size: int, output_size: int, *, config: Any, **kwargs: Any) -> None:
        super().__init__(input_size, output_size, config=config, **kwargs)
        self.post_norm = RMSNorm(config, output_size, config.layernorm_epsilon)

    def forward(self, x: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor | None]:
        out, bias = super().forward(x, *args, **kwargs)
        if bias is not None:
            out, bias = out + bias, None
        return self.post_norm(out), bias


def gather_along_sequence(x: Tensor, group: dist.ProcessGroup) -> Tensor:
    """All ranks' `x` concatenated along dim 0, rank-major, differentiable."""
    return _GatherSequence.apply(x, group)  # type: ignore[no-any-return]


class _GatherSequence(torch.autograd.Function):
    """All-gather along dim 0 over a group; backward sums the gradients and keeps this rank's
    slice (gloo has no reduce-scatter)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: dist.ProcessGroup) -> Tensor:
        ctx.group = group
        ctx.rank, ctx.size = dist.get_rank(group), dist.get_world_size(group)
        parts = [torch.empty_like(x) for _ in range(ctx.size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad.chunk(ctx.size, dim=0)[ctx.rank].contiguous(), None


def cp_token_positions(cu_seqlens: Tensor, cp_rank: int, cp_size: int) -> tuple[Tensor, Tensor]:
    """(sample index, position in sample) of this CP rank's tokens, in its local order.

    Each sample of length L is cut into 2 x cp chunks; rank r holds chunks r and 2cp-1-r.
    """
    samples, positions = [], []
    for index, length in enumerate(cu_seqlens.diff().tolist()):
        chunk = length // (2 * cp_size)
        first = torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk)
        second = torch.arange((2 * cp_size - 1 - cp_rank) * chunk, (2 * cp_size - cp_rank) * chunk)
        pos = torch.cat([first, second]) if cp_size > 1 else torch.arange(length)
        positions.append(pos)
        samples.append(torch.full_like(pos, index))
    return torch.cat(samples), torch.cat(positions)


class PackedAttention(MegatronModule):
    """Causal attention within each packed sample, optionally context parallel."""

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: Any,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        k_channels: int | None = None,
        v_channels: int | None = None,
        cp_comm_type: str | None = None,
        pg_collection: Any = None,
    ) -> None:
        super().__init__(config=config)
        head_dim = k_channels or config.kv_channels
        self.softmax_scale = softmax_scale or 1.0 / math.sqrt(head_dim)
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        self.cp_group = getattr(pg_collection, "cp", None) or (
            parallel_state.get_context_parallel_group()
        )

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: Tensor | None = None,
        packed_seq_params: PackedSeqParams | None = None,
    ) -> Tensor:
        if packed_seq_params is None:  # [s, b, h, d]: each batch entry is one sample
            s, b = query.shape[:2]
            cu = torch.arange(0, (b + 1) * s, s)
            q, k, v = (x.transpose(0, 1).reshape(b * s, *x.shape[2:]) for x in (query, key, value))
            out = self._attend(q, k, v, cu)
            return out.view(b, s, -1).transpose(0, 1).contiguous()
        cu = packed_seq_params.cu_seqlens_q_padded
        cu = packed_seq_params.cu_seqlens_q if cu is None else cu
        return self._attend(query, key, value, cu.long().cpu())

    def _attend(self, query: Tensor, key: Tensor, value: Tensor, cu_seqlens: Tensor) -> Tensor:
        """query [t, np, d], key [t, ng, d], value [t, ng, dv] -> [t, np * dv]."""
        cp_size, cp_rank = self.cp_group.size(), self.cp_group.rank()
        num_samples = int(cu_seqlens.numel()) - 1
        q_sample, q_pos = cp_token_positions(cu_seqlens, cp_rank, cp_size)
        k_sample, k_pos = q_sample, q_pos
        if cp_size > 1:
            # gathered rows are rank-major, each rank's rows in its own local order
            key = gather_along_sequence(key, self.cp_group)
            value = gather_along_sequence(value, self.cp_group)
            ranks = [cp_token_positions(cu_seqlens, r, cp_size) for r in range(cp_size)]
            k_sample = torch.cat([sample for sample, _ in ranks])
            k_pos = torch.cat([pos for _, pos in ranks])
        # positions are worked out on the host (cu_seqlens is read there); the mask and the
        # gathers run where the activations are (SDPA wants its mask on their device)
        device = query.device
        q_index, q_valid = (t.to(device) for t in group_by_sample(q_sample, q_pos, num_samples))
        mask = None
        if cp_size == 1:
            # rows are each sample's tokens in order, padding after them: plain causal
            # attention is exact for every real row (no mask, so SDPA may use flash kernels)
            k_index = q_index
        else:
            k_index, k_valid = (t.to(device) for t in group_by_sample(k_sample, k_pos, num_samples))
            q_pos, k_pos = q_pos.to(device), k_pos.to(device)
            causal = k_pos[k_index].unsqueeze(1) <= q_pos[q_index].unsqueeze(2)
            mask = causal & k_valid.unsqueeze(1) | ~q_valid.unsqueeze(2)  # pad rows: dropped below
            mask = mask.unsqueeze(1)
        out = F.scaled_dot_product_attention(
            query[q_index].transpose(1, 2),  # [S, np, Lq, d]
            key[k_index].transpose(1, 2),
            value[k_index].transpose(1, 2),
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=mask is None,
            scale=self.softmax_scale,
            enable_gqa=key.shape[1] != query.shape[1],
        )
        rows = out.transpose(1, 2)[q_valid]  # [t, np, dv], grouped by sample
        local = rows[torch.argsort(q_index[q_valid])]
        return local.reshape(local.shape[0], -1)


def group_by_sample(samples: Tensor, positions: Tensor, num_samples: int) -> tuple[Tensor, Tensor]:
    """Token rows grouped per sample in position order: (index [S, W], valid [S, W])."""
    order = torch.argsort(samples * (int(positions.max()) + 1) + positions)
    counts = torch.bincount(samples, minlength=num_samples)
    slot = torch.arange(int(counts.max())).unsqueeze(0)
    starts = (counts.cumsum(0) - counts).unsqueeze(1)
    index = order[(starts + slot).clamp(max=order.numel() - 1)]
    return index, slot < counts.unsqueeze(1)
