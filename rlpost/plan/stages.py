"""Uneven pipeline splits: the most balanced one a model's layers allow over pp stages, and the
stage-count settings that reach it from the ones a layout has (megatron-core's rule for the
layers each stage builds is rlpost.plan.params.stage_layers)."""

from __future__ import annotations

from rlpost.plan.params import stage_layers

FIRST = "layout.train.num_layers_in_first_pipeline_stage"
LAST = "layout.train.num_layers_in_last_pipeline_stage"

Split = tuple[int | None, int | None, tuple[int, ...]]

# a largest stage this many times the balanced split's largest is lopsided (megatron-core's own
# uneven splits, a layer or two off the even share for the embedding or the loss, stay below it)
LOPSIDED_STAGE = 1.5


def lopsided(stages: tuple[int, ...], balanced: tuple[int, ...]) -> bool:
    return max(stages) >= LOPSIDED_STAGE * max(balanced)


def most_balanced_split(
    num_layers: int, pp: int, first: int | None = None, last: int | None = None
) -> Split | None:
    """(first, last, layers per stage) of the split whose largest stage is smallest, keeping a
    given `first` or `last`, or None when no split keeps them. The other stage count is free
    (unset, or any count); among splits as balanced, fewer stage counts set win, then a last
    stage set over a first (the last stage's loss and the first's embedding weigh alike)."""
    firsts = [first] if first is not None else [None, *range(1, num_layers)]
    lasts = [last] if last is not None else [None, *range(1, num_layers)]
    best: tuple[tuple[int, int, int], Split] | None = None
    for head in firsts:
        for tail in lasts:
            split = stage_layers(num_layers, pp, head, tail)
            if split is None:
                continue
            rank = (max(split), (head is not None) + (tail is not None), int(head is not None))
            if best is None or rank < best[0]:
                best = (rank, (head, tail, split))
    return best[1] if best else None


def split_change(first: int | None, last: int | None, to: Split) -> str:
    """What turns the stage counts (first, last) into the split `to`, e.g. 'set
    layout.train.num_layers_in_last_pipeline_stage: 11 for 12, 12, 12, 11'."""
    pairs = ((FIRST, first, to[0]), (LAST, last, to[1]))
    sets = [f"{key}: {want}" for key, have, want in pairs if want is not None and want != have]
    removes = [key for key, have, want in pairs if want is None and have is not None]
    actions = ([f"set {' and '.join(sets)}"] if sets else []) + (
        [f"remove {' and '.join(removes)}"] if removes else []
    )
    return f"{' and '.join(actions)} for {', '.join(map(str, to[2]))}"
