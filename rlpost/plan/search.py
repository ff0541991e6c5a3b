"""`layout=auto`: every layout that passes the checks and fits, ranked by the cost model.

A candidate is a GPU split (colocated, or every split of the GPUs between training and
rollout: any count on one node, whole nodes on several), a training grid (TP with sequence
parallelism, PP with its even and near-even uneven stage splits, CP, EP and ETP for MoE, the
DP that fills the rest), a recompute setting, Adam on the GPU or the host (CPU Adam), and the
engines (GPUs per engine and, for MoE, dp-attention). Fields the layout sets stay fixed; the
null ones are searched. Where the torch trainer trains (trainer.backend=torch, or auto for a
generic model) the grid is data parallel only, sized as FSDP2 (rlpost.plan.fsdp), with
FSDP2's CPU offload on and off and, where the config leaves them null, the layers resharded
after their forward or kept gathered, and shard groups of all DP ranks or (HSDP) of each node's.
In mode=eval the train ranks train nothing, so what only training reads is not searched:
with no train rank (model.hf_checkpoint's weights) a split has one train side, and a
candidate is the split and its engines; where they send other weights, the grid that sends
them, without recompute, CP or where Adam runs (sending_grid).

The training side and the rollout side of a split are checked and sized on their own (each
rule names what it reads: rlpost.plan.checks SCOPES) and combined cheapest first; the best
combination is then planned in full, every rule again, exactly as a hand-written layout
would be. A candidate fits when its training peak leaves `MARGIN_FRACTION` of the GPU free,
its engines hold a full sample, and the host holds what is offloaded to it.

The parts: the candidates and their descriptions (rlpost.plan.candidates), what is
enumerated (rlpost.plan.search_space), each split's options (rlpost.plan.split_options), the
shipped layout rated beside the choice (rlpost.plan.reference), the report when nothing fits
(rlpost.plan.nothing_fits) and the choice written into the config (rlpost.plan.choice).

Imports nothing heavy: `mode=plan` searches in well under a second for a node and in a few
for 64 GPUs (benchmarks/layout_search.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

from rlpost.plan.candidates import (
    Candidate,
    LayoutSearch,
    Rejected,
    candidate_key,
    describe_engine,
    describe_split,
)
from rlpost.plan.nothing_fits import suggestions
from rlpost.plan.reference import rate_reference
from rlpost.plan.search_space import gpu_splits
from rlpost.plan.split_options import Searcher
from rlpost.schema import RunConfig

COMBINED = 8
"""Best training and rollout options per split that are combined and ranked in full."""
SHOWN = 5


def search_layout(
    cfg: RunConfig, reference: tuple[str, RunConfig] | None = None, *, advise: bool = True
) -> LayoutSearch:
    """Every candidate checked and sized, the fastest first; `reference` (name, config) is a
    hand-written layout for the same run to rate beside them; where none fits and `advise`,
    what would (rlpost.plan.nothing_fits)."""
    start = time.perf_counter()
    searcher = Searcher(cfg)
    splits = [searcher.split(sizes) for sizes in gpu_splits(cfg)]
    ranked: list[Candidate] = []
    feasible_keys: set[tuple[Any, ...]] = set()
    rejected: list[Rejected] = []
    feasible = 0
    for s in splits:
        feasible += len(s.trains) * len(s.engines)
        for t in s.trains:
            for e in s.engines:
                feasible_keys.add(
                    candidate_key(s.sizes, t.parallel, t.cpu_offload, e.engine, t.fsdp, t.work)
                )
        for t in s.trains[:COMBINED]:
            for e in s.engines[:COMBINED]:
                ranked.append(Candidate(s.sizes, t, e, searcher.cost(s.sizes, t, e)))
        best_engine = s.engines[0] if s.engines else None
        for t, reason in s.rejected_trains:
            step = None
            if best_engine is not None:
                step = searcher.cost(s.sizes, t, best_engine).total_s
            text = f"{describe_split(s.sizes)}; {t.describe()}"
            rejected.append(Rejected(text, reason, step))
        best_train = s.trains[0] if s.trains else None
        for e, reason in s.rejected_engines:
            step = None
            if best_train is not None:
                step = searcher.cost(s.sizes, best_train, e).total_s
            rejected.append(
                Rejected(f"{describe_split(s.sizes)}; {describe_engine(e.engine)}", reason, step)
            )
        rejected += [Rejected(f"{describe_split(s.sizes)}; {d}", r) for d, r in s.refused]
    ranked.sort(key=_rank_key)
    chosen = ranked[0] if ranked else None
    enumerated = sum(s.enumerated_trains * max(1, s.enumerated_engines) for s in splits)
    result = LayoutSearch(
        chosen=chosen,
        ranked=tuple(ranked[:SHOWN]),
        rejected=tuple(_worth_showing(rejected, chosen)),
        enumerated=enumerated,
        feasible=feasible,
        seconds=0.0,
        feasible_keys=frozenset(feasible_keys),
    )
    if chosen is None and advise:
        result = replace(result, suggestions=tuple(suggestions(cfg, splits, _chosen_on)))
    if reference is not None:
        result = replace(result, reference=rate_reference(result, splits, *reference))
    return replace(result, seconds=time.perf_counter() - start)


def _chosen_on(cfg: RunConfig) -> Candidate | None:
    """The layout the search chooses for `cfg`, without the report where none fits."""
    return search_layout(cfg, advise=False).chosen


def _rank_key(c: Candidate) -> tuple[float, int, int]:
    """Fastest first; within 10 ms, the fewest model-parallel splits and smallest engines
    (the simpler layout, when the model cannot tell them apart), then the torch trainer's
    layers resharded after their forward (the less memory)."""
    par = c.parallel
    splits = par.tp * par.pp * par.cp * par.ep * par.etp * c.engine.gpus_per_engine
    return round(c.step_s, 2), splits + int(c.train.cpu_offload), int(c.train.reshard is False)


def _worth_showing(rejected: list[Rejected], chosen: Candidate | None) -> list[Rejected]:
    """The rejected layouts that would have been faster than the choice (fastest first),
    then the ones refused by a rule; a few of each."""
    bound = chosen.step_s if chosen else math.inf
    faster = sorted(
        (r for r in rejected if r.step_s is not None and r.step_s < bound),
        key=lambda r: r.step_s or 0.0,
    )
    keys_seen: set[tuple[str, str]] = set()
    shown = faster[:3]
    for r in rejected:
        # one line per split and rule (or per split for memory)
        rule = r.reason.split(":", 1)[0] if ":" in r.reason else "memory"
        key = (r.description.split(";", 1)[0], rule)
        if r.step_s is None and key not in keys_seen and len(shown) < 6:
            keys_seen.add(key)
            shown.append(r)
    return shown
