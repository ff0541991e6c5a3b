"""Trainer backends the runtime can host, by name: how each is built on a train rank.

Both backends offer the same interface to the run (train_step, compute_logprobs,
iter_hf_weights, export_hf, save_checkpoint / load_checkpoint, close, model_dir); every call is
made on all ranks at once, which both need (their weights are sharded). Which one a run gets
is rlpost.plan.backends.resolve_trainer_backend; what its ranks build from is `trainer_spec`
(the run's session and benchmarks/megatron_train.py alike).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlpost.plan.backends import compute_dtype
from rlpost.plan.layout import ParallelLayout
from rlpost.plan.prediction import TrainPrediction
from rlpost.schema import AlgoConfig, FsdpLayout, ModelConfig, OptimConfig, RunConfig, TrainConfig

if TYPE_CHECKING:
    from rlpost.plan import Plan


@dataclass(frozen=True)
class TrainerSpec:
    """What every train rank needs to build its trainer backend."""

    backend: str
    model: ModelConfig
    layout: ParallelLayout
    algo: AlgoConfig
    optim: OptimConfig
    train: TrainConfig
    rollout_temperature: float
    world_size: int
    master_addr: str
    master_port: int
    num_threads: int
    seed: int
    # Plan.work: whether the reference model is loaded, and whether the training forward's
    # logprobs serve as the old policy's (one optimizer step per rollout)
    load_reference: bool
    reuse_old_logprobs: bool
    share_prompts: bool  # Plan.work: a group's prompt packed once per micro-batch (torch)
    prediction: TrainPrediction  # Plan.prediction: logged beside each step's measurements
    # False in mode=eval (Plan.trains): the rank loads the weights and sends them to the
    # engines; it builds no optimizer (and, by Plan.work, no reference model)
    trains: bool = True
    collective_timeout_s: float = 600.0
    init_method: str | None = None  # the rendezvous; default tcp://master_addr:master_port
    device: str = "cpu"  # where the torch trainer computes: "cpu", or "cuda" on GPU profiles
    # what the torch trainer's layers compute in: model.params_dtype on GPU profiles, fp32 on
    # CPU (megatron's config derives the same from the model)
    compute_dtype: str = "fp32"
    router_dtype: str = "fp32"  # model.moe.router_dtype (dense models: no routers)
    grouped_gemm: bool | None = None  # model.moe.grouped_gemm (dense models: None), torch only
    fsdp: FsdpLayout | None = None  # layout.train.fsdp (None: its defaults), torch only


def trainer_spec(
    cfg: RunConfig,
    plan: Plan,
    *,
    master_addr: str,
    master_port: int,
    num_threads: int,
    init_method: str | None = None,
) -> TrainerSpec:
    """What `plan`'s train ranks build their trainers from: the run's own sections and the
    plan's decisions (backend, layout, reference, old-logprob reuse, prompt sharing,
    prediction), on CUDA in model.params_dtype for GPU profiles. Where the ranks meet and
    how many threads each takes depend on the machines the run found, so the caller gives
    them."""
    on_gpu = cfg.hardware.kind == "gpu"
    return TrainerSpec(
        backend=plan.trainer_backend,
        model=cfg.model,
        layout=plan.parallel,
        algo=cfg.recipe.algo,
        optim=cfg.recipe.optim,
        train=cfg.recipe.train,
        rollout_temperature=cfg.recipe.rollout.temperature,
        world_size=plan.placement.train_gpus,
        master_addr=master_addr,
        master_port=master_port,
        num_threads=num_threads,
        seed=cfg.run.seed,
        load_reference=plan.work.load_reference,
        reuse_old_logprobs=plan.work.reuse_old_logprobs,
        share_prompts=plan.work.share_prompts,
        prediction=plan.prediction,
        trains=plan.trains,
        collective_timeout_s=cfg.trainer.collective_timeout_s,
        init_method=init_method,
        device="cuda" if on_gpu else "cpu",
        compute_dtype=compute_dtype(cfg),
        router_dtype=cfg.model.moe.router_dtype if cfg.model.moe else "fp32",
        grouped_gemm=cfg.model.moe.grouped_gemm if cfg.model.moe else None,
        fsdp=cfg.layout.train.fsdp,
    )


def _rank_kwargs(spec: TrainerSpec, rank: int) -> dict[str, Any]:
    """What both backends take alike: where this rank stands in the training world."""
    return {
        "rollout_temperature": spec.rollout_temperature,
        "rank": rank,
        "world_size": spec.world_size,
        "master_addr": spec.master_addr,
        "master_port": spec.master_port,
        "num_threads": spec.num_threads,
        "collective_timeout_s": spec.collective_timeout_s,
        "init_method": spec.init_method,
        "load_reference": spec.load_reference,
        "reuse_logprobs_single_step": spec.reuse_old_logprobs,
        "prediction": spec.prediction,
        "trains": spec.trains,
    }


def _torch(spec: TrainerSpec, rank: int) -> Any:
    from rlpost.backends.torch_trainer.trainer import TorchTrainer

    model = spec.model
    return TorchTrainer(
        model.load or model.hf_checkpoint,
        spec.algo,
        spec.optim,
        spec.train,
        reference_dir=model.ref_load or model.hf_checkpoint,
        share_prompts=spec.share_prompts,
        device=spec.device,
        layout=spec.layout,
        fsdp=spec.fsdp,
        compute_dtype=spec.compute_dtype,
        router_dtype=spec.router_dtype,
        grouped_gemm=spec.grouped_gemm,
        **_rank_kwargs(spec, rank),
    )


def _megatron(spec: TrainerSpec, rank: int) -> Any:
    from rlpost.backends.megatron import silence_known_warnings

    silence_known_warnings()
    from rlpost.backends.megatron.trainer import MegatronTrainer

    configs = (spec.model, spec.algo, spec.optim, spec.train, spec.layout)
    return MegatronTrainer(*configs, **_rank_kwargs(spec, rank), seed=spec.seed)


TRAINER_BUILDERS: dict[str, Callable[[TrainerSpec, int], Any]] = {
    "torch": _torch,
    "megatron": _megatron,
}


def build_trainer(spec: TrainerSpec, rank: int) -> Any:
    return TRAINER_BUILDERS[spec.backend](spec, rank)
