"""The tensors of the rows being decoded together, kept aligned as rows leave and join.

Rows are left-padded: every row's newest token sits in the last column, so one decode step
feeds one token per row. A row that finishes is dropped from every tensor; rows that arrive
mid-run are prefilled on their own and then merged in, padding the shorter side on the left.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rlpost.backends.cpu_engine.row import Row
from rlpost.backends.cpu_engine.sampling import BatchSampler


def left_pad(prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), right-aligned."""
    width = max(len(p) for p in prompts)
    input_ids = torch.zeros((len(prompts), width), dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        attention_mask[row, width - len(prompt) :] = 1
    return input_ids, attention_mask


def _pad_left(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def _kv(layer: DynamicLayer) -> tuple[torch.Tensor, torch.Tensor]:
    if layer.keys is None or layer.values is None:
        raise RuntimeError("a KV cache layer was not filled by the prefill")
    return layer.keys, layer.values


def _stack_padded(mine: torch.Tensor, theirs: torch.Tensor, width: int) -> torch.Tensor:
    """Concatenate KV tensors [batch, heads, positions, dim] along batch, left-padding."""
    return torch.cat([_pad_left(mine, width, 2), _pad_left(theirs, width, 2)])


@dataclass
class ActiveBatch:
    """Decoding state of a batch. Invariant between steps: attention_mask has as many columns
    as the KV cache has positions, and `tokens` holds each row's newest sampled token."""

    rows: list[Row]
    cache: DynamicCache
    attention_mask: torch.Tensor
    next_position: torch.Tensor
    tokens: torch.Tensor
    sampler: BatchSampler

    @property
    def can_merge(self) -> bool:
        """Merging edits the cache's tensors, which only plain (non-sliding) layers allow."""
        return all(type(layer) is DynamicLayer for layer in self.cache.layers)

    def _layers(self) -> list[DynamicLayer]:
        return [layer for layer in self.cache.layers if isinstance(layer, DynamicLayer)]

    def keep(self, keep: list[int]) -> None:
        """Keep only the rows at positions `keep`, then drop padding no row needs any more."""
        if len(keep) < len(self.rows):
            index = torch.tensor(keep, dtype=torch.long)
            self.rows = [self.rows[i] for i in keep]
            if self.rows:
                self.cache.batch_select_indices(index)
            self.attention_mask = self.attention_mask[index]
            self.next_position = self.next_position[index]
            self.tokens = self.tokens[index]
            self.sampler.select(index)
        if self.rows:
            self._trim_padding()

    def _trim_padding(self) -> None:
        used = self.attention_mask.any(dim=0).nonzero()
        first = int(used[0]) if used.numel() else 0
        if first == 0 or not self.can_merge:
            return
        self.attention_mask = self.attention_mask[:, first:]
        for layer in self._layers():
            keys, values = _kv(layer)
            layer.keys = keys[:, :, first:, :]
            layer.values = values[:, :, first:, :]

    def merge(self, other: ActiveBatch) -> None:
        """Append `other`'s rows; both sides must have `can_merge`."""
        width = max(self.attention_mask.shape[1], other.attention_mask.shape[1])
        self.attention_mask = torch.cat(
            [_pad_left(self.attention_mask, width, 1), _pad_left(other.attention_mask, width, 1)]
        )
        for mine, theirs in zip(self._layers(), other._layers(), strict=True):
            (my_keys, my_values), (their_keys, their_values) = _kv(mine), _kv(theirs)
            mine.keys = _stack_padded(my_keys, their_keys, width)
            mine.values = _stack_padded(my_values, their_values, width)
        self.next_position = torch.cat([self.next_position, other.next_position])
        self.tokens = torch.cat([self.tokens, other.tokens])
        self.sampler.extend(other.sampler)
        self.rows = self.rows + other.rows
