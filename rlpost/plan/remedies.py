"""What makes the torch trainer fit a GPU where it does not, each remedy tried on the plan's
estimate before it is named (rlpost.plan.fsdp.estimate_fsdp_train for the torch trainer,
rlpost.plan.memory.estimate_train for megatron-core's split of the same model).

The torch trainer is data parallel alone: FSDP2's shards shrink as 1/DP and leave the GPU
with CPU offload, but the gathered layers, the activations and the logits of a micro-batch
do not shrink with either. Megatron-core splits those too (tp, pp), for the families it has a
layer spec for (not `generic`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from rlpost.plan.fsdp import FsdpOptions, estimate_fsdp_train, estimate_sender, fsdp_options
from rlpost.plan.layout import ParallelLayout
from rlpost.plan.memory import estimate_train
from rlpost.plan.params import stage_layers
from rlpost.schema import GENERIC_FAMILY, RunConfig

MIN_TOKENS_PER_GPU = 512
"""The shortest max_tokens_per_gpu a remedy names (halving from the config's)."""
MAX_TRAIN_GPUS = 1024
"""The most train GPUs a remedy names (doubling from the layout's)."""
RECOMPUTE_FIX = "layout.train.recompute.granularity: full"
RESHARD_FIX = "layout.train.fsdp.reshard_after_forward: true"
OFFLOAD_FIX = "layout.train.fsdp.cpu_offload: true"


@dataclass(frozen=True)
class _Trial:
    """One way of training: the layout, the FSDP2 options and max_tokens_per_gpu."""

    par: ParallelLayout
    options: FsdpOptions
    tokens: int | None

    def need_gib(self, cfg: RunConfig, colocate: bool) -> float:
        recipe = cfg.recipe
        if self.tokens != recipe.train.max_tokens_per_gpu:
            train = recipe.train.model_copy(update={"max_tokens_per_gpu": self.tokens})
            recipe = recipe.model_copy(update={"train": train})
        need = estimate_fsdp_train(cfg, self.par, colocate, recipe=recipe, options=self.options)
        return need.total_gib


def fsdp_fixes(cfg: RunConfig, par: ParallelLayout, colocate: bool) -> str:
    """The remedies that each make the torch trainer fit `par` on cfg's GPUs, the smallest
    change first (a setting before more GPUs, megatron-core last); where none does alone, the
    combination that does, or what the torch trainer cannot shrink."""
    budget = cfg.hardware.gpu_memory_gib
    base = _Trial(par, fsdp_options(cfg), cfg.recipe.train.max_tokens_per_gpu)
    fitting = [f"{fix} ({need:.1f} GiB)" for fix, need in _single_fixes(cfg, base, colocate)]
    megatron = megatron_fix(cfg, par.world, colocate)
    if fitting:
        return "any one of: " + "; ".join(fitting + ([megatron] if megatron else []))
    combined = _combined_fix(cfg, base, colocate)
    return f"no single change makes the torch trainer fit {budget:g} GiB: {combined}" + (
        f"; or set {megatron}" if megatron else ""
    )


def _single_fixes(cfg: RunConfig, base: _Trial, colocate: bool) -> Iterator[tuple[str, float]]:
    """(remedy, GiB) for each change alone that fits: full recompute, resharding after the
    forward, a shorter max_tokens_per_gpu (the longest halving that fits), CPU offload, more
    GPUs (the fewest that fit)."""
    budget = cfg.hardware.gpu_memory_gib
    par, options = base.par, base.options
    tried = []
    if par.recompute != "full":
        tried.append((RECOMPUTE_FIX, replace(base, par=replace(par, recompute="full"))))
    if not options.reshard_after_forward:
        reshard = replace(options, reshard_after_forward=True)
        tried.append((RESHARD_FIX, replace(base, options=reshard)))
    for fix, trial in tried:
        need = trial.need_gib(cfg, colocate)
        if need <= budget:
            yield fix, need
    shorter = _shorter_tokens(cfg, base, colocate)
    if shorter is not None:
        yield f"recipe.train.max_tokens_per_gpu={shorter[0]}", shorter[1]
    if not options.cpu_offload:
        offload = replace(base, options=replace(options, cpu_offload=True))
        need = offload.need_gib(cfg, colocate)
        if need <= budget:
            yield OFFLOAD_FIX, need
    more = _more_gpus(cfg, base, colocate)
    if more is not None:
        yield _more_gpus_text(cfg, more[0]), more[1]


def _shorter_tokens(cfg: RunConfig, trial: _Trial, colocate: bool) -> tuple[int, float] | None:
    """The longest halving of max_tokens_per_gpu (down to MIN_TOKENS_PER_GPU) that fits."""
    tokens = trial.tokens
    while tokens and tokens > MIN_TOKENS_PER_GPU:
        tokens //= 2
        need = replace(trial, tokens=tokens).need_gib(cfg, colocate)
        if need <= cfg.hardware.gpu_memory_gib:
            return tokens, need
    return None


def _more_gpus(cfg: RunConfig, trial: _Trial, colocate: bool) -> tuple[int, float] | None:
    """The fewest train GPUs (doubling DP, up to MAX_TRAIN_GPUS) that fit."""
    dp = trial.par.dp
    while dp < MAX_TRAIN_GPUS:
        dp *= 2
        need = replace(trial, par=replace(trial.par, dp=dp)).need_gib(cfg, colocate)
        if need <= cfg.hardware.gpu_memory_gib:
            return dp, need
    return None


def _more_gpus_text(cfg: RunConfig, gpus: int) -> str:
    """Training on `gpus` data-parallel GPUs: more of the profile's, or a larger profile."""
    where = (
        f"layout.train.num_gpus={gpus}"
        if gpus <= cfg.hardware.total_gpus
        else f"a hardware profile with {gpus} GPUs to train on"
    )
    return where + (f" and layout.train.dp={gpus}" if cfg.layout.train.dp is not None else "")


def _combined_fix(cfg: RunConfig, base: _Trial, colocate: bool) -> str:
    """Every setting that lowers the peak at once; then, if need be, with a shorter
    max_tokens_per_gpu, or (shards on the GPUs) more of them."""
    budget = cfg.hardware.gpu_memory_gib
    settings = []
    if base.par.recompute != "full":
        settings.append(RECOMPUTE_FIX)
    if not base.options.reshard_after_forward:
        settings.append(RESHARD_FIX)
    lean = replace(
        base,
        par=replace(base.par, recompute="full"),
        options=replace(base.options, reshard_after_forward=True),
    )
    offloaded = replace(lean, options=replace(lean.options, cpu_offload=True))
    with_offload = settings + ([] if base.options.cpu_offload else [OFFLOAD_FIX])
    need = offloaded.need_gib(cfg, colocate)
    if need <= budget:
        return f"{_and(with_offload)} together fit ({need:.1f} GiB)"
    found = []
    shorter = _shorter_tokens(cfg, offloaded, colocate)
    if shorter is not None:
        tokens, need = shorter
        together = _and([*with_offload, f"recipe.train.max_tokens_per_gpu={tokens}"])
        found.append(f"{together} together fit ({need:.1f} GiB)")
    more = _more_gpus(cfg, lean, colocate)
    if more is not None:
        gpus, need = more
        where = _more_gpus_text(cfg, gpus)
        found.append(
            f"{where} with {_and(settings)} ({need:.1f} GiB)"
            if settings
            else f"{where} ({need:.1f} GiB)"
        )
    if found:
        return "; or ".join(found)
    least = replace(offloaded, tokens=MIN_TOKENS_PER_GPU).need_gib(cfg, colocate)
    return (
        f"even with {_and(with_offload or ['its shards offloaded'])} and "
        f"recipe.train.max_tokens_per_gpu={MIN_TOKENS_PER_GPU} it needs {least:.1f} GiB "
        "(the gathered layers, activations and logits do not shrink with more GPUs): use "
        "GPUs with more memory"
    )


def sender_fixes(cfg: RunConfig, par: ParallelLayout, colocate: bool) -> str:
    """mode=eval's torch train ranks hold float32 FSDP2 shards to send to the engines
    (rlpost.plan.fsdp.estimate_sender): each remedy tried on that estimate: the shards
    offloaded to the host, or split over more GPUs."""
    budget, bucket = cfg.hardware.gpu_memory_gib, cfg.engine.weight_bucket_mb << 20
    options = fsdp_options(cfg)
    found = []
    if not options.cpu_offload:
        offload = replace(options, cpu_offload=True)
        need = estimate_sender(cfg, par, colocate, bucket, offload).total_gib
        if need <= budget:
            found.append(f"{OFFLOAD_FIX} ({need:.1f} GiB)")
    dp = par.dp
    while dp < MAX_TRAIN_GPUS:
        dp *= 2
        need = estimate_sender(cfg, replace(par, dp=dp), colocate, bucket).total_gib
        if need <= budget:
            found.append(f"{_more_gpus_text(cfg, dp)} ({need:.1f} GiB)")
            break
    if found:
        return "any one of: " + "; ".join(found)
    return (
        "neither offloading the shards nor more GPUs fits: evaluate a Hugging Face folder of "
        "the weights (model.hf_checkpoint, without model.load or run.resume), which the "
        "engines load themselves, or use GPUs with more memory"
    )


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def megatron_fix(cfg: RunConfig, world: int, colocate: bool) -> str | None:
    """`trainer.backend=megatron` with the smallest split of the model over `world` GPUs
    that megatron-core's estimate fits, or None (a generic model: megatron has no layer spec
    for it; or no split fits)."""
    found = megatron_layout(cfg, world, colocate)
    if found is None:
        return None
    par, need = found
    sizes = [f"layout.train.{k}={v}" for k, v in (("tp", par.tp), ("pp", par.pp)) if v > 1]
    if cfg.layout.train.dp is not None:
        sizes.append(f"layout.train.dp={par.dp}")
    split = f" with {_and(sizes)}" if sizes else ""
    return f"trainer.backend=megatron{split} ({need:.1f} GiB: megatron-core splits the model)"


def megatron_layout(
    cfg: RunConfig, world: int, colocate: bool
) -> tuple[ParallelLayout, float] | None:
    """The grid with the fewest model-parallel ranks (tp before pp) over `world` GPUs that
    megatron-core trains cfg's model with and whose estimate fits: tp a power of two within a
    node dividing the heads and query groups, pp splitting the layers evenly, ep megatron's
    rule (the largest divisor of the experts the grid holds), sequence parallel with tp; the
    layout's recompute and optimizer settings kept."""
    model, hw, t = cfg.model, cfg.hardware, cfg.layout.train
    if model.family == GENERIC_FAMILY or hw.kind != "gpu":
        return None
    grids = [
        (tp, pp)
        for tp in _powers_of_two(min(world, hw.gpus_per_node))
        for pp in range(1, world + 1)
        if world % (tp * pp) == 0
        and model.num_attention_heads % tp == 0
        and (model.mla is not None or model.num_query_groups % tp == 0)
        and stage_layers(model.num_layers, pp) is not None
    ]
    for tp, pp in sorted(grids, key=lambda g: (g[0] * g[1], g[1])):
        ep = 1
        if model.moe is not None:
            experts, grid = model.moe.num_experts, world // pp
            ep = max(e for e in range(1, experts + 1) if experts % e == 0 and grid % e == 0)
        par = ParallelLayout(
            tp=tp,
            pp=pp,
            cp=1,
            ep=ep,
            etp=1,
            dp=world // (tp * pp),
            sequence_parallel=tp > 1 if t.sequence_parallel is None else t.sequence_parallel,
            recompute=t.recompute.granularity or "full",
            recompute_method=t.recompute.method,
            recompute_num_layers=t.recompute.num_layers,
            distributed_optimizer=t.distributed_optimizer,
            moe_token_dispatcher_type="alltoall" if model.moe is not None else None,
        )
        need = estimate_train(model, cfg.recipe, hw, par, colocate).total_gib
        if need <= hw.gpu_memory_gib:
            return par, need
    return None


def _powers_of_two(limit: int) -> list[int]:
    return [1 << i for i in range(limit.bit_length()) if (1 << i) <= limit]
