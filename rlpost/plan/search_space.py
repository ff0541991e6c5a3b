"""What the layout search enumerates: the GPU splits, the training grids and the engines each
split allows, and the config variants of where Adam runs and the torch trainer's FSDP2 options
(with_adam, with_fsdp). Fields the layout sets stay fixed; the null ones are searched."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rlpost.plan.backends import resolve_trainer_backend
from rlpost.plan.checks import divisors
from rlpost.plan.engine_memory import checkpoint_fp8, default_mem_fraction
from rlpost.plan.fsdp import FSDP_IN_SCHEMA, fsdp_options, fsdp_trains
from rlpost.plan.layout import MAX_CP, MAX_PP, RECOMPUTE_NONE, EngineLayout, ParallelLayout, Sizes
from rlpost.plan.parallel import engine_options, engine_shape, powers_of_two
from rlpost.plan.params import stage_layers
from rlpost.schema import RunConfig

RECOMPUTES = (RECOMPUTE_NONE, "full")
"""Selective recompute drops only the attention softmax's activations, which the memory model
never counts (flash attention does not store them), so it is searched only when set."""
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


def variants(cfg: RunConfig) -> list[tuple[bool, RunConfig]]:
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
