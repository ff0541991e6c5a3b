"""Which trainer backend trains a layout: what each can do, and what `auto` picks.

Light on purpose (the plan imports it): the backends themselves are built in
rlpost.runtime.trainers.
"""

from __future__ import annotations

from rlpost.plan.layout import ParallelLayout
from rlpost.schema import GENERIC_FAMILY, RunConfig

# the model-parallel sizes (besides DP) each backend trains with
TRAINER_PARALLEL: dict[str, frozenset[str]] = {
    "torch": frozenset(),
    "megatron": frozenset({"tp", "pp", "cp", "ep", "etp"}),
}
# the torch trainer shards with FSDP2 over the data-parallel ranks (rlpost.plan.fsdp)
GPU_TRAINERS = frozenset({"megatron", "torch"})
# the backends that train an architecture described only by its HF config (family generic):
# megatron-core needs a layer spec, the torch trainer builds the model with transformers
GENERIC_TRAINERS = frozenset({"torch"})
# backends that pack a group's prompt once per micro-batch, its samples' responses attending to
# that one copy (the torch trainer's packed attention gathers each sample's rows; megatron-core's
# THD attention takes contiguous sequences only)
PROMPT_SHARING = frozenset({"torch"})


def compute_dtype(cfg: RunConfig) -> str:
    """What both trainers compute in: model.params_dtype on GPU profiles, float32 on CPU."""
    return cfg.model.params_dtype if cfg.hardware.kind == "gpu" else "fp32"


def as_computed(cfg: RunConfig) -> RunConfig:
    """The config as its hardware computes it: on a CPU profile the trainers and the CPU
    engines hold float32 whatever model.params_dtype says, so the plan's memory and time
    figures count float32 there."""
    dtype = compute_dtype(cfg)
    if dtype == cfg.model.params_dtype:
        return cfg
    model = cfg.model.model_copy(update={"params_dtype": dtype})
    return cfg.model_copy(update={"model": model})


def model_parallel_sizes(layout: ParallelLayout) -> dict[str, int]:
    sizes = {"tp": layout.tp, "pp": layout.pp, "cp": layout.cp, "ep": layout.ep, "etp": layout.etp}
    return {k: v for k, v in sizes.items() if v > 1}


def resolve_trainer_backend(cfg: RunConfig, layout: ParallelLayout) -> str:
    """trainer.backend, with `auto` resolved: the torch trainer for a generic model (megatron
    has no layer spec for it); else megatron-core on GPUs, whenever the layout splits the
    model and when MTP layers train; the torch trainer for data-parallel CPU runs."""
    if cfg.trainer.backend != "auto":
        return cfg.trainer.backend
    if cfg.model.family == GENERIC_FAMILY:
        return "torch"
    splits = bool(model_parallel_sizes(layout))
    if cfg.hardware.kind == "gpu" or splits or cfg.recipe.train.mtp_training:
        return "megatron"
    return "torch"


def unsupported_parallel(backend: str, layout: ParallelLayout) -> dict[str, int]:
    """The layout's model-parallel sizes above 1 that `backend` cannot train with."""
    allowed = TRAINER_PARALLEL[backend]
    return {k: v for k, v in model_parallel_sizes(layout).items() if k not in allowed}
