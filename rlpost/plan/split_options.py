"""The training and engine options of one GPU split, each side checked (the rules that read
it alone: rlpost.plan.checks SCOPES), sized and timed on its own, and sorted cheapest first;
the cost of a training option and an engine option together."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from rlpost.errors import Issue
from rlpost.plan.batch import BatchPlan, plan_batch
from rlpost.plan.candidates import (
    EngineOption,
    TrainOption,
    describe_engine,
    describe_split,
    describe_train,
    sending_grid,
)
from rlpost.plan.checks import PlanContext, run_checks
from rlpost.plan.cost import StepCost, offload_time, rollout_time, sync_time, train_time
from rlpost.plan.engine_memory import estimate_rollout, longest_request
from rlpost.plan.fsdp import FSDP_IN_SCHEMA, estimate_sender, estimate_trainer, fsdp_options
from rlpost.plan.layout import EngineLayout, ParallelLayout, Sizes
from rlpost.plan.loop import asynchronous
from rlpost.plan.memory import TrainMemory, estimate_host
from rlpost.plan.params import ParamCount, count_params
from rlpost.plan.search_space import (
    engine_layouts,
    torch_searched,
    train_layouts,
    variants,
    with_fsdp,
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
LEANER_WITHIN = 0.05
"""The training-time gain for which the search takes a torch layout that holds more memory
than its leanest twin (layers kept gathered from forward to backward, or shards within each
node): the cost model's times are not finer than that, and the memory is certain."""


def _first_reason(issues: list[Issue]) -> str:
    issue = issues[0]
    return f"{issue.key}: {issue.message}"


@dataclass
class SplitOptions:
    """One GPU split's options, each side sorted cheapest first."""

    sizes: Sizes
    trains: list[TrainOption] = field(default_factory=list)
    engines: list[EngineOption] = field(default_factory=list)
    rejected_trains: list[tuple[TrainOption, str]] = field(default_factory=list)
    rejected_engines: list[tuple[EngineOption, str]] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (description, reason)
    enumerated_trains: int = 0
    enumerated_engines: int = 0


class Searcher:
    """One run's splits, each side checked, sized and timed; the cost of a pair."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.params: ParamCount = count_params(cfg.model)
        self.variants = variants(cfg)
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

    def split(self, sizes: Sizes) -> SplitOptions:
        out = SplitOptions(sizes)
        probe = ParallelLayout.single_process(dp=sizes.train_gpus)
        run_issues = run_checks(
            PlanContext(self.cfg, sizes, probe, self._dummy_engine(sizes)), "run"
        )
        if run_issues:
            out.refused.append((describe_split(sizes), _first_reason(run_issues)))
            return out
        self._trains(out)
        if out.trains:
            self.engines(out, out.trains[0].parallel)
        return out

    def _trains(self, out: SplitOptions) -> None:
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
        trainer's FSDP2 options where they send the weights (rlpost.plan.candidates.sending_grid:
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

    def _more_memory_only_where_it_pays(self, out: SplitOptions) -> None:
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

    def engines(self, out: SplitOptions, probe: ParallelLayout) -> None:
        """The split's engine options, checked beside the training grid `probe`."""
        sizes, cfg = out.sizes, self.cfg
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
