"""The layout search's candidates: a training option, an engine option and the two together
(with its predicted cost), the layouts that lost and the shipped one rated beside the choice;
what identifies a candidate, how each is described, and the config values it sets."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from rlpost.plan.cost import RolloutTime, StepCost, TrainTime
from rlpost.plan.engine_memory import RolloutMemory
from rlpost.plan.fsdp import (
    FSDP_GROUP_KEY,
    FSDP_IN_SCHEMA,
    FSDP_OFFLOAD_KEY,
    FSDP_RESHARD_KEY,
    FsdpOptions,
    FsdpTrainMemory,
)
from rlpost.plan.layout import RECOMPUTE_NONE, EngineLayout, ParallelLayout, Sizes
from rlpost.plan.memory import TrainMemory
from rlpost.plan.work import NO_TRAIN_RANK, SEND_WEIGHTS, TRAIN
from rlpost.schema.hardware import device_word


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
