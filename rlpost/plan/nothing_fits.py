"""The layout search's report when nothing fits: what would (CPU Adam, a shorter
max_tokens_per_gpu, the torch trainer's remedies, more GPUs), as one planning error."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from rlpost.errors import Issue, UserError
from rlpost.plan.candidates import (
    Candidate,
    LayoutSearch,
    TrainOption,
    describe_engine,
    describe_grid,
    describe_split,
    describe_train,
)
from rlpost.plan.checks import PlanContext, run_checks
from rlpost.plan.engine_fit import EngineFit, engines_short, fit_engines
from rlpost.plan.engine_memory import longest_request
from rlpost.plan.layout import EngineLayout, ParallelLayout, Sizes
from rlpost.plan.remedies import (
    MAX_TRAIN_GPUS,
    fsdp_fixes,
    megatron_fewest_gpus,
    profile_gpus,
    shorter_tokens,
    slot_fix,
)
from rlpost.plan.search_space import with_adam
from rlpost.plan.split_options import MARGIN_FRACTION, Searcher, SplitOptions
from rlpost.plan.work import SEND_WEIGHTS, TRAIN, train_rank_work
from rlpost.schema import RunConfig
from rlpost.schema.hardware import device_word

Search = Callable[[RunConfig], Candidate | None]  # the layout the search chooses for a run


def suggestions(cfg: RunConfig, splits: list[SplitOptions], search: Search) -> list[str]:
    """Nothing fits: what would (CPU Adam, a shorter max_tokens_per_gpu, more GPUs); in
    mode=eval, what the evaluation holds alone: the weights its train ranks send, if any
    start, and the engines'. `search` is layout=auto's own, to try fewer nodes with."""
    found = []
    told = False
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
        split = next(s for s in splits if any(t is least for t, _ in s.rejected_trains))
        colocate = split.sizes.colocate
        budget = cfg.hardware.gpu_memory_gib * (1 - MARGIN_FRACTION)
        leanest = least.describe()
        trained = next((s for s in splits if s.trains), None)
        if trained is not None:  # training fits a split: its engines are what does not
            sizes = trained.sizes
            where = "beside it" if sizes.colocate else f"its {sizes.rollout_gpus} rollout GPUs"
            found.append(
                f"training fits {describe_split(sizes)} "
                f"({trained.trains[0].describe()}), but no engine fits {where}"
            )
        elif least.memory.total_gib <= budget:  # its GPUs hold it: something else does not
            found.append(f"the leanest training layout ({leanest}) {why}")
        else:
            found.append(
                f"the leanest training layout ({leanest}) "
                f"needs {least.memory.total_gib:.1f} GiB per {device} of {budget:.1f} usable"
            )
        if least.fsdp is not None:  # each remedy tried on the torch trainer's estimate
            if least.memory.total_gib > budget:
                remedies = fsdp_fixes(cfg, least.parallel, colocate, budget)  # what it accepts
                found.append("for the torch trainer, " + remedies)
        else:
            static = least.memory.total_gib - least.memory.activations_gib - least.memory.logits_gib
            tokens = cfg.recipe.train.max_tokens_per_gpu
            if static < budget < least.memory.total_gib and tokens and trained is None:
                adam = with_adam(cfg, least.cpu_offload)
                fits = shorter_tokens(adam, least.parallel, colocate, budget)
                if fits:
                    found.append(
                        f"recipe.train.max_tokens_per_gpu={fits[0]} fits it ({fits[1]:.1f} GiB)"
                    )
            found.append(_more_megatron_gpus(cfg, split, least, budget, search))
            told = cfg.hardware.kind == "gpu"  # the GPUs named hold the engines, or it says so
    engines = [e for s in splits for e, _ in s.rejected_engines]
    if engines and not any(s.engines for s in splits) and not told:
        response = longest_request(cfg).response_key
        found.append(
            "no engine holds one sample: give the rollout more GPUs, raise "
            f"layout.rollout.sglang.mem_fraction_static or shorten {response}"
        )
    return found


def _more_megatron_gpus(
    cfg: RunConfig, split: SplitOptions, least: TrainOption, budget: float, search: Search
) -> str:
    """The fewest GPUs on which megatron-core's estimate fits a split of the model, with the
    leanest layout's recompute and optimizer (rlpost.plan.remedies.megatron_fewest_gpus),
    counted as a profile needs them: whole nodes, with the engines (rlpost.plan.engine_fit)
    beside training where one fits there, else on GPUs of their own, whichever takes fewer
    nodes; where no engine fits GPUs of this memory, that instead of a count. That grid is
    narrower than the search's: where the search finds a layout on fewer whole nodes, the
    fewest of them and the layout it chooses there (`_fewer_nodes`)."""
    hw = cfg.hardware
    devices = device_word(hw.kind, 2)
    t = cfg.layout.train  # the first and last stages as the user sets them, not the search
    par = replace(
        least.parallel,
        num_layers_in_first_pipeline_stage=t.num_layers_in_first_pipeline_stage,
        num_layers_in_last_pipeline_stage=t.num_layers_in_last_pipeline_stage,
    )
    adam = with_adam(cfg, least.cpu_offload)
    if hw.kind != "gpu":  # a device slot's memory is nominal: the slot's size is the remedy
        sizes = split.sizes
        on_cpu = megatron_fewest_gpus(adam, par, sizes.colocate, budget)
        if on_cpu is None:
            return (
                f"no split of the model over up to {MAX_TRAIN_GPUS} {devices} of "
                f"{hw.gpu_memory_gib:g} GiB fits megatron-core's estimate: "
                + slot_fix(least.memory.total_gib / (1 - MARGIN_FRACTION))
            )
        return _profile_text(
            cfg, least, on_cpu, None, beside=sizes.rollout_gpus * (not sizes.colocate)
        )
    searcher = Searcher(cfg)
    fits = [fit_engines(searcher, colocate, par) for colocate in _placements(cfg, par)]
    if not any(fit.engine for fit in fits):
        return engines_short(cfg, fits)
    found = []
    for fit in (f for f in fits if f.engine):
        beside = 0 if fit.colocate else cfg.layout.rollout.num_gpus or fit.gpus
        node = hw.gpus_per_node
        held = beside if hw.total_gpus <= node else -(-beside // node) * node
        above = hw.total_gpus if fit.colocate else max(1, hw.total_gpus - held)
        engine = fit.gpus if fit.colocate else 1  # the colocated engines divide the GPUs
        grid = megatron_fewest_gpus(adam, par, fit.colocate, budget, above, beside, engine)
        if grid is not None:
            found.append((profile_gpus(hw, grid[0].world, beside), fit, grid))
    if not found:
        return (
            f"no split of the model over up to {MAX_TRAIN_GPUS} {devices} of "
            f"{hw.gpu_memory_gib:g} GiB fits megatron-core's estimate: use GPUs with more memory"
        )
    total, fit, grid = min(found, key=lambda option: option[0])
    fewer = _fewer_nodes(cfg, total // hw.gpus_per_node, search)
    if fewer is not None:
        gpus, chosen = fewer
        size = f"{gpus} {devices} of {hw.gpu_memory_gib:g} GiB"
        return (
            f"layout=auto finds a layout on {size} ({chosen.describe()}): use a hardware "
            f"profile with {size} ({gpus // hw.gpus_per_node} node(s) of {hw.gpus_per_node})"
        )
    apart = [f for f in fits if f.colocate and f.engine is None]
    return _profile_text(cfg, least, grid, fit, bool(apart))


def _fewer_nodes(cfg: RunConfig, nodes: int, search: Search) -> tuple[int, Candidate] | None:
    """The GPUs of the fewest whole nodes below `nodes` (and above the profile's own) on which
    the search finds a layout, with the layout it chooses: it tries one node fewer at a time
    and stops at the first count on which it finds none; None where it finds none below."""
    hw, best = cfg.hardware, None
    for count in range(nodes - 1, hw.num_nodes, -1):
        fewer = hw.model_copy(update={"num_nodes": count})
        chosen = search(cfg.model_copy(update={"hardware": fewer}))
        if chosen is None:
            break
        best = (fewer.total_gpus, chosen)
    return best


def _placements(cfg: RunConfig, par: ParallelLayout) -> list[bool]:
    """Colocated (True) and apart (False), where the layout and the run's rules allow each
    (an asynchronous loop's engines run apart: the run-scope checks say so)."""
    layout, found = cfg.layout, []
    if layout.colocate is not False and not layout.rollout.num_gpus:
        sizes = Sizes(True, par.world, par.world, par.world)
        engine = EngineLayout(1, par.world, 0.8, 1, 1, ())
        if not run_checks(PlanContext(cfg, sizes, par, engine), "run"):
            found.append(True)
    if layout.colocate is not True:
        found.append(False)
    return found


def _profile_text(
    cfg: RunConfig,
    least: TrainOption,
    grid: tuple[ParallelLayout, float],
    fit: EngineFit | None,
    apart: bool = False,
    beside: int = 0,
) -> str:
    """Training on grid's GPUs, the engines beside it or on GPUs of their own (`fit`; None
    on a CPU profile), and the whole nodes of the profile that hold both."""
    hw = cfg.hardware
    device, devices = device_word(hw.kind), device_word(hw.kind, 2)
    par, need = grid
    engines = f", besides the engines' {beside}" if beside else ""
    if fit is not None and fit.engine is not None:
        shape = describe_engine(replace(fit.engine.engine, num_engines=1))
        if fit.colocate:
            engines = f", with engines of {fit.gpus} beside it"
        else:
            beside = cfg.layout.rollout.num_gpus or fit.gpus
            why = f": none fits beside training on {hw.gpu_memory_gib:g} GiB" if apart else ""
            engines = f", and the engines on {beside} of their own ({shape}{why})"
    total = profile_gpus(hw, par.world, beside)
    return (
        f"megatron-core's estimate fits training on {par.world} {devices} "
        f"({describe_train(par, least.cpu_offload, on_gpu=hw.kind == 'gpu')}: {need:.1f} GiB "
        f"per {device}, and the host's memory per node){engines}: use a hardware profile with "
        f"{total} {devices} of {hw.gpu_memory_gib:g} GiB ({total // hw.gpus_per_node} node(s) "
        f"of {hw.gpus_per_node})"
    )


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
