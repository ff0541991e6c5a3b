"""Segment-wise attention for packed rows, registered with transformers' AttentionInterface.

transformers' own packed path (sdpa/eager plus a block-diagonal mask derived from
position_ids) is exact but dense: a row of T tokens costs T^2 attention whatever the sample
lengths, which on CPU dominates a step (64 samples of 40 tokens: 2560^2 versus 64 x 40^2).
Here the row is regathered into one padded batch with a sample per entry, each entry the
sample's own row positions in order, and run through a single causal sdpa call (on Hopper
asking for cuDNN's attention first, as the megatron trainer's padded path does). The
positions need not be contiguous: a prompt shared by several samples (forward.py) sits once
in the row and is gathered into each of them. Right padding is harmless under a causal mask:
a real query never sees a later (padded) key. On the way back each row position is taken
from the one entry that owns it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from rlpost.backends.sdpa import preferred_backends

PACKED_SDPA = "rlpost_packed_sdpa"
ROWS_KWARG = "rlpost_sample_rows"  # passed through the model's forward to the attention


@dataclass(frozen=True)
class SampleRows:
    """Where each sample of a packed row sits: `index[s, l]` is the row position of sample
    s's l-th token (padded past its length); `owner[t]` is the flat entry (s * L + l) whose
    output row position t takes."""

    index: Tensor  # [S, L]
    owner: Tensor  # [T]

    @classmethod
    def of(cls, rows: Sequence[Sequence[int]], owners: Sequence[tuple[int, int]]) -> SampleRows:
        width = max(len(r) for r in rows)
        index = torch.tensor([[*r, *[0] * (width - len(r))] for r in rows], dtype=torch.long)
        owner = torch.tensor([s * width + offset for s, offset in owners], dtype=torch.long)
        return cls(index, owner)

    def to(self, device: torch.device) -> SampleRows:
        return SampleRows(self.index.to(device), self.owner.to(device))


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
    """Query/key/value [1, heads, T, dim]; each sample's row positions in `rlpost_sample_rows`."""
    rows: SampleRows | None = kwargs.get(ROWS_KWARG)
    if rows is None or query.shape[0] != 1 or key.shape[2] != query.shape[2]:
        # Not a packed training row (generation, or a caller without sample rows).
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )

    def gather(x: Tensor) -> Tensor:  # [1, H, T, D] -> [S, H, L, D]
        return x[0][:, rows.index].transpose(0, 1)

    with preferred_backends(query):  # cuDNN's attention first on Hopper (rlpost.backends.sdpa)
        out = F.scaled_dot_product_attention(
            gather(query),
            gather(key),
            gather(value),
            dropout_p=dropout,
            is_causal=True,
            scale=scaling,
            enable_gqa=key.shape[1] != query.shape[1],
        )
    # [S, H, L, D] -> [S * L, H, D] -> each row position from its owner -> [1, T, H, D]
    return out.transpose(1, 2).flatten(0, 1)[rows.owner].unsqueeze(0), None


AttentionInterface.register(PACKED_SDPA, packed_sdpa_attention)
