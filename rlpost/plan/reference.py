"""The layout that ships for a model and hardware (conf/layout/<model>_<hardware>.yaml), rated
by the search's cost model beside its choice, and why the choice is faster."""

from __future__ import annotations

from rlpost.errors import UserError
from rlpost.plan.candidates import (
    Candidate,
    EngineOption,
    LayoutSearch,
    Reference,
    TrainOption,
    describe_split,
)
from rlpost.plan.cost import offload_time, rollout_time, train_time
from rlpost.plan.fsdp import FsdpTrainMemory
from rlpost.plan.layout import Sizes
from rlpost.plan.search_space import CPU_ADAM
from rlpost.plan.split_options import Searcher, SplitOptions
from rlpost.schema import RunConfig


def rate_reference(
    search: LayoutSearch, splits: list[SplitOptions], name: str, ref: RunConfig
) -> Reference:
    """A hand-written layout rated by the same cost model, and why the choice differs."""
    from rlpost.plan.plan import build_plan

    try:
        plan = build_plan(ref)
    except UserError as exc:
        return Reference(name, name, None, None, f"it does not plan: {exc.issues[0].message}")
    searcher = Searcher(ref)
    sizes = Sizes(
        plan.placement.colocate,
        plan.placement.total_gpus,
        plan.placement.train_gpus,
        plan.placement.rollout_gpus,
    )
    par, batch, memory = plan.parallel, plan.batch, plan.memory
    offload = ref.recipe.optim.cpu_offload
    if isinstance(memory.train, FsdpTrainMemory):  # the torch trainer's state moves with FSDP2
        offload = memory.train.cpu_offload
    timing = train_time(ref, par, batch, plan.work, memory.train, sizes.train_gpus)
    train = TrainOption(
        par,
        offload,
        memory.train,
        timing,
        # mode=eval: nothing trains, so nothing leaves the GPU for generation (as candidates)
        offload_time(ref, sizes, memory.train) if searcher.trains else 0.0,
        ref.hardware.kind == "gpu",
        searcher.train_ranks,
    )
    engine = EngineOption(
        plan.engine,
        memory.rollout,
        rollout_time(ref, plan.engine, memory.rollout, batch, searcher.params),
    )
    cost = searcher.cost(sizes, train, engine)
    ref_candidate = Candidate(sizes, train, engine, cost)
    key = ref_candidate.key
    rank = None
    if search.chosen is not None and search.chosen.key == key:
        rank = 1
    elif key in search.feasible_keys:
        rank = _faster_than(splits, searcher, cost.total_s) + 1
    chosen = search.chosen
    if chosen is None:
        reason = "the search found nothing that fits"
    elif chosen.key == key:
        reason = "the search chose this layout"
    else:
        reason = why_faster(
            chosen, ref_candidate, "evaluation" if ref.mode == "eval" else "rollout"
        )
        if rank is None:
            reason += "; and it is not among the candidates that fit with the search's margin"
    return Reference(name, ref_candidate.describe(), cost.total_s, rank, reason)


def why_faster(chosen: Candidate, other: Candidate, per: str = "rollout") -> str:
    """One line: where the chosen layout's predicted time beats the other's, `per` the work
    timed (a rollout; in mode=eval the evaluation)."""
    a, b = chosen.cost, other.cost
    parts = {
        # mode=eval: the engines generate the evaluation sets, no rollout
        "rollout" if per == "rollout" else "generation": (a.rollout.total_s, b.rollout.total_s),
        "training compute": (a.train.compute_s, b.train.compute_s),
        "pipeline bubble": (a.train.pipeline_s, b.train.pipeline_s),
        "tensor-parallel traffic": (a.train.tp_s, b.train.tp_s),
        "context-parallel traffic": (a.train.cp_s, b.train.cp_s),
        "expert all-to-all": (a.train.ep_s, b.train.ep_s),
        "gradient sync": (a.train.dp_s, b.train.dp_s),
        "optimizer": (a.train.optimizer_s, b.train.optimizer_s),
        "weight sync": (a.sync_s, b.sync_s),
        "offload around rollout": (a.offload_s, b.offload_s),
    }
    gains = sorted(((theirs - ours, name) for name, (ours, theirs) in parts.items()), reverse=True)
    shown = [f"{name} {gain:.2f} s less" for gain, name in gains[:2] if gain > 0.005]
    total = b.total_s - a.total_s
    what = ", ".join(shown) if shown else "the parts add up lower"
    split = ""
    if (chosen.sizes.colocate, chosen.sizes.train_gpus) != (
        other.sizes.colocate,
        other.sizes.train_gpus,
    ):
        split = f" ({describe_split(chosen.sizes)} instead of {describe_split(other.sizes)})"
    return f"the choice is {total:.2f} s per {per} faster{split}: {what}"


def _faster_than(splits: list[SplitOptions], searcher: Searcher, bound: float) -> int:
    """How many feasible candidates are predicted faster than `bound` seconds."""
    count = 0
    for s in splits:
        for e in s.engines:
            for t in s.trains:
                if searcher.cost(s.sizes, t, e).total_s < bound:
                    count += 1
    return count


def shipped_reference(cfg: RunConfig) -> tuple[str, RunConfig] | None:
    """The layout that ships for this model and hardware (conf/layout/<model>_<hardware>.yaml),
    applied to this run's config, to rate beside the search's choice."""
    import yaml

    from rlpost.config.sources import CONF_DIR

    name = f"{cfg.model.name}_{cfg.hardware.name}"
    path = CONF_DIR / "layout" / f"{name}.yaml"
    if not path.is_file():
        return None
    shipped = yaml.safe_load(path.read_text()) or {}
    data = cfg.model_dump()
    data["layout"] = shipped.get("layout", {})
    optim = shipped.get("recipe", {}).get("optim", {})
    data["recipe"]["optim"].update({k: v for k, v in optim.items() if k in CPU_ADAM})
    try:
        return name, RunConfig.model_validate(data)
    except ValueError:
        return None
