"""Segment-wise attention for packed rows, registered with transformers' AttentionInterface.

transformers' own packed path (sdpa/eager plus a block-diagonal mask derived from
position_ids) is exact but dense: a row of T tokens costs T^2 attention whatever the sample
lengths, which on CPU dominates a step (64 samples of 40 tokens: 2560^2 versus 64 x 40^2).
Here the row is regathered into padded batches with a sample per entry, each entry the
sample's own row positions in order, one batch per group of samples of similar lengths
(rlpost.algo.packing.padded_groups: no group pads to more than PADDED_ROWS_LIMIT times its
samples' tokens), each run through one causal sdpa call (on Hopper asking for
cuDNN's attention first, as the megatron trainer's padded path does). The
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

from rlpost.algo.packing import padded_groups
from rlpost.backends.sdpa import preferred_backends

PACKED_SDPA = "rlpost_packed_sdpa"
ROWS_KWARG = "rlpost_sample_rows"  # passed through the model's forward to the attention


@dataclass(frozen=True)
class SampleRows:
    """Where each sample of a packed row sits, by group of samples of similar lengths:
    `groups[b][s, l]` is the row position of the l-th token of group b's sample s (padded past
    its length); `owner[t]` is the entry of the groups' padded rows, laid end to end, whose
    output row position t takes."""

    groups: tuple[Tensor, ...]  # [S_b, L_b] each
    owner: Tensor  # [T]

    @classmethod
    def of(cls, rows: Sequence[Sequence[int]], owners: Sequence[tuple[int, int]]) -> SampleRows:
        """`rows[s]`: sample s's row positions; `owners[t]`: (sample, offset in it) of the entry
        whose output row position t takes."""
        groups, start_of = [], {}
        offset = 0
        for members in padded_groups([len(r) for r in rows]):
            width = max(len(rows[s]) for s in members)
            for entry, s in enumerate(members):
                start_of[s] = offset + entry * width
            offset += len(members) * width
            padded = [[*rows[s], *[0] * (width - len(rows[s]))] for s in members]
            groups.append(torch.tensor(padded, dtype=torch.long))
        owner = torch.tensor([start_of[s] + at for s, at in owners], dtype=torch.long)
        return cls(tuple(groups), owner)

    def to(self, device: torch.device) -> SampleRows:
        return SampleRows(tuple(g.to(device) for g in self.groups), self.owner.to(device))


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

    outs = []
    by_row = [t[0].transpose(0, 1) for t in (query, key, value)]  # [T, H, D] each
    for index in rows.groups:
        # each group gathered as [S, L, H, D] and attended as its [S, H, L, D] view: SDPA's
        # kernels work in that (BSHD) layout, so neither the inputs nor the output need a copy
        q, k, v = (t[index].transpose(1, 2) for t in by_row)
        # cuDNN's attention first on Hopper, for the shapes it plans (rlpost.backends.sdpa)
        with preferred_backends(q, k):
            out = F.scaled_dot_product_attention(
                q,
                k,
                v,
                dropout_p=dropout,
                is_causal=True,
                scale=scaling,
                enable_gqa=key.shape[1] != query.shape[1],
            )
        outs.append(out.transpose(1, 2).flatten(0, 1))
    padded = outs[0] if len(outs) == 1 else torch.cat(outs)
    # each row position from its owner -> [1, T, H, D]
    return padded[rows.owner].unsqueeze(0), None


AttentionInterface.register(PACKED_SDPA, packed_sdpa_attention)
