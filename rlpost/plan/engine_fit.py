"""Whether the engines fit GPUs of the profile's memory, beside training (colocated) or on
GPUs of their own: the smallest engine (GPUs per engine: within a node or whole nodes, or
the layout's gpus_per_engine) that passes the engine checks and holds one sample, checked
as the search checks it (rlpost.plan.split_options.Searcher.engines); where none does,
what the leanest needs and what else would make it fit. The report when nothing fits names
GPUs only where the engines fit them (rlpost.plan.nothing_fits)."""

from __future__ import annotations

from dataclasses import dataclass

from rlpost.plan.candidates import EngineOption
from rlpost.plan.engine_memory import GIB, estimate_rollout, longest_request
from rlpost.plan.layout import ParallelLayout, Sizes
from rlpost.plan.parallel import powers_of_two
from rlpost.plan.remedies import MAX_TRAIN_GPUS, MIN_TOKENS_PER_GPU
from rlpost.plan.split_options import Searcher, SplitOptions
from rlpost.schema import RunConfig

FRACTION_KEY = "layout.rollout.sglang.mem_fraction_static"


@dataclass(frozen=True)
class EngineFit:
    """The smallest engine that fits (None: none does) beside training or apart from it,
    and (where none does) those that do not."""

    colocate: bool
    engine: EngineOption | None
    rejected: tuple[EngineOption, ...] = ()

    @property
    def leanest(self) -> EngineOption | None:
        """Of the engines that do not fit, the one shortest of one sample's KV cache."""
        return min(self.rejected, key=_short_gib, default=None)

    @property
    def gpus(self) -> int:
        """The GPUs one engine takes (0 where none fits)."""
        return self.engine.engine.gpus_per_engine if self.engine else 0


def engine_sizes(cfg: RunConfig) -> list[int]:
    """The GPUs per engine the engine checks allow: the layout's, else powers of two, within
    a node or whole nodes (rlpost.plan.engine_checks.check_engine_nodes), up to
    MAX_TRAIN_GPUS; one device slot on a CPU profile."""
    fixed = cfg.layout.rollout.gpus_per_engine
    if fixed or cfg.hardware.kind != "gpu":
        return [fixed or 1]
    return powers_of_two(MAX_TRAIN_GPUS)


def fit_engines(searcher: Searcher, colocate: bool, probe: ParallelLayout) -> EngineFit:
    """The smallest engine that fits, checked beside the training grid `probe`: colocated,
    on a node's GPUs that train too; apart, on GPUs of its own (one engine's)."""
    cfg, rejected = searcher.cfg, []
    for size in engine_sizes(cfg):
        rollout = max(size, cfg.hardware.gpus_per_node) if colocate else size
        train = rollout if colocate else probe.world
        out = SplitOptions(Sizes(colocate, train + (0 if colocate else rollout), train, rollout))
        searcher.engines(out, probe)
        fitting = [e for e in out.engines if e.engine.gpus_per_engine == size]
        if fitting:
            return EngineFit(colocate, fitting[0])
        rejected += [e for e, _ in out.rejected_engines if e.engine.gpus_per_engine == size]
    return EngineFit(colocate, None, tuple(rejected))


def _sample_gib(option: EngineOption) -> float:
    memory = option.memory
    return memory.longest_sample_tokens * memory.kv_bytes_per_token_per_gpu / GIB


def _short_gib(option: EngineOption) -> float:
    """What an engine GPU's static pool lacks for the weights, the CUDA context and one
    sample's KV cache."""
    return _sample_gib(option) - option.memory.kv_cache_gib


def engines_short(cfg: RunConfig, fits: list[EngineFit]) -> str:
    """No engine fits the GPUs beside training or apart from it, at any size the hardware
    allows: what the leanest needs per GPU of SGLang's static pool against what the pool
    holds, and what makes it fit: GPUs with more memory, or, where it then fits, a larger
    mem_fraction_static (what SGLang's activation reserve leaves) or a shorter response."""
    hw = cfg.hardware
    sizes = engine_sizes(cfg)
    leaner = [f for f in fits if f.leanest is not None]
    within = f"up to {sizes[-1]}" if len(sizes) > 1 else f"at {sizes[0]}"
    if not leaner:
        return f"no engine passes the engine checks {within} GPUs per engine"
    fit = min(leaner, key=lambda f: _short_gib(f.leanest) if f.leanest else 0.0)
    assert fit.leanest is not None
    engine, memory = fit.leanest.engine, fit.leanest.memory
    sample_gib = _sample_gib(fit.leanest)
    need = memory.weights_gib + memory.context_gib + sample_gib
    pool = memory.mem_fraction_static * hw.gpu_memory_gib
    shape = f"{engine.gpus_per_engine} GPU(s) per engine"
    shape += f" with dp-attention {engine.dp_size}" if engine.dp_size > 1 else ""
    where = "beside training" if fit.colocate else "on GPUs of its own"
    fixes = ["use GPUs with more memory", *_engine_settings(cfg, leaner)]
    return (
        f"no engine fits {hw.gpu_memory_gib:g} GiB GPUs {within} GPUs per engine, beside "
        f"training or on GPUs of its own: the leanest ({shape}, {where}) needs {need:.1f} GiB "
        f"per GPU of SGLang's static pool ({memory.weights_gib:.1f} of weights, "
        f"{memory.context_gib:.1f} of CUDA context, {sample_gib:.1f} of KV cache for one "
        f"{memory.longest_sample_tokens}-token sample), which mem_fraction_static="
        f"{memory.mem_fraction_static:g} makes {pool:.1f}: " + "; or ".join(fixes)
    )


def _engine_settings(cfg: RunConfig, fits: list[EngineFit]) -> list[str]:
    """What makes an engine fit its GPU, each tried on its estimate: the largest
    mem_fraction_static that leaves SGLang its activation reserve (and a colocated trainer
    its residue), on the smallest engine it makes fit; and the longest response (a multiple
    of MIN_TOKENS_PER_GPU) that the KV cache of the leanest engine holds."""
    hw, request, found = cfg.hardware, longest_request(cfg), []
    raised = []
    for fit in fits:
        for option in fit.rejected:
            engine, memory = option.engine, option.memory
            spare = memory.activation_reserve_gib + memory.trainer_residual_gib
            fraction = int((hw.gpu_memory_gib - spare) / hw.gpu_memory_gib * 100) / 100
            if fraction <= memory.mem_fraction_static:
                continue
            larger = estimate_rollout(
                cfg.model,
                request,
                hw,
                engine.gpus_per_engine,
                engine.dp_size,
                fraction,
                engine.options,
                fit.colocate,
                engine.fp8,
            )
            if larger.holds_one_sample and larger.total_gib <= hw.gpu_memory_gib:
                raised.append((engine.gpus_per_engine, not fit.colocate, fraction, larger))
    if raised:
        size, apart, fraction, larger = min(raised, key=lambda r: (r[0], r[1]))
        where = "on GPUs of their own" if apart else "beside training"
        found.append(
            f"{FRACTION_KEY}={fraction:g} (engines of {size} {where} then hold a sample: "
            f"{larger.total_gib:.1f} GiB per GPU)"
        )
    leanest = min((f.leanest for f in fits if f.leanest), key=_short_gib)
    if request.response_key == "recipe.rollout.max_response_len":
        prompt = request.tokens - cfg.recipe.rollout.max_response_len
        response = (leanest.memory.kv_cache_tokens_per_gpu - prompt) // MIN_TOKENS_PER_GPU
        if response > 0:
            found.append(f"{request.response_key}={response * MIN_TOKENS_PER_GPU}")
    return found
