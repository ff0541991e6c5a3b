"""Segment-wise attention for packed rows, registered with transformers' AttentionInterface.

transformers' own packed path (sdpa/eager plus a block-diagonal mask derived from
position_ids) is exact but dense: a row of T tokens costs T^2 attention whatever the sample
lengths, which on CPU dominates a step (64 samples of 40 tokens: 2560^2 versus 64 x 40^2).
Here the row is regathered into one padded batch with a sample per entry and run through a
single causal sdpa call. Right padding is harmless under a causal mask: a real query never
sees a later (padded) key, and padded queries are dropped on the way back.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

PACKED_SDPA = "rlpost_packed_sdpa"


def segment_layout(cu_seq_lens: Tensor, total: int) -> tuple[Tensor, Tensor]:
    """Row positions of each segment, padded: (gather index [S, L], valid mask [S, L])."""
    starts, lengths = cu_seq_lens[:-1], cu_seq_lens.diff()
    offsets = torch.arange(int(lengths.max()), device=cu_seq_lens.device)
    valid = offsets.unsqueeze(0) < lengths.unsqueeze(1)
    index = (starts.unsqueeze(1) + offsets.unsqueeze(0)).clamp(max=total - 1)
    return index, valid


def packed_sdpa_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """Query/key/value [1, heads, T, dim]; segments given by `cu_seq_lens_q`."""
    cu_seq_lens = kwargs.get("cu_seq_lens_q")
    if cu_seq_lens is None or query.shape[0] != 1 or key.shape[2] != query.shape[2]:
        # Not a packed training row (generation, or a caller without boundaries).
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    index, valid = segment_layout(cu_seq_lens, query.shape[2])

    def gather(x: Tensor) -> Tensor:  # [1, H, T, D] -> [S, H, L, D]
        return x[0][:, index].transpose(0, 1)

    out = F.scaled_dot_product_attention(
        gather(query),
        gather(key),
        gather(value),
        dropout_p=dropout,
        is_causal=True,
        scale=scaling,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    # [S, H, L, D] -> [S, L, H, D] -> valid tokens in row order -> [1, T, H, D]
    return out.transpose(1, 2)[valid].unsqueeze(0), None


AttentionInterface.register(PACKED_SDPA, packed_sdpa_attention)
