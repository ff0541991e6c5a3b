"""What makes a trainer fit its GPUs where it does not, each remedy tried on the plan's
estimate before it is named, with the GiB it then needs: rlpost.plan.fsdp.estimate_fsdp_train
for the torch trainer, rlpost.plan.memory.estimate_train for megatron-core, and
rlpost.plan.fsdp.estimate_sender for mode=eval's train ranks, which only send weights.

The torch trainer is data parallel alone: FSDP2's shards shrink as 1/DP and leave the GPU
with CPU offload, but the gathered layers, the activations and the logits of a micro-batch
do not shrink with either. Megatron-core splits those too (tp, pp, cp, ep), for the families
it has a layer spec for (not `generic`); its distributed optimizer shards Adam's state over
DP x CP, and recipe.optim.cpu_offload keeps that state on the host.

The budget is the GPU's memory, or less where layout=auto's search names the remedies (what
it accepts leaves a margin free: rlpost.plan.split_options.MARGIN_FRACTION)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TypeVar

from rlpost.plan.backends import as_computed
from rlpost.plan.fsdp import FsdpOptions, estimate_fsdp_train, estimate_sender, fsdp_options
from rlpost.plan.layout import MAX_CP, MAX_PP, ParallelLayout, Sizes
from rlpost.plan.memory import TrainMemory, estimate_host, estimate_train
from rlpost.plan.params import stage_layers
from rlpost.plan.work import TRAIN, train_rank_work
from rlpost.schema import GENERIC_FAMILY, HardwareConfig, RecipeConfig, RunConfig
from rlpost.schema.hardware import device_word

MIN_TOKENS_PER_GPU = 512
"""The shortest max_tokens_per_gpu a remedy names, and the step of those it names."""
MAX_TRAIN_GPUS = 1024
"""The most train GPUs a remedy names (`train_gpu_counts`)."""
MAX_GRIDS = 256
"""The most megatron-core grids one search for a split that fits sizes (fewest ranks first)."""
RECOMPUTE_FIX = "layout.train.recompute.granularity: full"
RESHARD_FIX = "layout.train.fsdp.reshard_after_forward: true"
OFFLOAD_FIX = "layout.train.fsdp.cpu_offload: true"
SLOT = "a device slot's nominal share of host memory"
_Found = TypeVar("_Found")


@dataclass(frozen=True)
class _Trial:
    """One way of training: the layout, max_tokens_per_gpu, whether megatron's optimizer is
    on the host (recipe.optim.cpu_offload), and the torch trainer's FSDP2 options (None:
    megatron-core trains)."""

    par: ParallelLayout
    tokens: int | None
    optim_offload: bool
    options: FsdpOptions | None = None


@dataclass(frozen=True)
class _Gate:
    """What a trial is held to: cfg's estimate for it (colocated or not, counted as the
    hardware computes: float32 on CPU) within budget_gib, and in training the host's memory
    per node (rlpost.plan.memory.estimate_host: the optimizer offloaded to it and the
    reference weights kept there, as the plan holds them); `sends`: mode=eval's train ranks,
    which hold only the weights they send."""

    cfg: RunConfig
    colocate: bool
    budget_gib: float
    sends: bool = False

    def need(self, trial: _Trial) -> float:
        cfg = self.cfg
        if self.sends:
            bucket = cfg.engine.weight_bucket_mb << 20
            return estimate_sender(cfg, trial.par, self.colocate, bucket, trial.options).total_gib
        return self._train_memory(trial).total_gib

    def fits(self, trial: _Trial, need: float) -> bool:
        """`need` (the trial's) within the budget, and its ranks within the host's memory."""
        return need <= self.budget_gib and self.host_fits(trial)

    def fitting(self, trial: _Trial) -> float | None:
        """What the trial needs, where it fits (`fits`); None where it does not."""
        need = self.need(trial)
        return need if self.fits(trial, need) else None

    def host_fits(self, trial: _Trial) -> bool:
        if self.sends:
            return True
        world = trial.par.world
        sizes = Sizes(self.colocate, world, world, world if self.colocate else 0)
        cfg, train = self.cfg, self._train_memory(trial)
        host = estimate_host(cfg.model, self._recipe(trial), cfg.hardware, train, sizes)
        return host.total_gib <= host.host_gib

    def _train_memory(self, trial: _Trial) -> TrainMemory:
        cfg, recipe = self.cfg, self._recipe(trial)
        if trial.options is not None:
            return estimate_fsdp_train(
                cfg, trial.par, self.colocate, recipe=recipe, options=trial.options
            )
        return estimate_train(cfg.model, recipe, cfg.hardware, trial.par, self.colocate)

    def _recipe(self, trial: _Trial) -> RecipeConfig:
        recipe = self.cfg.recipe
        if (trial.tokens, trial.optim_offload) == (
            recipe.train.max_tokens_per_gpu,
            recipe.optim.cpu_offload,
        ):
            return recipe
        train = recipe.train.model_copy(update={"max_tokens_per_gpu": trial.tokens})
        optim = recipe.optim.model_copy(update={"cpu_offload": trial.optim_offload})
        return recipe.model_copy(update={"train": train, "optim": optim})


def _gate(cfg: RunConfig, colocate: bool, budget_gib: float | None, sends: bool = False) -> _Gate:
    budget = cfg.hardware.gpu_memory_gib if budget_gib is None else budget_gib
    return _Gate(as_computed(cfg), colocate, budget, sends)


def _as_configured(cfg: RunConfig, par: ParallelLayout, fsdp: bool = False) -> _Trial:
    options = fsdp_options(cfg) if fsdp else None
    return _Trial(par, cfg.recipe.train.max_tokens_per_gpu, cfg.recipe.optim.cpu_offload, options)


def fsdp_fixes(
    cfg: RunConfig, par: ParallelLayout, colocate: bool, budget_gib: float | None = None
) -> str:
    """The remedies that each make the torch trainer fit `par` on cfg's GPUs (within
    `budget_gib`, the GPU's memory unless given), the smallest change first (a setting before
    more GPUs, megatron-core last); where none does alone, the combination that does, or what
    the torch trainer cannot shrink."""
    gate = _gate(cfg, colocate, budget_gib)
    base = _as_configured(cfg, par, fsdp=True)
    fitting = [f"{fix} ({need:.1f} GiB)" for fix, need in _single_fixes(gate, base)]
    megatron = megatron_fix(cfg, par.world, colocate, gate.budget_gib)
    if fitting:
        return _any_of(fitting + ([megatron] if megatron else []))
    combined = _combined_fix(gate, base)
    budget = round(gate.budget_gib, 1)
    return f"no single change makes the torch trainer fit {budget:g} GiB: {combined}" + (
        f"; or set {megatron}" if megatron else ""
    )


def _single_fixes(gate: _Gate, base: _Trial) -> Iterator[tuple[str, float]]:
    """(remedy, GiB) for each change alone that fits: full recompute, resharding after the
    forward, a shorter max_tokens_per_gpu (the longest halving that fits), CPU offload, more
    GPUs (the fewest that fit)."""
    par, options = base.par, base.options
    assert options is not None  # the torch trainer's
    tried = []
    if par.recompute != "full":
        tried.append((RECOMPUTE_FIX, replace(base, par=replace(par, recompute="full"))))
    if not options.reshard_after_forward:
        reshard = replace(options, reshard_after_forward=True)
        tried.append((RESHARD_FIX, replace(base, options=reshard)))
    for fix, trial in tried:
        need = gate.fitting(trial)
        if need is not None:
            yield fix, need
    shorter = _shorter_tokens(gate, base)
    if shorter is not None:
        yield f"recipe.train.max_tokens_per_gpu={shorter[0]}", shorter[1]
    if not options.cpu_offload:
        need = gate.fitting(replace(base, options=replace(options, cpu_offload=True)))
        if need is not None:
            yield OFFLOAD_FIX, need
    more = _more_gpus(gate, base)
    if more is not None:
        yield _more_gpus_text(gate.cfg, more[0]), more[1]


def _shorter_tokens(gate: _Gate, trial: _Trial) -> tuple[int, float] | None:
    """The longest max_tokens_per_gpu below the trial's, a multiple of MIN_TOKENS_PER_GPU,
    that fits, and what it needs: the need grows with the tokens (a micro-batch never holds
    less than the longest sample: rlpost.plan.memory), so a binary search finds it."""
    if not trial.tokens or trial.tokens <= MIN_TOKENS_PER_GPU:
        return None
    found = None
    low, high = 1, (trial.tokens - 1) // MIN_TOKENS_PER_GPU  # multiples below the trial's
    while low <= high:
        middle = (low + high) // 2
        need = gate.fitting(replace(trial, tokens=middle * MIN_TOKENS_PER_GPU))
        if need is not None:
            found, low = (middle * MIN_TOKENS_PER_GPU, need), middle + 1
        else:
            high = middle - 1
    return found


def shorter_tokens(
    cfg: RunConfig, par: ParallelLayout, colocate: bool, budget_gib: float | None = None
) -> tuple[int, float] | None:
    """The longest max_tokens_per_gpu below cfg's (a multiple of MIN_TOKENS_PER_GPU) with
    which megatron-core's estimate for `par` fits `budget_gib` and the host's memory, and
    what it then needs; None where none does."""
    return _shorter_tokens(_gate(cfg, colocate, budget_gib), _as_configured(cfg, par))


def train_gpu_counts(hardware: HardwareConfig, world: int, beside: int = 0) -> list[int]:
    """The train GPU counts a remedy tries above `world`, fewest first, up to MAX_TRAIN_GPUS:
    doubling within a node (2, 4 of a node of 8), then every whole number of the profile's
    nodes (8, 16, 24, 32 ...), so that 3 nodes are named where they hold what 2 do not.
    `beside`: the GPUs the engines take on their own; a count within a node is tried only
    where the engines fit beside it on that node (else the search trains on whole nodes and
    the engines take the rest: `profile_gpus`)."""
    node = hardware.gpus_per_node
    within = [
        world << k
        for k in range(1, node.bit_length())
        if world << k < node and (world << k) + beside <= node
    ]
    nodes = range((world // node + 1) * node, MAX_TRAIN_GPUS + 1, node)
    return within + list(nodes)


def profile_gpus(hardware: HardwareConfig, train: int, beside: int = 0) -> int:
    """The GPUs of the fewest whole nodes of the profile that hold `train` GPUs to train on
    and `beside` GPUs of the engines' own: one node where both fit on it, else the train
    count (whole nodes: `train_gpu_counts`) and whole nodes for the engines, as the search
    splits several nodes (rlpost.plan.search_space.gpu_splits)."""
    node = hardware.gpus_per_node
    if train + beside <= node:
        return node
    return -(-train // node) * node + -(-beside // node) * node


def _on_fewest_gpus(
    hardware: HardwareConfig,
    world: int,
    fitting: Callable[[int], _Found | None],
    beside: int = 0,
) -> _Found | None:
    """`fitting` on the fewest of `train_gpu_counts` above `world` where it finds something.
    The doublings of `world` (ten counts at most) are tried first: where none of them fits
    up to MAX_TRAIN_GPUS, nothing is named, and the whole nodes between them are not each
    searched (hundreds of counts with their splits, where validation takes well under a
    second). A count between two doublings that fits where neither does would need a split
    only it allows (pp=3 of 24 GPUs, where 32 allow pp=4 and a larger DP)."""
    doublings = [max(world, 1) << k for k in range(1, MAX_TRAIN_GPUS.bit_length())]
    if not any(fitting(n) is not None for n in doublings if n <= MAX_TRAIN_GPUS):
        return None
    for count in train_gpu_counts(hardware, world, beside):
        found = fitting(count)
        if found is not None:
            return found
    return None


def _more_gpus(gate: _Gate, trial: _Trial) -> tuple[ParallelLayout, float] | None:
    """The fewest train GPUs (`train_gpu_counts`) on which trial's split, with more DP,
    fits; counts that split does not divide (tp x pp x cp, and ep x etp into tp x cp x DP)
    are skipped."""
    par = trial.par
    ranks = par.tp * par.pp * par.cp

    def fitting(count: int) -> tuple[ParallelLayout, float] | None:
        wider = replace(par, dp=count // ranks)
        if count % ranks or (wider.world // par.pp) % (par.ep * par.etp):
            return None
        if not _batch_splits(gate.cfg, wider.dp):
            return None
        need = gate.fitting(replace(trial, par=wider))
        return None if need is None else (wider, need)

    return _on_fewest_gpus(gate.cfg.hardware, par.world, fitting)


def _more_gpus_text(cfg: RunConfig, par: ParallelLayout) -> str:
    """Training on par.world GPUs: more of the profile's, or a larger profile."""
    where = _gpus_text(cfg, par.world)
    return where + (f" and layout.train.dp={par.dp}" if cfg.layout.train.dp is not None else "")


def _gpus_text(cfg: RunConfig, gpus: int) -> str:
    if gpus <= cfg.hardware.total_gpus:
        return f"layout.train.num_gpus={gpus}"
    return f"a hardware profile with {gpus} GPUs to train on"


def _combined_fix(gate: _Gate, base: _Trial) -> str:
    """Every setting that lowers the peak at once; then, if need be, with a shorter
    max_tokens_per_gpu, or (shards on the GPUs) more of them."""
    assert base.options is not None  # the torch trainer's
    cfg = gate.cfg
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
    assert lean.options is not None
    offloaded = replace(lean, options=replace(lean.options, cpu_offload=True))
    with_offload = settings + ([] if base.options.cpu_offload else [OFFLOAD_FIX])
    need = gate.need(offloaded)
    if gate.fits(offloaded, need):
        return f"{_and(with_offload)} together fit ({need:.1f} GiB)"
    found = []
    shorter = _shorter_tokens(gate, offloaded)
    if shorter is not None:
        tokens, need = shorter
        together = _and([*with_offload, f"recipe.train.max_tokens_per_gpu={tokens}"])
        found.append(f"{together} together fit ({need:.1f} GiB)")
    more = _more_gpus(gate, lean)
    if more is not None:
        par, need = more
        where = _more_gpus_text(cfg, par)
        found.append(
            f"{where} with {_and(settings)} ({need:.1f} GiB)"
            if settings
            else f"{where} ({need:.1f} GiB)"
        )
    if found:
        return "; or ".join(found)
    least = gate.need(replace(offloaded, tokens=MIN_TOKENS_PER_GPU))
    even = f"even with {_and(with_offload or ['its shards offloaded'])} and "
    even += f"recipe.train.max_tokens_per_gpu={MIN_TOKENS_PER_GPU}"
    if least <= gate.budget_gib:
        return _host_short(even, least)
    return (
        f"{even} it needs {least:.1f} GiB (the gathered layers, activations and logits do not "
        "shrink with more GPUs): use GPUs with more memory"
    )


def _host_short(even: str, need: float) -> str:
    """Nothing fits where the GPUs hold the leanest trial (`need`): the host's memory per
    node is what does not."""
    return (
        f"{even} its GPUs hold it ({need:.1f} GiB) but the host's memory per node does not: "
        "use nodes with more host memory"
    )


def data_parallel_fixes(cfg: RunConfig, par: ParallelLayout, colocate: bool) -> str:
    """The torch trainer on a CPU profile: data parallel, its optimizer in host memory
    already, sized by megatron-core's estimate of one unsplit replica (its figures are
    nominal: rlpost.plan.fsdp.fsdp_trains). Full recompute and a shorter max_tokens_per_gpu,
    each tried on that estimate; and a device slot that holds it as it is."""
    gate = _gate(cfg, colocate, None)
    base = _as_configured(cfg, par)
    found = []
    if par.recompute != "full":
        need = gate.fitting(replace(base, par=replace(par, recompute="full")))
        if need is not None:
            found.append(f"{RECOMPUTE_FIX} ({need:.1f} GiB)")
    shorter = _shorter_tokens(gate, base)
    if shorter is not None:
        found.append(f"recipe.train.max_tokens_per_gpu={shorter[0]} ({shorter[1]:.1f} GiB)")
    return _any_of([*found, slot_fix(gate.need(base))])


def sender_fixes(cfg: RunConfig, par: ParallelLayout, colocate: bool) -> str:
    """mode=eval's torch train ranks hold float32 FSDP2 shards to send to the engines
    (rlpost.plan.fsdp.estimate_sender): each remedy tried on that estimate: the shards
    offloaded to the host, or split over more GPUs."""
    gate = _gate(cfg, colocate, None, sends=True)
    base = _as_configured(cfg, par, fsdp=True)
    assert base.options is not None
    found = []
    if not base.options.cpu_offload:
        need = gate.fitting(replace(base, options=replace(base.options, cpu_offload=True)))
        if need is not None:
            found.append(f"{OFFLOAD_FIX} ({need:.1f} GiB)")
    more = _more_gpus(gate, base)
    if more is not None:
        found.append(f"{_more_gpus_text(cfg, more[0])} ({more[1]:.1f} GiB)")
    if found:
        return _any_of(found)
    return (
        "neither offloading the shards nor more GPUs fits: " + HF_FOLDER + ", or use GPUs with "
        "more memory"
    )


HF_FOLDER = (
    "evaluate a Hugging Face folder of the weights (model.hf_checkpoint, without model.load "
    "or run.resume), which the engines load themselves"
)


def _any_of(remedies: list[str]) -> str:
    return remedies[0] if len(remedies) == 1 else "any one of: " + "; ".join(remedies)


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def megatron_fix(
    cfg: RunConfig, world: int, colocate: bool, budget_gib: float | None = None
) -> str | None:
    """`trainer.backend=megatron` with the smallest split of the model over `world` GPUs
    that megatron-core's estimate fits, or None (a generic model: megatron has no layer spec
    for it; or no split fits)."""
    found = megatron_layout(cfg, world, colocate, budget_gib)
    if found is None:
        return None
    par, need = found
    t = cfg.layout.train
    # tp and pp where they split the model, and any size that differs from the layout's own
    sizes = [
        f"layout.train.{k}={v}"
        for k, v, have in (("tp", par.tp, t.tp), ("pp", par.pp, t.pp), ("ep", par.ep, t.ep))
        if (v > 1 and k != "ep") or (have is not None and have != v)
    ]
    if t.dp is not None:
        sizes.append(f"layout.train.dp={par.dp}")
    split = f" with {_and(sizes)}" if sizes else ""
    return f"trainer.backend=megatron{split} ({need:.1f} GiB: megatron-core splits the model)"


def megatron_layout(
    cfg: RunConfig, world: int, colocate: bool, budget_gib: float | None = None
) -> tuple[ParallelLayout, float] | None:
    """The grid with the fewest model-parallel ranks (tp before pp) over `world` GPUs that
    megatron-core trains cfg's model with and whose estimate fits (`_grids`' rules, cp as
    set): layout.train's sizes as the least split, and the rest of it as the plan reads it
    once the backend is megatron (rlpost.plan.parallel): recompute (full unless set), the
    optimizer, the MoE token dispatcher, DeepEP and the first and last pipeline stages."""
    model, hw, t = cfg.model, cfg.hardware, cfg.layout.train
    if model.family == GENERIC_FAMILY or hw.kind != "gpu":
        return None
    tp, pp, cp = t.tp or 1, t.pp or 1, t.cp or 1
    if world % (tp * pp * cp):
        return None
    least = ParallelLayout.from_train(
        t,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=t.ep or 1,
        etp=t.etp or 1,
        dp=world // (tp * pp * cp),
        sequence_parallel=False,
        recompute=t.recompute.granularity or "full",
        dispatcher="alltoall" if model.moe is not None else None,
    )
    gate = _gate(cfg, colocate, budget_gib)
    return _split_that_fits(gate, _as_configured(cfg, least), context_parallel=False)


def megatron_fixes(
    cfg: RunConfig, par: ParallelLayout, colocate: bool, budget_gib: float | None = None
) -> str:
    """The remedies that each make megatron-core fit `par` on cfg's devices (within
    `budget_gib`, the device's memory unless given), the smallest change first: full
    recompute, a shorter max_tokens_per_gpu, the optimizer on the host (GPUs), a larger split
    over the same devices, more GPUs (the distributed optimizer shards over them), a larger
    device slot (CPU: its memory is nominal); where none does alone, the combination that
    does, or what cannot shrink."""
    gate = _gate(cfg, colocate, budget_gib)
    base = _as_configured(cfg, par)
    fitting = list(_megatron_single_fixes(gate, base))
    if fitting:
        return _any_of(fitting)
    combined = _megatron_combined_fix(gate, base)
    return f"no single change makes megatron-core fit {round(gate.budget_gib, 1):g} GiB: {combined}"


def _megatron_single_fixes(gate: _Gate, base: _Trial) -> Iterator[str]:
    """Each change alone that fits, with what it then needs (megatron_fixes' order)."""
    cfg, par = gate.cfg, base.par
    on_gpu = cfg.hardware.kind == "gpu"
    if par.recompute != "full":
        need = gate.fitting(replace(base, par=replace(par, recompute="full")))
        if need is not None:
            yield f"{RECOMPUTE_FIX} ({need:.1f} GiB)"
    shorter = _shorter_tokens(gate, base)
    if shorter is not None:
        yield f"recipe.train.max_tokens_per_gpu={shorter[0]} ({shorter[1]:.1f} GiB)"
    if on_gpu and not base.optim_offload:
        need = gate.fitting(replace(base, optim_offload=True))
        if need is not None:
            yield f"{_and(_optim_offload_fix(cfg))} ({need:.1f} GiB)"
    split = _split_that_fits(gate, base, skip=par)
    if split is not None:
        yield f"{_and(_split_keys(cfg, par, split[0]))} ({split[1]:.1f} GiB)"
    if on_gpu and par.distributed_optimizer:
        more = _more_gpus(gate, base)
        if more is not None:
            yield f"{_more_gpus_text(cfg, more[0])} ({more[1]:.1f} GiB)"
    if not on_gpu:
        yield slot_fix(gate.need(base))


def _megatron_combined_fix(gate: _Gate, base: _Trial) -> str:
    """Full recompute and the optimizer on the host together; then with a larger split or a
    shorter max_tokens_per_gpu, or both (on the leanest split); then on more GPUs (with the
    optimizer sharded over them, or on the host), the split searched again on each count;
    else what the leanest split still needs."""
    cfg, par = gate.cfg, base.par
    recompute = [RECOMPUTE_FIX] if par.recompute != "full" else []
    held = replace(base, par=replace(par, recompute="full"))  # the optimizer on the GPUs
    settings, lean = list(recompute), held
    if cfg.hardware.kind == "gpu" and not base.optim_offload:
        settings += _optim_offload_fix(cfg)
        lean = replace(held, optim_offload=True)
    need = gate.need(lean)
    if settings and gate.fits(lean, need):
        return f"{_and(settings)} together fit ({need:.1f} GiB)"
    found = []
    split = _split_that_fits(gate, lean, skip=par)
    if split is not None:
        together = _and([*settings, *_split_keys(cfg, par, split[0])])
        found.append(f"{together} together fit ({split[1]:.1f} GiB)")
    shorter = _shorter_tokens(gate, lean)
    if shorter is not None:
        together = _and([*settings, f"recipe.train.max_tokens_per_gpu={shorter[0]}"])
        found.append(f"{together} together fit ({shorter[1]:.1f} GiB)")
    if found:
        return "; or ".join(found)
    tokens = MIN_TOKENS_PER_GPU if lean.tokens else lean.tokens
    shortest = replace(lean, tokens=tokens)
    grids = [g for g in _grids(cfg, lean.par) if g != par]
    leanest = min(grids, key=lambda g: gate.need(replace(shortest, par=g)), default=lean.par)
    shorter = _shorter_tokens(gate, replace(lean, par=leanest)) if grids else None
    if shorter is not None:
        keys = _split_keys(cfg, par, leanest)
        together = _and([*settings, *keys, f"recipe.train.max_tokens_per_gpu={shorter[0]}"])
        return f"{together} together fit ({shorter[1]:.1f} GiB)"
    more = _fewest_gpus(gate, [(settings, lean)] + [(recompute, held)] * par.distributed_optimizer)
    if more is not None:
        return more
    least = gate.need(replace(shortest, par=leanest))
    even = [*settings, *_split_keys(cfg, par, leanest)]
    even += [f"recipe.train.max_tokens_per_gpu={tokens}"] if tokens else []
    if least <= gate.budget_gib:
        return _host_short(f"even with {_and(even) if even else 'its layout'}", least)
    return (
        f"even with {_and(even) if even else 'its layout'} it needs {least:.1f} GiB per "
        f"{device_word(cfg.hardware.kind)}: use GPUs with more memory"
    )


def _fewest_gpus(gate: _Gate, tried: list[tuple[list[str], _Trial]]) -> str | None:
    """Of (settings, trial), the one that fits on the fewest GPUs (GPU profiles), named."""
    if gate.cfg.hardware.kind != "gpu":
        return None
    options = [(names, _more_gpus_split(gate, trial)) for names, trial in tried]
    fitting = [(names, more) for names, more in options if more is not None]
    if not fitting:
        return None
    names, (grid, need) = min(fitting, key=lambda o: (o[1][0].world, len(o[0])))
    keys = [*names, *_split_keys(gate.cfg, tried[0][1].par, grid)]
    with_ = f" with {_and(keys)}" if keys else ""
    return f"{_gpus_text(gate.cfg, grid.world)}{with_} ({need:.1f} GiB)"


def _more_gpus_split(
    gate: _Gate, trial: _Trial, above: int | None = None, beside: int = 0, engine: int = 1
) -> tuple[ParallelLayout, float] | None:
    """The fewest train GPUs (`train_gpu_counts` above `above`, trial's GPUs unless given;
    a multiple of `engine`, the GPUs of an engine colocated on them) on which a split of the
    model (`_grids` over that many, cp 1) fits, and that split; a count with no valid split
    is skipped."""

    def fitting(count: int) -> tuple[ParallelLayout, float] | None:
        if count % engine:
            return None
        return _split_that_fits(gate, trial, context_parallel=False, world=count)

    return _on_fewest_gpus(
        gate.cfg.hardware, trial.par.world if above is None else above, fitting, beside
    )


def megatron_fewest_gpus(
    cfg: RunConfig,
    par: ParallelLayout,
    colocate: bool,
    budget_gib: float | None = None,
    above: int | None = None,
    beside: int = 0,
    engine: int = 1,
) -> tuple[ParallelLayout, float] | None:
    """The fewest train GPUs above par's, or `above` (`train_gpu_counts`: whole nodes of
    cfg's profile, or more of one node where the engines' own `beside` GPUs fit too; a
    multiple of `engine`, the GPUs of one engine colocated on them) on which a split of
    the model (`_grids`, cp 1) fits megatron-core's estimate within `budget_gib`, and the
    host's memory per node, with par's recompute and the optimizer where cfg puts it; that
    split and what it needs. What layout=auto's search, which picks the split itself and
    holds each to both, would find on a profile that large."""
    gate = _gate(cfg, colocate, budget_gib)
    return _more_gpus_split(gate, _as_configured(cfg, par), above, beside, engine)


def megatron_sender_fixes(cfg: RunConfig, par: ParallelLayout, colocate: bool) -> str:
    """mode=eval's megatron train ranks hold the weights in the compute dtype, split over
    tp, pp and ep (rlpost.plan.fsdp.estimate_sender): a larger split over the same devices,
    else over more GPUs, each tried on that estimate."""
    gate = _gate(cfg, colocate, None, sends=True)
    base = _as_configured(cfg, par)
    found = []
    split = _split_that_fits(gate, base, context_parallel=False, skip=par)
    if split is not None:
        found.append(f"{_and(_split_keys(cfg, par, split[0]))} ({split[1]:.1f} GiB)")
    else:
        more = _fewest_gpus(gate, [([], base)])
        found += [more] if more else []
    if cfg.hardware.kind != "gpu":
        found.append(slot_fix(gate.need(base)))
    if found:
        return _any_of(found)
    return f"no split of the model fits: {HF_FOLDER}, or use GPUs with more memory"


def _optim_offload_fix(cfg: RunConfig) -> list[str]:
    """recipe.optim.cpu_offload, with what it needs set too: the distributed optimizer (the
    schema's rule), and the precision-aware optimizer that Megatron-LM asks of it (a config
    that exports to slime; rlpost.plan.megatron_rules)."""
    fixes = ["recipe.optim.cpu_offload: true"]
    if not cfg.recipe.optim.precision_aware_optimizer:
        fixes.append("recipe.optim.precision_aware_optimizer: true")
    if not cfg.layout.train.distributed_optimizer:
        fixes.append("layout.train.distributed_optimizer: true")
    return fixes


def slot_fix(need_gib: float) -> str:
    return f"hardware.gpu_memory_gib={math.ceil(need_gib)} ({SLOT})"


def _split_that_fits(
    gate: _Gate,
    trial: _Trial,
    context_parallel: bool = True,
    skip: ParallelLayout | None = None,
    world: int | None = None,
) -> tuple[ParallelLayout, float] | None:
    """The first of `_grids` (but `skip`) whose estimate fits, and what it needs."""
    for grid in _grids(gate.cfg, trial.par, context_parallel, world):
        if grid == skip:
            continue
        need = gate.fitting(replace(trial, par=grid))
        if need is not None:
            return grid, need
    return None


def _grids(
    cfg: RunConfig, par: ParallelLayout, context_parallel: bool = True, world: int | None = None
) -> list[ParallelLayout]:
    """Megatron-core grids over par's devices (or `world` of them) with at least its
    model-parallel ranks (tp x pp x cp), fewest first, then the layout's ep, then tp before
    pp before cp; at most MAX_GRIDS. Each is one the planner accepts: tp a power of two
    within a node dividing the heads (and query groups); pp up to MAX_PP whose stages hold
    the layout's first and last stage counts where set (then pp > 1; else an even split),
    each stage a multiple of its uniform recompute groups; cp up to MAX_CP only with packed
    micro-batches (rlpost.plan.checks.check_context_parallel); ep dividing the experts on the
    etp x ep x pp grid: the layout's where it fits and megatron's rule (the largest), that
    alone where the layout derives it; sequence parallel with tp unless set (and never off
    with both tp and ep); a DP the global batch divides over (`_batch_splits`)."""
    model, hw, t = cfg.model, cfg.hardware, cfg.layout.train
    world = par.world if world is None else world
    least = par.tp * par.pp * par.cp
    tps = [
        tp
        for tp in _powers_of_two(min(world, hw.gpus_per_node))
        if model.num_attention_heads % tp == 0
        and (model.mla is not None or model.num_query_groups % tp == 0)
    ]
    packed = cfg.recipe.train.use_dynamic_batch_size
    cps = _powers_of_two(min(world, MAX_CP)) if context_parallel and packed else [par.cp]
    ends = (par.num_layers_in_first_pipeline_stage, par.num_layers_in_last_pipeline_stage)
    found = []
    for pp in range(1, min(world, MAX_PP, model.num_layers) + 1):
        stages = stage_layers(model.num_layers, pp, *ends)
        if world % pp or stages is None or (pp == 1 and any(ends)):
            continue
        group = par.recompute_num_layers
        uniform = par.recompute == "full" and par.recompute_method == "uniform"
        if uniform and any(s % group for s in stages):
            continue
        for ep in _expert_sizes(cfg, par, world // pp):
            for tp in tps:
                sp = tp > 1 if t.sequence_parallel is None else t.sequence_parallel
                if (sp and tp == 1) or (not sp and tp > 1 and ep > 1):
                    continue
                for cp in cps:
                    ranks = tp * pp * cp
                    if world % ranks or ranks < least or not _batch_splits(cfg, world // ranks):
                        continue
                    found.append(
                        replace(
                            par,
                            tp=tp,
                            pp=pp,
                            cp=cp,
                            ep=ep,
                            dp=world // ranks,
                            sequence_parallel=sp,
                        )
                    )
    found.sort(key=lambda g: (g.tp * g.pp * g.cp, g.ep != par.ep, g.pp, g.cp))
    return found[:MAX_GRIDS]


def _batch_splits(cfg: RunConfig, dp: int) -> bool:
    """The plan's batch rules hold for `dp` ranks (rlpost.plan.engine_checks): the global
    batch divides over them, and each gets a whole micro-batch where micro-batches are sized
    in samples; in training only (an evaluation's train ranks run no step: STEP_RULES)."""
    if train_rank_work(cfg) != TRAIN:
        return True
    train = cfg.recipe.train
    per_rank, rest = divmod(train.global_batch_size, dp)
    return not rest and (train.use_dynamic_batch_size or train.micro_batch_size <= per_rank)


def _expert_sizes(cfg: RunConfig, par: ParallelLayout, grid: int) -> list[int]:
    """The ep sizes `_grids` tries on an etp x ep grid of `grid` devices (world / pp)."""
    moe = cfg.model.moe
    if moe is None:
        return [par.ep]
    valid = [e for e in range(1, moe.num_experts + 1) if moe.num_experts % e == 0]
    valid = [e for e in valid if grid % (e * par.etp) == 0]
    if not valid:
        return []
    if cfg.layout.train.ep is None:
        return [valid[-1]]
    return list(dict.fromkeys(e for e in (par.ep, valid[-1]) if e in valid))


def _split_keys(cfg: RunConfig, par: ParallelLayout, grid: ParallelLayout) -> list[str]:
    """`grid`'s sizes that differ from `par`'s, as a user sets them (dp where it is set)."""
    keys = ("tp", "pp", "cp", "ep") + (("dp",) if cfg.layout.train.dp is not None else ())
    changed = [k for k in keys if getattr(grid, k) != getattr(par, k)]
    return [f"layout.train.{k}={getattr(grid, k)}" for k in changed]


def _powers_of_two(limit: int) -> list[int]:
    return [1 << i for i in range(limit.bit_length()) if (1 << i) <= limit]
