"""Who trains on what: samples to data-parallel ranks, then to micro-batches.

Pure functions over sample lengths (token counts); they return lists of sample indices.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from rlpost.plan.layout import PADDED_ROWS_LIMIT


def pack_first_fit(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """First-fit decreasing into micro-batches of at most `max_tokens` tokens.

    A sample longer than the cap is never truncated: it gets a micro-batch of its own.
    Micro-batches list indices in ascending order; micro-batches keep creation order.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens} must be >= 1")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    free: list[int] = []
    for index in order:
        length = lengths[index]
        target = next((b for b, room in enumerate(free) if room >= length), None)
        if target is None:
            bins.append([index])
            free.append(max(max_tokens - length, 0))
        else:
            bins[target].append(index)
            free[target] -= length
    return [sorted(b) for b in bins]


def padded_groups(lengths: Sequence[int], limit: float = PADDED_ROWS_LIMIT) -> list[list[int]]:
    """A micro-batch's samples in groups that attention pads each to its own longest, so that
    no group's padded rows (S samples padded to the longest, W: S W) exceed `limit` times its
    samples' tokens (rlpost.plan.layout.PADDED_ROWS_LIMIT, which the plan counts):
    longest first, a sample joins the group of the samples just longer than it while the group
    stays within the limit, else it starts the next. Samples with no rows are in no group.
    Groups list indices in ascending order, the longest samples' group first."""
    if limit < 1.0:
        raise ValueError(f"limit={limit} must be >= 1.0 (samples of one length pad nothing)")
    groups: list[list[int]] = []
    width = tokens = 0
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        length = lengths[index]
        if length <= 0:
            continue
        if groups and (len(groups[-1]) + 1) * width <= limit * (tokens + length):
            groups[-1].append(index)
            tokens += length
        else:
            groups.append([index])
            width = tokens = length
    return [sorted(group) for group in groups]


def padded_rows(lengths: Sequence[int]) -> int:
    """The rows the padded attention takes for samples of `lengths` (`padded_groups`: each
    group's samples times its longest)."""
    return sum(len(g) * max(lengths[i] for i in g) for g in padded_groups(lengths))


def pack_fixed_count(num_samples: int, micro_batch_size: int) -> list[list[int]]:
    """Consecutive micro-batches of `micro_batch_size` samples (the last may be short)."""
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size={micro_batch_size} must be >= 1")
    return [
        list(range(start, min(start + micro_batch_size, num_samples)))
        for start in range(0, num_samples, micro_batch_size)
    ]


def pack_micro_batches(
    lengths: Sequence[int],
    *,
    dynamic: bool,
    max_tokens: int | None,
    micro_batch_size: int,
) -> list[list[int]]:
    """The trainer's micro-batching: token-capped first-fit when dynamic, else fixed count."""
    if not dynamic:
        return pack_fixed_count(len(lengths), micro_batch_size)
    if max_tokens is None:
        raise ValueError(
            "train.use_dynamic_batch_size needs train.max_tokens_per_gpu; set it or turn "
            "dynamic batching off"
        )
    return pack_first_fit(lengths, max_tokens)


@dataclass(order=True)
class _Partial:
    """A k-way partial partition in Karmarkar-Karp: subsets kept sorted by load, largest first."""

    neg_spread: int
    tiebreak: int
    loads: list[int]
    members: list[list[int]]


def _merge(a: _Partial, b: _Partial, tiebreak: int) -> _Partial:
    # Largest load of one side with smallest of the other keeps the spread small.
    pairs = zip(
        zip(a.loads, a.members, strict=True),
        reversed(list(zip(b.loads, b.members, strict=True))),
        strict=True,
    )
    merged = sorted(
        ((la + lb, ma + mb) for (la, ma), (lb, mb) in pairs),
        key=lambda item: (item[0], len(item[1])),
        reverse=True,
    )
    loads = [load for load, _ in merged]
    return _Partial(-(loads[0] - loads[-1]), tiebreak, loads, [m for _, m in merged])


def balance_partitions(lengths: Sequence[int], num_parts: int) -> list[list[int]]:
    """Split samples over `num_parts` ranks with near-equal token totals.

    Karmarkar-Karp largest differencing. Every part gets at least one sample whenever there
    are at least `num_parts` samples; parts list indices in ascending order.
    """
    if num_parts < 1:
        raise ValueError(f"num_parts={num_parts} must be >= 1")
    heap: list[_Partial] = []
    for index, length in enumerate(lengths):
        members = [[index]] + [[] for _ in range(num_parts - 1)]
        loads = [length] + [0] * (num_parts - 1)
        # Empty subsets must sort below a zero-length sample, hence the (load, count) keys.
        heapq.heappush(heap, _Partial(-length, index, loads, members))
    if not heap:
        return [[] for _ in range(num_parts)]
    tiebreak = len(lengths)
    while len(heap) > 1:
        first, second = heapq.heappop(heap), heapq.heappop(heap)
        heapq.heappush(heap, _merge(first, second, tiebreak))
        tiebreak += 1
    return [sorted(m) for m in heap[0].members]


def split_contiguous(num_samples: int, num_parts: int) -> list[list[int]]:
    """Ranks take consecutive slices, sizes differing by at most one."""
    base, extra = divmod(num_samples, num_parts)
    parts, start = [], 0
    for rank in range(num_parts):
        size = base + (rank < extra)
        parts.append(list(range(start, start + size)))
        start += size
    return parts


def partition_ranks(lengths: Sequence[int], num_ranks: int, balance: bool) -> list[list[int]]:
    """One optimizer step's samples over data-parallel ranks."""
    if balance:
        return balance_partitions(lengths, num_ranks)
    return split_contiguous(len(lengths), num_ranks)


def partition_groups(
    group_lengths: Sequence[int], groups: Sequence[Sequence[int]], num_ranks: int
) -> list[list[int]]:
    """Whole groups of samples over data-parallel ranks, balanced by each group's token count
    (`group_lengths`); each rank's sample indices in ascending order."""
    parts = balance_partitions(group_lengths, num_ranks)
    return [sorted(i for g in part for i in groups[g]) for part in parts]


def packing_efficiency(
    lengths: Sequence[int], bins: Sequence[Sequence[int]], max_tokens: int
) -> float:
    """Lower bound ceil(total tokens / cap) over micro-batches used; 1.0 is optimal."""
    if not bins:
        return 1.0
    total = sum(lengths[i] for b in bins for i in b)
    return math.ceil(total / max_tokens) / len(bins)
