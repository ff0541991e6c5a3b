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

Imports nothing heavy: `mode=plan` searches in well under a second for a node and in a few
for 64 GPUs (benchmarks/layout_search.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from rlpost.errors import Issue, UserError
from rlpost.plan.backends import resolve_trainer_backend
from rlpost.plan.batch import BatchPlan, plan_batch
from rlpost.plan.checks import PlanContext, divisors, generic_model_issues, run_checks
from rlpost.plan.cost import (
    RolloutTime,
    StepCost,
    TrainTime,
    offload_time,
    rollout_time,
    sync_time,
    train_time,
)
from rlpost.plan.engine_memory import (
    RolloutMemory,
    checkpoint_fp8,
    default_mem_fraction,
    estimate_rollout,
    longest_request,
)
from rlpost.plan.fsdp import (
    FSDP_GROUP_KEY,
    FSDP_IN_SCHEMA,
    FSDP_OFFLOAD_KEY,
    FSDP_RESHARD_KEY,
    FsdpOptions,
    FsdpTrainMemory,
    estimate_sender,
    estimate_trainer,
    fsdp_options,
    fsdp_trains,
)
from rlpost.plan.layout import (
    MAX_CP,
    MAX_PP,
    RECOMPUTE_NONE,
    EngineLayout,
    ParallelLayout,
    Sizes,
)
from rlpost.plan.loop import asynchronous
from rlpost.plan.memory import TrainMemory, estimate_host
from rlpost.plan.parallel import engine_options, engine_shape, powers_of_two
from rlpost.plan.params import ParamCount, count_params, stage_layers
from rlpost.plan.remedies import (
    MAX_TRAIN_GPUS,
    fsdp_fixes,
    megatron_fewest_gpus,
    shorter_tokens,
    slot_fix,
)
from rlpost.plan.work import (
    NO_TRAIN_RANK,
    SEND_WEIGHTS,
    TRAIN,
    plan_work,
    skipped_rules,
    train_rank_work,
)
from rlpost.schema import RunConfig
from rlpost.schema.hardware import device_word

MARGIN_FRACTION = 0.05
"""Training memory kept free on every GPU beyond the estimate (allocator fragmentation)."""
COMBINED = 8
"""Best training and rollout options per split that are combined and ranked in full."""
SHOWN = 5
RECOMPUTES = (RECOMPUTE_NONE, "full")
"""Selective recompute drops only the attention softmax's activations, which the memory model
never counts (flash attention does not store them), so it is searched only when set."""
LEANER_WITHIN = 0.05
"""The training-time gain for which the search takes a torch layout that holds more memory
than its leanest twin (layers kept gathered from forward to backward, or shards within each
node): the cost model's times are not finer than that, and the memory is certain."""
CPU_ADAM = {
    "cpu_offload": True,
    "overlap_cpu_optimizer_d2h_h2d": True,
    "precision_aware_optimizer": True,
}
GPU_ADAM = {
    "cpu_offload": False,
    "overlap_cpu_optimizer_d2h_h2d": False,
    "precision_aware_optimizer": False,
}


@dataclass(frozen=True)
class TrainOption:
    parallel: ParallelLayout
    cpu_offload: bool
    memory: TrainMemory
    time: TrainTime
    offload_s: float
    on_gpu: bool = True  # the hardware's kind: on cpu, a rank's device is a device slot
    # what the train ranks do (rlpost.plan.work): in mode=eval they train nothing, and the
    # choices only training reads (recompute, where Adam runs) are none of the layout's
    work: str = TRAIN

    @property
    def seconds(self) -> float:
        return self.time.total_s + self.offload_s

    def describe(self) -> str:
        """What the layout's train side is, as far as the train ranks' work reads it: all of
        it in training; the grid that loads and sends the weights in an evaluation of other
        weights; nothing where no train rank starts."""
        if self.work == NO_TRAIN_RANK:
            return ""
        if self.work == SEND_WEIGHTS:
            offload = ", FSDP2 CPU offload" if self.fsdp and self.fsdp.cpu_offload else ""
            return describe_grid(self.parallel, self.fsdp) + offload
        return describe_train(self.parallel, self.cpu_offload, self.fsdp, on_gpu=self.on_gpu)

    @property
    def reshard(self) -> bool | None:
        """The torch trainer's reshard_after_forward; None for megatron."""
        m = self.memory
        return m.reshard_after_forward if isinstance(m, FsdpTrainMemory) else None

    @property
    def fsdp(self) -> FsdpOptions | None:
        """The torch trainer's FSDP2 options; None for megatron."""
        m = self.memory
        if not isinstance(m, FsdpTrainMemory):
            return None
        group = m.shards if m.shards < self.parallel.dp else None
        return FsdpOptions(m.cpu_offload, group, m.reshard_after_forward)


@dataclass(frozen=True)
class EngineOption:
    engine: EngineLayout
    memory: RolloutMemory
    time: RolloutTime


@dataclass(frozen=True)
class Candidate:
    """A layout that passes every check and fits, with its predicted cost."""

    sizes: Sizes
    train: TrainOption
    rollout: EngineOption
    cost: StepCost

    @property
    def parallel(self) -> ParallelLayout:
        return self.train.parallel

    @property
    def engine(self) -> EngineLayout:
        return self.rollout.engine

    @property
    def step_s(self) -> float:
        return self.cost.total_s

    @property
    def key(self) -> tuple[Any, ...]:
        t = self.train
        return candidate_key(self.sizes, t.parallel, t.cpu_offload, self.engine, t.fsdp, t.work)

    def describe(self) -> str:
        train = self.train.describe()
        train_part = f"{train}; " if train else ""
        return f"{describe_split(self.sizes)}; {train_part}{describe_engine(self.engine)}"

    def memory_text(self) -> str:
        engine = f"engine {self.rollout.memory.total_gib:.1f} GiB per " + device_word(
            "gpu" if self.train.on_gpu else "cpu"
        )
        if self.train.work == NO_TRAIN_RANK:  # nothing of the train side starts
            return engine
        return f"train {self.train.memory.total_gib:.1f} GiB, {engine}"


@dataclass(frozen=True)
class Rejected:
    """A layout that lost for a reason other than speed; `step_s` when it could be timed."""

    description: str
    reason: str
    step_s: float | None = None


@dataclass(frozen=True)
class Reference:
    """The layout that ships for this model and hardware, rated by the same model."""

    name: str
    description: str
    step_s: float | None
    rank: int | None  # 1-based among the feasible candidates; None when it is not one
    reason: str  # why the search chose otherwise (or that it chose the same)


@dataclass(frozen=True)
class LayoutSearch:
    chosen: Candidate | None
    ranked: tuple[Candidate, ...]
    rejected: tuple[Rejected, ...]
    enumerated: int
    feasible: int
    seconds: float
    suggestions: tuple[str, ...] = ()
    reference: Reference | None = None
    feasible_keys: frozenset[tuple[Any, ...]] = field(default=frozenset(), repr=False)

    def to_dict(self) -> dict[str, Any]:
        def cand(c: Candidate) -> dict[str, Any]:
            return {
                "layout": c.describe(),
                "step_s": round(c.step_s, 3),
                "train_s": round(c.cost.train.total_s, 3),
                "rollout_s": round(c.cost.rollout.total_s, 3),
                "sync_s": round(c.cost.sync_s, 3),
                "offload_s": round(c.cost.offload_s, 3),
                "train_gib_per_gpu": round(c.train.memory.total_gib, 3),
                "rollout_gib_per_gpu": round(c.rollout.memory.total_gib, 3),
                "overrides": layout_overrides(c),
            }

        return {
            "chosen": cand(self.chosen) if self.chosen else None,
            "runners_up": [cand(c) for c in self.ranked[1:]],
            "rejected": [
                {
                    "layout": r.description,
                    "reason": r.reason,
                    "step_s": None if r.step_s is None else round(r.step_s, 3),
                }
                for r in self.rejected
            ],
            "enumerated": self.enumerated,
            "feasible": self.feasible,
            "seconds": round(self.seconds, 3),
            "suggestions": list(self.suggestions),
            "reference": None
            if self.reference is None
            else {
                "layout": self.reference.name,
                "description": self.reference.description,
                "step_s": None
                if self.reference.step_s is None
                else round(self.reference.step_s, 3),
                "rank": self.reference.rank,
                "reason": self.reference.reason,
            },
        }


def candidate_key(
    sizes: Sizes,
    par: ParallelLayout,
    cpu_offload: bool,
    engine: EngineLayout,
    fsdp: FsdpOptions | None = None,
    work: str = TRAIN,
) -> tuple[Any, ...]:
    """What identifies a layout: the split, the grid with its stage split, Adam's place (and
    the torch trainer's FSDP2 options), the engines; of the train side, only what the train
    ranks' `work` reads: in mode=eval no recompute or Adam (the grid that sends the weights,
    with the torch trainer's shards), and nothing where no train rank starts."""
    if work == NO_TRAIN_RANK:
        return (sizes.colocate, sizes.train_gpus, sizes.rollout_gpus, *engine_key(engine))
    if work == SEND_WEIGHTS:
        par, cpu_offload = sending_grid(par), fsdp is not None and cpu_offload
    stages = (par.num_layers_in_first_pipeline_stage, par.num_layers_in_last_pipeline_stage)
    return (
        sizes.colocate,
        sizes.train_gpus,
        sizes.rollout_gpus,
        par.tp,
        par.sequence_parallel,
        par.pp,
        stages,
        par.cp,
        par.ep,
        par.etp,
        par.dp,
        par.recompute,
        cpu_offload,
        fsdp,
        *engine_key(engine),
    )


def sending_grid(par: ParallelLayout) -> ParallelLayout:
    """The grid as train ranks that only load and send the weights read it: no recompute
    (they run no forward), no context parallelism (it splits a training sequence; the
    weights are whole on each CP rank, as on each DP rank)."""
    return replace(par, recompute=RECOMPUTE_NONE, cp=1, dp=par.dp * par.cp)


def engine_key(engine: EngineLayout) -> tuple[int, int]:
    """What identifies the engines of a layout: their size and dp-attention."""
    return engine.gpus_per_engine, engine.dp_size


def describe_split(sizes: Sizes) -> str:
    if sizes.colocate:
        return f"colocated on {sizes.train_gpus}"
    return f"decoupled {sizes.train_gpus} train + {sizes.rollout_gpus} rollout"


def describe_train(
    par: ParallelLayout, cpu_offload: bool, fsdp: FsdpOptions | None = None, *, on_gpu: bool = True
) -> str:
    """The grid, recompute and where the optimizer runs; `fsdp` for the torch trainer's.
    `on_gpu` false (hardware kind cpu): a rank's device is a device slot, not a GPU, and what
    is not offloaded sits there."""
    recompute = "no recompute" if par.recompute == RECOMPUTE_NONE else f"{par.recompute} recompute"
    device = "the GPU" if on_gpu else f"the {device_word('cpu', 2)}"
    if fsdp is not None:
        where = "FSDP2 CPU offload" if fsdp.cpu_offload else f"state on {device}"
        if not fsdp.reshard_after_forward:
            where += ", layers kept gathered"
        return f"{describe_grid(par, fsdp)}, {recompute}, {where}"
    adam = "CPU Adam" if cpu_offload else ("GPU Adam" if on_gpu else f"Adam on {device}")
    return f"{describe_grid(par)}, {recompute}, {adam}"


def describe_grid(par: ParallelLayout, fsdp: FsdpOptions | None = None) -> str:
    """How the train ranks split the model (`fsdp` for the torch trainer's shards)."""
    if fsdp is not None:
        return f"torch FSDP2 DP{par.dp} (shards of {fsdp.shards(par.dp)})"
    parts = [f"TP{par.tp}" + ("+SP" if par.sequence_parallel else "")]
    if par.pp > 1:
        first, last = par.num_layers_in_first_pipeline_stage, par.num_layers_in_last_pipeline_stage
        uneven = f" (first {first})" if first else ""
        uneven += f" (last {last})" if last else ""
        parts.append(f"PP{par.pp}{uneven}")
    if par.cp > 1:
        parts.append(f"CP{par.cp}")
    if par.ep > 1 or par.etp > 1:
        parts.append(f"EP{par.ep}" + (f" ETP{par.etp}" if par.etp > 1 else ""))
    parts.append(f"DP{par.dp}")
    return " ".join(parts)


def describe_engine(engine: EngineLayout) -> str:
    text = f"{engine.num_engines} engine(s) of {engine.gpus_per_engine}"
    if engine.dp_size > 1:
        text += f" with dp-attention {engine.dp_size}"
    return text


# ----------------------------------------------------------------------------- enumeration


def gpu_splits(cfg: RunConfig) -> list[Sizes]:
    """Colocated and every decoupled split the layout leaves open."""
    hw, layout = cfg.hardware, cfg.layout
    total = hw.total_gpus - cfg.recipe.rollout.reward.device_slots
    train_n, rollout_n = layout.train.num_gpus, layout.rollout.num_gpus
    splits = []
    if layout.colocate is not False and not rollout_n:
        train = train_n or total
        splits.append(Sizes(True, total, train, train))
    if layout.colocate is not True and total > 1:
        if train_n is not None:
            counts = [train_n]
        elif rollout_n is not None:
            counts = [total - rollout_n]
        elif hw.num_nodes > 1:
            counts = [n * hw.gpus_per_node for n in range(1, hw.num_nodes)]
        else:
            counts = list(range(1, total))
        for train in counts:
            rollout = rollout_n if rollout_n is not None else total - train
            if train >= 1 and rollout >= 1:
                splits.append(Sizes(False, total, train, rollout))
    return splits


def _pipeline_splits(
    num_layers: int, pp: int, first: int | None, last: int | None
) -> list[tuple[int | None, int | None]]:
    """(first, last) stage sizes: the even split when there is one, and the uneven ones
    whose stages differ by at most two layers (fixed values kept)."""
    if pp == 1:
        return [(None, None)]
    if first is not None or last is not None:
        return [(first, last)] if stage_layers(num_layers, pp, first, last) else []
    found: dict[tuple[int, ...], tuple[int | None, int | None]] = {}
    base = num_layers // pp
    options: list[int | None] = [None, *range(max(1, base - 2), base + 3)]
    for f in options:
        for la in options:
            split = stage_layers(num_layers, pp, f, la)
            if split is None or max(split) - min(split) > 2 or split in found:
                continue
            found[split] = (f, la)
    return list(found.values())


def torch_searched(cfg: RunConfig) -> bool:
    """The torch trainer trains whatever the grid (trainer.backend=torch, or auto for a
    generic model): only data parallelism is searched, FSDP2 sharding over it."""
    return fsdp_trains(cfg, resolve_trainer_backend(cfg, ParallelLayout.single_process()))


def train_layouts(cfg: RunConfig, world: int) -> Iterator[ParallelLayout]:
    """Every training grid over `world` GPUs the layout's fixed fields allow (for the torch
    trainer, data parallel over all of them)."""
    model, hw, t = cfg.model, cfg.hardware, cfg.layout.train
    moe = model.moe
    on_cpu = hw.kind == "cpu"
    only_dp = torch_searched(cfg)
    tps = [t.tp] if t.tp else powers_of_two(min(world, hw.gpus_per_node))
    pps = [t.pp] if t.pp else [p for p in divisors(world) if p <= min(MAX_PP, model.num_layers)]
    cps = [t.cp] if t.cp else powers_of_two(min(world, MAX_CP))
    if only_dp:
        tps, pps, cps = [t.tp or 1], [t.pp or 1], [t.cp or 1]
    if t.recompute.granularity:
        recomputes: tuple[str, ...] = (t.recompute.granularity,)
    else:
        recomputes = (RECOMPUTE_NONE,) if on_cpu else RECOMPUTES
    # megatron-core's token dispatcher where unset; the torch trainer runs the model's own
    dispatcher = "alltoall" if moe is not None and not only_dp else None
    for tp in tps:
        for pp in pps:
            for cp in cps:
                if world % (tp * pp * cp):
                    continue
                dp = world // (tp * pp * cp)
                if t.dp is not None and t.dp != dp:
                    continue
                etps = [t.etp] if t.etp else ([1, tp] if moe is not None and tp > 1 else [1])
                if only_dp:
                    etps = [t.etp or 1]
                for etp in etps:
                    grid = world // pp
                    if t.ep:
                        eps = [t.ep]
                    elif moe is None or on_cpu or only_dp:
                        eps = [1]
                    else:
                        eps = [e for e in divisors(moe.num_experts) if grid % (e * etp) == 0]
                    for ep in eps:
                        for first, last in _pipeline_splits(
                            model.num_layers,
                            pp,
                            t.num_layers_in_first_pipeline_stage,
                            t.num_layers_in_last_pipeline_stage,
                        ):
                            for recompute in recomputes:
                                yield ParallelLayout.from_train(
                                    t,
                                    tp=tp,
                                    pp=pp,
                                    cp=cp,
                                    ep=ep,
                                    etp=etp,
                                    dp=dp,
                                    sequence_parallel=(
                                        tp > 1
                                        if t.sequence_parallel is None
                                        else t.sequence_parallel
                                    ),
                                    recompute=recompute,
                                    dispatcher=dispatcher,
                                    stages=(first, last),
                                )


def engine_layouts(cfg: RunConfig, sizes: Sizes) -> Iterator[EngineLayout]:
    """Every engine size (and, for MoE, dp-attention size) over the rollout GPUs."""
    rollout, model, hw = cfg.layout.rollout, cfg.model, cfg.hardware
    fixed = engine_options(cfg)
    fp8 = checkpoint_fp8(cfg.model.hf_checkpoint)
    if rollout.gpus_per_engine:
        engine_sizes = [rollout.gpus_per_engine]
    elif hw.kind == "cpu":
        engine_sizes = [1]
    else:
        engine_sizes = powers_of_two(sizes.rollout_gpus)
    dp_fixed = "enable_dp_attention" in fixed or "dp_size" in fixed
    for size in engine_sizes:
        if sizes.rollout_gpus % size:
            continue
        if dp_fixed or model.moe is None:
            dp_options = [engine_shape(fixed)[0]]
        else:
            dp_options = powers_of_two(size)
        for dp_size in dp_options:
            options = dict(fixed)
            if dp_size > 1 and not dp_fixed:
                options.update(enable_dp_attention=True, dp_size=dp_size)
            # the options the layout will set (SGLang's default fraction stays derived)
            fraction = options.get("mem_fraction_static") or default_mem_fraction(
                hw, size, dp_size, options, sizes.colocate
            )
            ep_size = engine_shape(options)[1]
            yield EngineLayout(
                gpus_per_engine=size,
                num_engines=sizes.rollout_gpus // size,
                mem_fraction_static=float(fraction),
                dp_size=dp_size,
                ep_size=ep_size,
                sglang=tuple(options.items()),
                fp8=fp8,
            )


# ----------------------------------------------------------------------------- the search


def with_adam(cfg: RunConfig, cpu_offload: bool) -> RunConfig:
    """The config with Adam on the host or the GPU (the seeds' CPU Adam settings); for the
    torch trainer, FSDP2's offload of its shards (layout.train.fsdp.cpu_offload)."""
    if torch_searched(cfg):
        return with_fsdp(cfg, cpu_offload=cpu_offload)
    optim = cfg.recipe.optim
    if optim.cpu_offload == cpu_offload:
        return cfg
    changes: dict[str, Any] = dict(CPU_ADAM if cpu_offload else GPU_ADAM)
    recipe = cfg.recipe.model_copy(update={"optim": optim.model_copy(update=changes)})
    return cfg.model_copy(update={"recipe": recipe})


def with_fsdp(cfg: RunConfig, **values: Any) -> RunConfig:
    """The config with these keys of layout.train.fsdp (the torch trainer's FSDP2 options)
    set; the config itself where it has no such section or already has them."""
    train = cfg.layout.train
    fsdp: Any = getattr(train, "fsdp", None)
    if fsdp is None or all(getattr(fsdp, key) == value for key, value in values.items()):
        return cfg
    fsdp = fsdp.model_copy(update=values)
    layout = cfg.layout.model_copy(update={"train": train.model_copy(update={"fsdp": fsdp})})
    return cfg.model_copy(update={"layout": layout})


def _reshard_options(cfg: RunConfig) -> tuple[bool | None, ...]:
    """The torch trainer's reshard_after_forward to try: both where the config leaves it
    null (true needs the least memory, false gathers half as often), else the one set;
    (None,) where nothing is to choose (megatron, or no layout.train.fsdp)."""
    if not torch_searched(cfg) or not FSDP_IN_SCHEMA:
        return (None,)
    section: Any = cfg.layout.train.fsdp
    if section.reshard_after_forward is None:
        return (True, False)
    return (bool(section.reshard_after_forward),)


def _variants(cfg: RunConfig) -> list[tuple[bool, RunConfig]]:
    """(where Adam runs, the config so) for each trainer state placement searched."""
    variants = []
    for flag in _adam_options(cfg):
        adam = with_adam(cfg, flag)
        for reshard in _reshard_options(cfg):
            variants.append(
                (
                    flag,
                    with_fsdp(adam, reshard_after_forward=reshard) if reshard is not None else adam,
                )
            )
    return variants


def _adam_options(cfg: RunConfig) -> tuple[bool, ...]:
    """Where Adam may run: the GPU, and the host when the config validates with it (never
    on CPU hardware, where it already is). The torch trainer's state moves with FSDP2's
    offload, searched where the schema has layout.train.fsdp."""
    if torch_searched(cfg):
        return (False, True) if FSDP_IN_SCHEMA else (fsdp_options(cfg).cpu_offload,)
    try:
        RunConfig.model_validate(with_adam(cfg, not cfg.recipe.optim.cpu_offload).model_dump())
    except ValueError:
        return (cfg.recipe.optim.cpu_offload,)
    return (False, True)


def _first_reason(issues: list[Issue]) -> str:
    issue = issues[0]
    return f"{issue.key}: {issue.message}"


@dataclass
class _Split:
    """One GPU split's options, each side sorted cheapest first."""

    sizes: Sizes
    trains: list[TrainOption] = field(default_factory=list)
    engines: list[EngineOption] = field(default_factory=list)
    rejected_trains: list[tuple[TrainOption, str]] = field(default_factory=list)
    rejected_engines: list[tuple[EngineOption, str]] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (description, reason)
    enumerated_trains: int = 0
    enumerated_engines: int = 0


class _Searcher:
    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.params: ParamCount = count_params(cfg.model)
        self.variants = _variants(cfg)
        self.margin = MARGIN_FRACTION * cfg.hardware.gpu_memory_gib
        self.fsdp = fsdp_options(cfg) if torch_searched(cfg) else None
        # mode=eval: the train side only sends weights (or does not start), nothing to time
        self.train_ranks = train_rank_work(cfg)
        self.trains = self.train_ranks == TRAIN
        self.skip = skipped_rules(self.train_ranks)

    def _train_memory(self, cfg: RunConfig, par: ParallelLayout, sizes: Sizes) -> TrainMemory:
        if self.train_ranks == SEND_WEIGHTS:
            return estimate_sender(cfg, par, sizes.colocate, cfg.engine.weight_bucket_mb << 20)
        return estimate_trainer(cfg, par, sizes.colocate)

    def _dummy_engine(self, sizes: Sizes) -> EngineLayout:
        return EngineLayout(1, sizes.rollout_gpus, 0.8, 1, 1, ())

    def _batch(self, par: ParallelLayout) -> BatchPlan:
        return plan_batch(self.cfg.recipe, par, self._dummy_engine(Sizes(True, 1, 1, 1)))

    def split(self, sizes: Sizes) -> _Split:
        out = _Split(sizes)
        probe = ParallelLayout.single_process(dp=sizes.train_gpus)
        run_issues = run_checks(
            PlanContext(self.cfg, sizes, probe, self._dummy_engine(sizes)), "run"
        )
        if run_issues:
            out.refused.append((describe_split(sizes), _first_reason(run_issues)))
            return out
        self._trains(out)
        if out.trains:
            self._engines(out)
        return out

    def _trains(self, out: _Split) -> None:
        sizes, hw = out.sizes, self.cfg.hardware
        engine = self._dummy_engine(sizes)
        device = device_word(hw.kind)
        seen: set[tuple[Any, ...]] = set()
        for par in train_layouts(self.cfg, sizes.train_gpus):
            batch = None
            for cpu_offload, cfg in self._with_shard_groups(par):
                side = self._train_side(par, cpu_offload, cfg)
                if side is not None and side in seen:
                    continue  # mode=eval: differs from one already enumerated in training only
                out.enumerated_trains += 1
                issues = run_checks(PlanContext(cfg, sizes, par, engine), "train", skip=self.skip)
                if issues:
                    out.refused.append(
                        (
                            describe_train(par, cpu_offload, self.fsdp, on_gpu=hw.kind == "gpu"),
                            _first_reason(issues),
                        )
                    )
                    break  # the rules do not depend on where Adam runs, nor on resharding
                memory = self._train_memory(cfg, par, sizes)
                batch = batch or self._batch(par)
                work = plan_work(cfg, par, batch)
                timing = train_time(cfg, par, batch, work, memory, sizes.train_gpus)
                offload = offload_time(cfg, sizes, memory) if self.trains else 0.0
                option = TrainOption(
                    par, cpu_offload, memory, timing, offload, hw.kind == "gpu", self.train_ranks
                )
                host = estimate_host(cfg.model, cfg.recipe, hw, memory, sizes, self.trains)
                short = memory.total_gib + self.margin - hw.gpu_memory_gib
                if self.train_ranks == NO_TRAIN_RANK:  # nothing of it starts: held to nothing
                    short = -1.0
                if short > 0:
                    out.rejected_trains.append(
                        (
                            option,
                            f"needs {memory.total_gib:.1f} GiB per {device} for training, "
                            f"{short:.1f} more than {hw.gpu_memory_gib:g} less a "
                            f"{self.margin:.1f} GiB margin",
                        )
                    )
                elif host.total_gib > host.host_gib:
                    out.rejected_trains.append(
                        (
                            option,
                            f"needs {host.total_gib:.0f} GiB of host memory per node "
                            f"(has {host.host_gib:g})",
                        )
                    )
                else:
                    out.trains.append(option)
                if side is not None:
                    seen.add(side)
        self._more_memory_only_where_it_pays(out)
        out.trains.sort(key=lambda o: o.seconds)

    def _train_side(
        self, par: ParallelLayout, cpu_offload: bool, cfg: RunConfig
    ) -> tuple[Any, ...] | None:
        """What an evaluation's train side depends on, one train option enumerated for each:
        nothing where no train rank starts (one for the split), the grid and the torch
        trainer's FSDP2 options where they send the weights (rlpost.plan.search.sending_grid:
        neither recompute, context parallelism nor where Adam runs: they build no optimizer
        and run no forward); None in training, where every choice is its own option."""
        if self.train_ranks == NO_TRAIN_RANK:
            return ()
        if self.train_ranks == SEND_WEIGHTS:
            fsdp = fsdp_options(cfg) if self.fsdp is not None else None
            return sending_grid(par), fsdp
        return None

    def _with_shard_groups(self, par: ParallelLayout) -> list[tuple[bool, RunConfig]]:
        """The variants, each with the torch trainer's shard group searched where the config
        leaves layout.train.fsdp.shard_group_size null: every DP rank, and HSDP within each
        node when the DP ranks span several whole nodes (the all-gathers stay on the node's
        links; the replicas all-reduce their shards' gradients across nodes)."""
        node = self.cfg.hardware.gpus_per_node
        if (
            not torch_searched(self.cfg)
            or not FSDP_IN_SCHEMA
            or fsdp_options(self.cfg).shard_group_size is not None
            or par.dp <= node
            or par.dp % node
        ):
            return self.variants
        return [
            (flag, cfg)
            for flag, base in self.variants
            for cfg in (base, with_fsdp(base, shard_group_size=node))
        ]

    def _more_memory_only_where_it_pays(self, out: _Split) -> None:
        """A torch layout that holds more memory for fewer or shorter collectives, by keeping
        its layers gathered from forward to backward or by sharding within each node (HSDP),
        stays a candidate only when each of the two it uses trains at least LEANER_WITHIN
        faster than the same layout without it (resharding after the forward; sharded over
        every DP rank), where that layout fits."""
        fitting = {(t.parallel, t.fsdp): t for t in out.trains if t.fsdp is not None}
        for (par, fsdp), t in fitting.items():
            assert fsdp is not None
            leaner = []
            if not fsdp.reshard_after_forward:
                leaner.append(
                    ("resharding after the forward", replace(fsdp, reshard_after_forward=True))
                )
            if fsdp.shard_group_size is not None:
                leaner.append(("sharded over all DP ranks", replace(fsdp, shard_group_size=None)))
            for what, twin in leaner:
                other = fitting.get((par, twin))
                if other is None:
                    continue  # it does not fit, or the config sets the key
                gain = 1.0 - t.seconds / other.seconds
                if gain < LEANER_WITHIN:
                    more = t.memory.total_gib - other.memory.total_gib
                    out.trains.remove(t)
                    out.rejected_trains.append(
                        (
                            t,
                            f"trains {gain:.1%} faster than the same layout {what}, for "
                            f"{more:.1f} GiB more per {device_word(self.cfg.hardware.kind)} "
                            f"(taken from a {LEANER_WITHIN:.0%} gain)",
                        )
                    )
                    break

    def _engines(self, out: _Split) -> None:
        sizes, cfg = out.sizes, self.cfg
        probe = out.trains[0].parallel
        device = device_word(cfg.hardware.kind)
        batch = self._batch(probe)
        for engine in engine_layouts(cfg, sizes):
            out.enumerated_engines += 1
            issues = run_checks(PlanContext(cfg, sizes, probe, engine), "engine", skip=self.skip)
            if issues:
                out.refused.append((describe_engine(engine), _first_reason(issues)))
                continue
            memory = estimate_rollout(
                cfg.model,
                longest_request(cfg),
                cfg.hardware,
                engine.gpus_per_engine,
                engine.dp_size,
                engine.mem_fraction_static,
                engine.options,
                sizes.colocate,
                engine.fp8,
            )
            timing = rollout_time(cfg, engine, memory, batch, self.params)
            option = EngineOption(engine, memory, timing)
            if not memory.holds_one_sample:
                out.rejected_engines.append(
                    (
                        option,
                        f"its KV cache holds {memory.kv_cache_tokens_per_gpu} tokens per {device}, "
                        f"less than one {memory.longest_sample_tokens}-token sample",
                    )
                )
            elif memory.total_gib > cfg.hardware.gpu_memory_gib:
                out.rejected_engines.append(
                    (option, f"needs {memory.total_gib:.1f} GiB per engine {device}")
                )
            else:
                out.engines.append(option)
        out.engines.sort(key=lambda o: o.time.total_s)

    def cost(self, sizes: Sizes, train: TrainOption, engine: EngineOption) -> StepCost:
        """Training, generation, the weight push and offload of one rollout; in mode=eval the
        evaluation's work: generation and the one push (none without train ranks)."""
        pushes = self.train_ranks != NO_TRAIN_RANK
        return StepCost(
            train=train.time,
            rollout=engine.time,
            sync_s=sync_time(self.cfg, sizes, engine.engine, self.params) if pushes else 0.0,
            offload_s=train.offload_s,
            overlapped=asynchronous(self.cfg) and not sizes.colocate,
        )


def search_layout(cfg: RunConfig, reference: tuple[str, RunConfig] | None = None) -> LayoutSearch:
    """Every candidate checked and sized, the fastest first; `reference` (name, config) is a
    hand-written layout for the same run to rate beside them."""
    start = time.perf_counter()
    searcher = _Searcher(cfg)
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
    if chosen is None:
        result = replace(result, suggestions=tuple(_suggestions(cfg, splits)))
    if reference is not None:
        result = replace(result, reference=rate_reference(result, splits, *reference))
    return replace(result, seconds=time.perf_counter() - start)


def _faster_than(splits: list[_Split], searcher: _Searcher, bound: float) -> int:
    """How many feasible candidates are predicted faster than `bound` seconds."""
    count = 0
    for s in splits:
        for e in s.engines:
            for t in s.trains:
                if searcher.cost(s.sizes, t, e).total_s < bound:
                    count += 1
    return count


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


def _suggestions(cfg: RunConfig, splits: list[_Split]) -> list[str]:
    """Nothing fits: what would (CPU Adam, a shorter max_tokens_per_gpu, more GPUs); in
    mode=eval, what the evaluation holds alone: the weights its train ranks send, if any
    start, and the engines'."""
    found = []
    device = device_word(cfg.hardware.kind)
    trains = [t for s in splits for t, _ in s.rejected_trains]
    work = train_rank_work(cfg)
    if trains and work == SEND_WEIGHTS:
        least = min(trains, key=lambda t: t.memory.total_gib)
        budget = cfg.hardware.gpu_memory_gib * (1 - MARGIN_FRACTION)
        found.append(
            f"the train ranks that load the evaluated weights and send them to the engines "
            f"need {least.memory.total_gib:.1f} GiB per {device} of {budget:.1f} usable at the "
            f"least ({describe_grid(least.parallel, least.fsdp)}): use a larger hardware "
            "profile, or evaluate a Hugging Face folder of the weights (model.hf_checkpoint, "
            "without model.load or run.resume), which the engines load themselves"
        )
    elif trains and work == TRAIN:
        rejected = [pair for s in splits for pair in s.rejected_trains]
        least, why = min(rejected, key=lambda pair: pair[0].memory.total_gib)
        budget = cfg.hardware.gpu_memory_gib * (1 - MARGIN_FRACTION)
        leanest = least.describe()
        if least.memory.total_gib <= budget:  # its GPUs hold it: something else does not
            found.append(f"the leanest training layout ({leanest}) {why}")
        else:
            found.append(
                f"the leanest training layout ({leanest}) "
                f"needs {least.memory.total_gib:.1f} GiB per {device} of {budget:.1f} usable"
            )
        if least.fsdp is not None:  # each remedy tried on the torch trainer's estimate
            if least.memory.total_gib > budget:
                colocate = any(
                    t is least for s in splits if s.sizes.colocate for t, _ in s.rejected_trains
                )
                remedies = fsdp_fixes(cfg, least.parallel, colocate, budget)  # what it accepts
                found.append("for the torch trainer, " + remedies)
        else:
            static = least.memory.total_gib - least.memory.activations_gib - least.memory.logits_gib
            tokens = cfg.recipe.train.max_tokens_per_gpu
            if static < budget < least.memory.total_gib and tokens:
                colocate = any(
                    t is least for s in splits if s.sizes.colocate for t, _ in s.rejected_trains
                )
                adam = with_adam(cfg, least.cpu_offload)
                fits = shorter_tokens(adam, least.parallel, colocate, budget)
                if fits:
                    found.append(
                        f"recipe.train.max_tokens_per_gpu={fits[0]} fits it ({fits[1]:.1f} GiB)"
                    )
            found.append(_more_megatron_gpus(cfg, splits, least, budget))
    engines = [e for s in splits for e, _ in s.rejected_engines]
    if engines and not any(s.engines for s in splits):
        response = longest_request(cfg).response_key
        found.append(
            "no engine holds one sample: give the rollout more GPUs, raise "
            f"layout.rollout.sglang.mem_fraction_static or shorten {response}"
        )
    return found


def _more_megatron_gpus(
    cfg: RunConfig, splits: list[_Split], least: TrainOption, budget: float
) -> str:
    """The fewest GPUs on which megatron-core's estimate fits a split of the model, with the
    leanest layout's recompute and optimizer (rlpost.plan.remedies.megatron_fewest_gpus),
    counted as a profile needs them: the engines' GPUs too where the leanest layout has its
    own."""
    hw = cfg.hardware
    device, devices = device_word(hw.kind), device_word(hw.kind, 2)
    split = next(s for s in splits if any(t is least for t, _ in s.rejected_trains))
    t = cfg.layout.train  # the first and last stages as the user sets them, not the search
    par = replace(
        least.parallel,
        num_layers_in_first_pipeline_stage=t.num_layers_in_first_pipeline_stage,
        num_layers_in_last_pipeline_stage=t.num_layers_in_last_pipeline_stage,
    )
    found = megatron_fewest_gpus(
        with_adam(cfg, least.cpu_offload), par, split.sizes.colocate, budget
    )
    if found is None:
        nothing = (
            f"no split of the model over up to {MAX_TRAIN_GPUS} {devices} of "
            f"{hw.gpu_memory_gib:g} GiB fits megatron-core's estimate: "
        )
        if hw.kind != "gpu":  # a device slot's memory is nominal
            return nothing + slot_fix(least.memory.total_gib / (1 - MARGIN_FRACTION))
        return nothing + "use GPUs with more memory"
    grid, need = found
    rollout = 0 if split.sizes.colocate else split.sizes.rollout_gpus
    total = grid.world + rollout
    nodes = -(-total // hw.gpus_per_node)
    engines = f", besides the engines' {rollout}" if rollout else ""
    return (
        f"megatron-core's estimate fits training on {grid.world} {devices}{engines} "
        f"({describe_train(grid, least.cpu_offload, on_gpu=hw.kind == 'gpu')}: {need:.1f} GiB "
        f"per {device}, and the host's memory per node): use a hardware profile with {total} "
        f"{devices} of {hw.gpu_memory_gib:g} GiB ({nodes} node(s) of {hw.gpus_per_node})"
    )


# ----------------------------------------------------------------------------- the choice


def layout_overrides(c: Candidate) -> dict[str, Any]:
    """The chosen layout as config values (key path -> value)."""
    par, eng, sizes = c.parallel, c.engine, c.sizes
    values: dict[str, Any] = {
        "layout.colocate": sizes.colocate,
        "layout.train.num_gpus": sizes.train_gpus,
        "layout.train.tp": par.tp,
        "layout.train.sequence_parallel": par.sequence_parallel,
        "layout.train.pp": par.pp,
        "layout.train.cp": par.cp,
        "layout.train.ep": par.ep,
        "layout.train.etp": par.etp,
        "layout.train.dp": par.dp,
        "layout.train.recompute.granularity": par.recompute,
    }
    if par.num_layers_in_first_pipeline_stage:
        values["layout.train.num_layers_in_first_pipeline_stage"] = (
            par.num_layers_in_first_pipeline_stage
        )
    if par.num_layers_in_last_pipeline_stage:
        values["layout.train.num_layers_in_last_pipeline_stage"] = (
            par.num_layers_in_last_pipeline_stage
        )
    if not sizes.colocate:
        values["layout.rollout.num_gpus"] = sizes.rollout_gpus
    values["layout.rollout.gpus_per_engine"] = eng.gpus_per_engine
    for name, value in eng.sglang:
        values[f"layout.rollout.sglang.{name}"] = value
    fsdp = c.train.fsdp
    if fsdp is None:
        values["recipe.optim.cpu_offload"] = c.train.cpu_offload
    elif FSDP_IN_SCHEMA:
        values[FSDP_OFFLOAD_KEY] = fsdp.cpu_offload
        values[FSDP_RESHARD_KEY] = fsdp.reshard_after_forward
        if fsdp.shard_group_size is not None:
            values[FSDP_GROUP_KEY] = fsdp.shard_group_size
    return values


def searched_keys(cfg: RunConfig, chosen: Candidate) -> tuple[str, ...]:
    """The key paths the search filled in: null in the layout (and where Adam runs)."""
    data: Any = cfg.model_dump()
    found = []
    for path in layout_overrides(chosen):
        node = data
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is None or path in ("recipe.optim.cpu_offload", FSDP_OFFLOAD_KEY):
            found.append(path)
    return tuple(found)


def _set(data: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value


def apply_choice(cfg: RunConfig, chosen: Candidate) -> RunConfig:
    """The run's config with the chosen layout written into it (and Adam where chosen)."""
    data = with_adam(cfg, chosen.train.cpu_offload).model_dump()
    for path, value in layout_overrides(chosen).items():
        _set(data, path, value)
    return RunConfig.model_validate(data)


def nothing_fits(search: LayoutSearch) -> UserError:
    lines = "; ".join(search.suggestions) or "see the rejected layouts in mode=plan"
    return UserError(
        [
            Issue(
                "layout",
                f"no layout fits: {search.enumerated} candidates searched, none passes every "
                "check with its memory",
                lines,
                "auto",
            )
        ],
        title="planning error",
    )


# ----------------------------------------------------------------------------- a reference


def rate_reference(
    search: LayoutSearch, splits: list[_Split], name: str, ref: RunConfig
) -> Reference:
    """A hand-written layout rated by the same cost model, and why the choice differs."""
    from rlpost.plan.plan import build_plan

    try:
        plan = build_plan(ref)
    except UserError as exc:
        return Reference(name, name, None, None, f"it does not plan: {exc.issues[0].message}")
    searcher = _Searcher(ref)
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


# ----------------------------------------------------------------------------- the entry


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


def choose_layout(cfg: RunConfig) -> tuple[RunConfig, LayoutSearch]:
    """The config with the fastest layout that plans written in, and the search; UserError
    when nothing fits (saying what would)."""
    from rlpost.plan.plan import build_plan

    unsearchable = generic_model_issues(cfg)  # no layout changes which trainer builds the model
    if unsearchable:
        raise UserError(unsearchable, title="planning error")
    search = search_layout(cfg, shipped_reference(cfg))
    refused: list[Issue] = []
    for candidate in search.ranked:
        try:
            chosen = apply_choice(cfg, candidate)
            build_plan(chosen)
        except UserError as exc:  # a rule that reads both sides at once
            refused.extend(exc.issues)
            continue
        except ValueError as exc:  # the config refuses the combination
            refused.append(Issue("layout", f"{candidate.describe()}: {exc}", "", "auto"))
            continue
        if candidate is not search.chosen:
            search = replace(search, chosen=candidate)
        return chosen, search
    if refused:
        raise UserError(refused, title="planning error")
    raise nothing_fits(search)
