"""What every layer needs to know about a packed micro-batch, worked out once per micro-batch.

A decoder layer must not read a tensor's value on the host: on a GPU each such read waits for
the device to catch up, and a layer that does it waits once per layer per micro-batch. So the
sample boundaries are turned into index tensors when the micro-batch is packed (on the host,
from the lengths the packer already has, before any device work), moved to the device with the
batch, and the RoPE angles are computed there once from the batch's position ids. Both ride in
`PackedBatchParams`, a `PackedSeqParams` that megatron-core hands unchanged to every layer's
core attention (`layers.PackedAttention`).

Attention runs as padded batches of samples, one per group of samples of similar lengths
(rlpost.algo.packing.padded_groups: no group pads to more than PADDED_ROWS_LIMIT times its
samples' tokens, so a short sample never pads to a long one): in each group,
`rows[s, j]` is the local row of the j-th token of its sample s (clamped past its end);
`slots[r]` is the place of local row r in the groups' padded rows laid end to end, so the
output comes back with one gather. Under context parallelism the keys are gathered across the
CP group first (rank-major); a group's `keys` index them per sample and its `mask` says which
key each query may see. Without context parallelism each sample's local rows are one
contiguous run in position order, so `cu_seqlens` (int32, [S + 1]) and `max_seqlen` (a Python
int) describe them as they are, for a variable-length kernel that needs no padding
(`kernels.packed_attention`).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from megatron.core.packed_seq_params import PackedSeqParams
from torch import Tensor

from rlpost.algo.packing import padded_groups


@dataclass(frozen=True)
class PaddedGroup:
    """One padded batch of samples of similar lengths."""

    rows: Tensor  # [S, W] local rows of each sample, in position order (clamped in padding)
    keys: Tensor | None = None  # CP: [S, Wk] rows of the CP-gathered keys, per sample
    mask: Tensor | None = None  # CP: [S, 1, W, Wk] True where a query may see a key

    def to(self, device: torch.device) -> PaddedGroup:
        rows = self.rows.to(device, non_blocking=True)
        return PaddedGroup(rows, _moved(self.keys, device), _moved(self.mask, device))


@dataclass(frozen=True)
class AttentionIndex:
    groups: tuple[PaddedGroup, ...]  # samples padded to each group's longest, longest first
    slots: Tensor  # [t_local] each local row's place in the groups' padded rows, end to end
    gathered_keys: bool = False  # CP: keys and values are gathered across the CP group first
    cu_seqlens: Tensor | None = None  # no CP: [S + 1] int32, sample s is rows cu[s]:cu[s + 1]
    max_seqlen: int = 0  # no CP: the longest sample's rows (W), known on the host
    squared_rows: int = 0  # no CP: the sum of each sample's rows squared, known on the host

    @property
    def padded_work(self) -> float:
        """Attention work on the padded groups over work on the samples as they are: the sum
        of each group's S W^2 over the sum of the samples' squared lengths (1.0 for samples of
        one length; 0.0 under CP, where it is not known)."""
        if not self.squared_rows:
            return 0.0
        padded = sum(g.rows.shape[0] * g.rows.shape[1] ** 2 for g in self.groups)
        return padded / self.squared_rows

    def to(self, device: torch.device) -> AttentionIndex:
        return dataclasses.replace(
            self,
            groups=tuple(g.to(device) for g in self.groups),
            slots=self.slots.to(device, non_blocking=True),
            cu_seqlens=_moved(self.cu_seqlens, device),
        )


def _moved(tensor: Tensor | None, device: torch.device) -> Tensor | None:
    return None if tensor is None else tensor.to(device, non_blocking=True)


@dataclass(frozen=True)
class RopeTable:
    """cos and sin of each local token's rotary angles, [t_local, 1, rotary dim], in the
    compute dtype (`kernels.apply_rope`)."""

    cos: Tensor
    sin: Tensor


@dataclass
class PackedBatchParams(PackedSeqParams):  # type: ignore[misc]
    attention: AttentionIndex | None = None
    rope: RopeTable | None = None


def _grouped(samples: list[list[int]]) -> tuple[Tensor, Tensor, int]:
    """(rows [S, W], valid [S, W], W) for per-sample row lists."""
    width = max((len(rows) for rows in samples), default=1) or 1
    rows = torch.zeros(len(samples), width, dtype=torch.long)
    valid = torch.zeros(len(samples), width, dtype=torch.bool)
    for s, sample_rows in enumerate(samples):
        n = len(sample_rows)
        if n:
            rows[s, :n] = torch.tensor(sample_rows, dtype=torch.long)
            rows[s, n:] = sample_rows[-1]
            valid[s, :n] = True
    return rows, valid, width


def attention_index(
    padded: Sequence[int], local_positions: Sequence[Sequence[Sequence[int]]], cp_rank: int
) -> AttentionIndex:
    """The index tensors for a micro-batch whose (padded) samples have lengths `padded`;
    `local_positions[r][s]` are the positions of sample s that CP rank r keeps, in its local
    order (each rank's rows are its samples' kept positions, sample after sample)."""
    cp_size = len(local_positions)

    def rows_by_sample(rank: int, base: int) -> list[list[int]]:
        """Rows (from `base`) of each sample's tokens on `rank`, sorted by position."""
        out, offset = [], base
        for positions in local_positions[rank]:
            order = sorted(range(len(positions)), key=positions.__getitem__)
            out.append([offset + i for i in order])
            offset += len(positions)
        return out

    mine = rows_by_sample(cp_rank, 0)
    local_count = sum(len(p) for p in local_positions[cp_rank])
    slots = torch.empty(local_count, dtype=torch.long)  # slots[rows[s, j]]: its padded row
    grouped = []  # per group: its samples, their rows [S, W] and which are real [S, W]
    offset = 0
    for members in padded_groups([len(sample) for sample in mine]):
        rows, valid, _ = _grouped([mine[s] for s in members])
        slots[rows[valid]] = offset + torch.arange(rows.numel()).view_as(rows)[valid]
        offset += rows.numel()
        grouped.append((members, rows, valid))
    if cp_size == 1:
        cu_seqlens, max_seqlen = _boundaries(mine)
        squared = sum(len(sample) ** 2 for sample in mine)
        return AttentionIndex(
            tuple(PaddedGroup(rows) for _, rows, _ in grouped),
            slots,
            cu_seqlens=cu_seqlens,
            max_seqlen=max_seqlen,
            squared_rows=squared,
        )
    bases = [0]
    for rank in range(cp_size - 1):
        bases.append(bases[-1] + sum(len(p) for p in local_positions[rank]))
    per_rank = [rows_by_sample(r, bases[r]) for r in range(cp_size)]
    keys_by_sample = [
        sorted(row for r in range(cp_size) for row in per_rank[r][s]) for s in range(len(padded))
    ]
    position_of = {}
    for r in range(cp_size):
        for s, sample_rows in enumerate(per_rank[r]):
            sorted_positions = sorted(local_positions[r][s])
            for row, pos in zip(sample_rows, sorted_positions, strict=True):
                position_of[row] = pos
    groups = []
    for members, rows, valid in grouped:
        keys, key_valid, _ = _grouped([keys_by_sample[s] for s in members])
        q_pos = torch.tensor([[position_of[bases[cp_rank] + int(r)] for r in row] for row in rows])
        k_pos = torch.tensor([[position_of[int(r)] for r in row] for row in keys])
        causal = k_pos.unsqueeze(1) <= q_pos.unsqueeze(2)
        # padding query slots see every key (their rows are dropped), so no row is all -inf
        mask = causal & key_valid.unsqueeze(1) | ~valid.unsqueeze(2)
        groups.append(PaddedGroup(rows, keys, mask.unsqueeze(1)))
    return AttentionIndex(tuple(groups), slots, gathered_keys=True)


def _boundaries(samples: list[list[int]]) -> tuple[Tensor | None, int]:
    """(cu_seqlens, max_seqlen) of a rank that holds its samples whole: the boundaries when
    each sample's rows, in position order, are the run right after the sample before it (so
    for every micro-batch `batches.build_micro_batch` packs without CP), else none."""
    lengths = [len(rows) for rows in samples]
    cu = [0, *itertools.accumulate(lengths)]
    if any(rows != list(range(cu[s], cu[s + 1])) for s, rows in enumerate(samples)):
        return None, 0
    return torch.tensor(cu, dtype=torch.int32), max(lengths, default=0)


def with_rope(packed: PackedSeqParams, rope: RopeTable) -> PackedBatchParams:
    assert isinstance(packed, PackedBatchParams)
    return dataclasses.replace(packed, rope=rope)
