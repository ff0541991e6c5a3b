"""Micro-batches in megatron-core's packed (THD) layout, split for context parallelism.

Samples are concatenated into one row, each padded to a multiple of 2 x cp (pads never attend
backwards into a real token: they sit after it). Under context parallelism each sample is cut
into 2 x cp chunks and rank r keeps chunks r and 2cp-1-r, which balances causal attention work.
The logits that predict response tokens are located in the CP-gathered token order
(rank-major), so gathering per-token results across the CP group and indexing with
`response_index` gives the response tokens sample by sample, as the torch backend lays them
out. With sequence parallelism the row is padded further so every TP rank gets equal slices.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rlpost.backends.megatron.packed import PackedBatchParams, attention_index
from rlpost.types import TrainSample

PAD_TOKEN = 0
CU_SEQLENS = ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded")


@dataclass(frozen=True)
class MTPTargets:
    """One micro-batch's MTP inputs, in this context-parallel rank's local token order."""

    labels: Tensor  # [1, t_local] the next token at each position (rolled once per depth)
    mask: Tensor  # [1, t_local] 1.0 where that next token is under the loss mask
    denominators: tuple[float, ...]  # per depth: the step's loss-mask tokens it can predict
    loss_out: Tensor  # [1] set by the forward: this micro-batch's share of train/mtp_loss


@dataclass(frozen=True)
class MicroBatch:
    """One packed micro-batch as this CP rank sees it."""

    input_ids: Tensor  # [1, t_local]
    position_ids: Tensor  # [1, t_local]
    packed: PackedBatchParams
    targets: Tensor  # [t_local] next token of each local position (PAD where none)
    response_index: Tensor  # [R] rows of the CP-gathered tokens predicting response tokens
    segment_ids: Tensor  # [R] sample index within the micro-batch
    response_lengths: tuple[int, ...]
    samples: tuple[int, ...]  # indices into the rollout batch
    real_tokens: int
    mtp: MTPTargets | None = None  # set for training steps that train MTP layers (mtp.py)

    @property
    def local_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def split(self, flat: Tensor) -> list[Tensor]:
        return list(torch.split(flat, list(self.response_lengths)))

    def to(self, device: torch.device) -> MicroBatch:
        """The same micro-batch with its tensors on `device` (the model's)."""
        if self.input_ids.device == device:
            return self
        assert self.packed.attention is not None
        packed = dataclasses.replace(
            self.packed,
            attention=self.packed.attention.to(device),
            **{
                name: getattr(self.packed, name).to(device)
                for name in CU_SEQLENS
                if getattr(self.packed, name) is not None
            },
        )
        return dataclasses.replace(
            self,
            input_ids=self.input_ids.to(device),
            position_ids=self.position_ids.to(device),
            packed=packed,
            targets=self.targets.to(device),
            response_index=self.response_index.to(device),
            segment_ids=self.segment_ids.to(device),
        )


def cp_chunks(length: int, cp_rank: int, cp_size: int) -> list[int]:
    """Positions of a (padded) sample of `length` tokens kept by a CP rank, in local order."""
    if cp_size == 1:
        return list(range(length))
    chunk = length // (2 * cp_size)
    first = range(cp_rank * chunk, (cp_rank + 1) * chunk)
    second = range((2 * cp_size - 1 - cp_rank) * chunk, (2 * cp_size - cp_rank) * chunk)
    return [*first, *second]


def padded_lengths(lengths: Sequence[int], cp_size: int, tp_size: int, sp: bool) -> list[int]:
    """Each sample rounded up to 2cp, then a trailing pad sample when sequence parallelism
    needs each CP rank's row to split evenly over TP (or when there is no sample at all)."""
    unit = 2 * cp_size if cp_size > 1 else 1
    padded = [math.ceil(n / unit) * unit for n in lengths]
    row = math.lcm(unit, cp_size * tp_size) if sp else unit
    extra = -sum(padded) % row or (0 if padded else row)
    return [*padded, extra] if extra else padded


def build_micro_batch(
    samples: Sequence[TrainSample],
    indices: Sequence[int],
    cp_rank: int = 0,
    cp_size: int = 1,
    tp_size: int = 1,
    sequence_parallel: bool = False,
) -> MicroBatch:
    """Pack `samples` (the rollout entries at `indices`) for one CP rank."""
    lengths = [len(s.tokens) for s in samples]
    padded = padded_lengths(lengths, cp_size, tp_size, sequence_parallel)
    full_ids: list[int] = []
    full_targets: list[int] = []
    full_positions: list[int] = []
    response_rows: list[int] = []
    offset = 0
    for sample, length, size in zip(samples, lengths, padded, strict=False):
        tokens = list(sample.tokens) + [PAD_TOKEN] * (size - length)
        full_ids += tokens
        full_targets += tokens[1:length] + [PAD_TOKEN] * (size - length + 1)
        full_positions += list(range(size))
        first = offset + length - sample.response_length - 1
        response_rows += range(first, first + sample.response_length)
        offset += size
    if len(padded) > len(samples):  # the sequence-parallel pad sample
        full_ids += [PAD_TOKEN] * padded[-1]
        full_targets += [PAD_TOKEN] * padded[-1]
        full_positions += list(range(padded[-1]))
    local_positions = [[cp_chunks(size, r, cp_size) for size in padded] for r in range(cp_size)]
    local_of_rank = [_local_rows(padded, positions) for positions in local_positions]
    gathered_row = {row: i for i, row in enumerate(r for rows in local_of_rank for r in rows)}
    mine = local_of_rank[cp_rank]
    cu = torch.tensor([0, *itertools.accumulate(padded)], dtype=torch.int32)
    longest = max(padded)
    return MicroBatch(
        input_ids=torch.tensor([[full_ids[r] for r in mine]], dtype=torch.long),
        position_ids=torch.tensor([[full_positions[r] for r in mine]], dtype=torch.long),
        packed=PackedBatchParams(
            attention=attention_index(padded, local_positions, cp_rank),
            qkv_format="thd",
            cu_seqlens_q=cu,
            cu_seqlens_kv=cu,
            cu_seqlens_q_padded=cu,
            cu_seqlens_kv_padded=cu,
            max_seqlen_q=longest,
            max_seqlen_kv=longest,
        ),
        targets=torch.tensor([full_targets[r] for r in mine], dtype=torch.long),
        response_index=torch.tensor([gathered_row[r] for r in response_rows], dtype=torch.long),
        segment_ids=torch.tensor(
            [i for i, s in enumerate(samples) for _ in range(s.response_length)], dtype=torch.long
        ),
        response_lengths=tuple(s.response_length for s in samples),
        samples=tuple(indices),
        real_tokens=sum(lengths),
    )


def _local_rows(padded: Sequence[int], positions: Sequence[Sequence[int]]) -> list[int]:
    """A CP rank's rows of the whole packed row, from the positions it keeps per sample."""
    rows, offset = [], 0
    for size, kept in zip(padded, positions, strict=True):
        rows += [offset + p for p in kept]
        offset += size
    return rows
