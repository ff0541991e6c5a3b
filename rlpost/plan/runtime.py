"""What the runtime will do, decided here: engine backend, weight-sync path, memory offload.

Each `engine.*` choice left at `auto` (or null) is resolved from the hardware and the
placement; a choice the hardware or placement cannot carry out is an Issue before anything
starts. The runtime reads `Plan.runtime` and decides nothing itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlpost.backends.fp8_format import Fp8Error, Fp8Format, folder_format
from rlpost.errors import Issue
from rlpost.plan.checks import PlanContext, check
from rlpost.plan.loop import LoopPlan, plan_loop
from rlpost.schema import RunConfig
from rlpost.schema.base import changed
from rlpost.schema.run import OnSigterm

# engine backend -> does it run on GPUs only
ENGINE_BACKENDS = {"sglang": True, "cpu": False}


@dataclass(frozen=True)
class RuntimePlan:
    """The runtime's choices: which engine serves, how weights reach it, whether colocated
    engines and trainers hand memory back and forth around training."""

    engine_backend: str
    weight_sync: str
    offload: bool
    loop: LoopPlan
    # Single-node runs keep to loopback: the train ranks meet through a file in the run
    # directory (no TCP store listening), and every server rlpost starts binds 127.0.0.1.
    rendezvous: str  # file | tcp
    loopback_only: bool
    # Where Ray comes from: the run's ray_address, or (null) RAY_ADDRESS when the launch
    # sees it, else a new one-node cluster on this machine.
    ray_address: str | None
    # Generate requests in flight over all engines: recipe.rollout.max_concurrency, or
    # 512 per engine (slime's default).
    max_concurrency: int = 512
    # The engines serve an FP8 checkpoint (model.hf_checkpoint's quantization_config): every
    # weight update is quantised to this format on the trainer's device before it travels.
    fp8: Fp8Format | None = None
    # How a group's samples travel: "group" = the samples that share their sampling
    # parameters in one /generate call (SGLang's batch form: one HTTP exchange and one
    # prefill wave instead of n); "sample" = a call each, and `requests_why` says why.
    requests: str = "group"
    requests_why: str = ""
    # recipe.rollout.generate_function, and the most seconds one call of it may run besides
    # its engine requests before the run stops (rlpost.runtime.rollout.episode; None: no
    # limit, or no generate function of the user's)
    generate_function: str | None = None
    episode_timeout_s: float | None = None
    # CPU engines' scheduling priority (nice): on a CPU host whose generation runs ahead of
    # training (async modes, engines on cores of their own), training is the critical path,
    # so the engines yield a shared core to the trainers; 0 elsewhere.
    engine_nice: int = 0
    # SIGTERM (run.on_sigterm): save a checkpoint of every finished rollout then stop, or
    # stop at once (rlpost.runtime.stop)
    on_sigterm: OnSigterm = "save"


ENGINE_NICE = 10  # the CPU engines' niceness when training is the critical path


def resolve_engine_backend(cfg: RunConfig) -> str:
    """engine.backend=auto: SGLang on GPUs, rlpost's CPU engine on CPU."""
    if cfg.engine.backend != "auto":
        return cfg.engine.backend
    return "sglang" if cfg.hardware.kind == "gpu" else "cpu"


def resolve_weight_sync(cfg: RunConfig, colocate: bool) -> str:
    """engine.weight_sync=auto: CUDA IPC (tensor) when colocated on GPUs, a broadcast group
    (distributed: NCCL) when decoupled on GPUs, disk on CPU and for rlpost's CPU engine."""
    if cfg.engine.weight_sync != "auto":
        return cfg.engine.weight_sync
    if cfg.hardware.kind != "gpu" or resolve_engine_backend(cfg) == "cpu":
        return "disk"
    return "tensor" if colocate else "distributed"


def resolve_offload(cfg: RunConfig, colocate: bool) -> bool:
    """engine.offload=null: on for colocated GPU runs, where training needs the engines'
    memory; off otherwise."""
    if cfg.engine.offload is None:
        return colocate and cfg.hardware.kind == "gpu"
    return cfg.engine.offload


DEFAULT_CONCURRENCY_PER_ENGINE = 512


def client_concurrency(cfg: RunConfig, num_engines: int) -> int:
    """The rollout client's bound on generate requests in flight, one bound shared by all
    the engines behind the router (rlpost.runtime.rollout.client.EngineClient's
    max_concurrency): recipe.rollout.max_concurrency, else DEFAULT_CONCURRENCY_PER_ENGINE
    per engine."""
    return cfg.recipe.rollout.max_concurrency or DEFAULT_CONCURRENCY_PER_ENGINE * num_engines


def samples_in_flight(cfg: RunConfig, num_engines: int, group: int) -> int:
    """The samples the rollout client has in flight over all engines at most, its groups of
    `group` samples each: a sample's request holds one of client_concurrency's slots; a
    group sent as one request (plan_requests) holds one per sample, or every slot when it
    is larger than the bound, and is sent whole all the same."""
    bound = client_concurrency(cfg, num_engines)
    if group > 1 and plan_requests(cfg)["requests"] == "group":
        return group * max(1, bound // group)
    return bound


def plan_runtime(
    cfg: RunConfig,
    colocate: bool,
    longest_sample_tokens: int,
    num_engines: int,
    fp8: Fp8Format | None = None,
) -> RuntimePlan:
    backend = resolve_engine_backend(cfg)
    loop = plan_loop(cfg, longest_sample_tokens)
    # CPU engines on cores of their own, generating ahead of the trainers they share them with
    # (an evaluation trains nothing: its engines are the critical path)
    evaluating = cfg.mode == "eval"
    yields = backend == "cpu" and not colocate and loop.mode != "sync" and not evaluating
    return RuntimePlan(
        engine_backend=backend,
        weight_sync=resolve_weight_sync(cfg, colocate),
        offload=resolve_offload(cfg, colocate),
        loop=loop,
        rendezvous="file" if cfg.hardware.num_nodes == 1 else "tcp",
        loopback_only=cfg.hardware.num_nodes == 1,
        ray_address=cfg.run.ray_address,
        max_concurrency=client_concurrency(cfg, num_engines),
        fp8=fp8,
        **plan_requests(cfg),
        generate_function=cfg.recipe.rollout.generate_function,
        episode_timeout_s=cfg.recipe.rollout.episode_timeout_s
        if cfg.recipe.rollout.generate_function
        else None,
        engine_nice=ENGINE_NICE if yields else 0,
        # an evaluation stops at once whatever run.on_sigterm says (it saves nothing)
        on_sigterm="stop" if evaluating else cfg.run.on_sigterm,
    )


def plan_requests(cfg: RunConfig) -> dict[str, str]:
    """One request per group unless something gives each sample requests of its own (more
    than one turn needs a generate function, so it is covered by the first)."""
    rollout = cfg.recipe.rollout
    if rollout.generate_function:
        why = "recipe.rollout.generate_function makes each sample's requests"
    elif cfg.run.deterministic:
        why = "run.deterministic: each sample is drawn with a seed of its own"
    else:
        return {"requests": "group", "requests_why": ""}
    return {"requests": "sample", "requests_why": why}


@check("fp8_checkpoint")
def check_fp8_checkpoint(ctx: PlanContext) -> list[Issue]:
    """A quantised checkpoint rlpost cannot read right is refused, not read as plain tensors;
    SGLang engines are given block-quantised FP8 only."""
    cfg = ctx.cfg
    try:
        fmt = folder_format(cfg.model.hf_checkpoint)
    except Fp8Error as error:
        fix = "point it at a bf16 or block-FP8 checkpoint (tools/convert_hf_to_fp8.py makes one)"
        return [Issue("model.hf_checkpoint", str(error), fix, value=cfg.model.hf_checkpoint)]
    except (OSError, ValueError):
        return []
    if fmt is not None and fmt.block_size is None and resolve_engine_backend(cfg) == "sglang":
        return [
            Issue(
                "model.hf_checkpoint",
                "this FP8 checkpoint has one scale per output channel (--strategy channel), "
                "which rlpost's CPU engine and trainers read but SGLang's FP8 loader does not "
                "(and its DeepEP kernels take block-quantised weights only)",
                "convert the bf16 checkpoint with tools/convert_hf_to_fp8.py --strategy block "
                "--block-size 128 128",
                value=cfg.model.hf_checkpoint,
            )
        ]
    return []


@check("engine_backend")
def check_engine_backend(ctx: PlanContext) -> list[Issue]:
    cfg = ctx.cfg
    backend = resolve_engine_backend(cfg)
    issues = []
    if ENGINE_BACKENDS[backend] and cfg.hardware.kind != "gpu":
        issues.append(
            Issue(
                "engine.backend",
                f"SGLang serves on GPUs, and hardware {cfg.hardware.name} is a CPU machine",
                "use engine.backend=cpu (or auto)",
                value=cfg.engine.backend,
            )
        )
    user_options = cfg.layout.rollout.sglang
    if backend == "cpu" and user_options:
        names = ", ".join(sorted(user_options))
        issues.append(
            Issue(
                "layout.rollout.sglang",
                f"rlpost's CPU engine serves this run, and it reads no SGLang options ({names} "
                "would be ignored)",
                "remove them; engine.max_batch_size sets the CPU engine's batch",
            )
        )
    if backend == "cpu" and cfg.run.deterministic and changed(cfg.engine, "max_batch_size"):
        issues.append(
            Issue(
                "engine.max_batch_size",
                "with run.deterministic the CPU engine computes one sequence per forward (a "
                "batched forward's last bits depend on the batch, and a near-tie then samples "
                "another token), so no batch size applies",
                "remove it, or remove run.deterministic to batch",
                value=cfg.engine.max_batch_size,
            )
        )
    if backend == "sglang" and changed(cfg.engine, "max_batch_size"):
        issues.append(
            Issue(
                "engine.max_batch_size",
                "it sizes rlpost's CPU engine batches, and SGLang serves this run",
                "use layout.rollout.sglang.max_running_requests, or remove it",
                value=cfg.engine.max_batch_size,
            )
        )
    return issues


@check("weight_sync")
def check_weight_sync(ctx: PlanContext) -> list[Issue]:
    cfg, colocate = ctx.cfg, ctx.sizes.colocate
    kind = resolve_weight_sync(cfg, colocate)
    issues = []
    if kind == "tensor" and cfg.hardware.kind != "gpu":
        issues.append(
            Issue(
                "engine.weight_sync",
                "tensor sync hands the engines CUDA IPC handles of the trainer's GPU memory, "
                f"and hardware {cfg.hardware.name} has no GPUs",
                "use engine.weight_sync=disk (or distributed, which runs over gloo on CPU)",
                value=kind,
            )
        )
    elif kind == "tensor" and not colocate:
        issues.append(
            Issue(
                "engine.weight_sync",
                "tensor sync hands the engines CUDA IPC handles, which only a process on the "
                "same GPU can open, and this layout puts the engines on other GPUs "
                "(decoupled)",
                "use engine.weight_sync=distributed (an NCCL broadcast; the auto choice for "
                "decoupled runs) or disk, or layout.colocate: true",
                value=kind,
            )
        )
    elif kind == "distributed" and colocate and cfg.hardware.kind == "gpu":
        issues.append(
            Issue(
                "engine.weight_sync",
                "distributed sync broadcasts the weights over NCCL from train rank 0 to the "
                "engines, and colocated engines share the train ranks' GPUs: NCCL refuses two "
                "ranks on one GPU ('Duplicate GPU detected') once the broadcast group forms, "
                "after the engines and trainers have started",
                "use engine.weight_sync=tensor (CUDA IPC; the auto choice for colocated "
                "runs), or layout.colocate: false to give the engines GPUs of their own",
                value=kind,
            )
        )
    if kind != "disk" and cfg.hardware.kind == "gpu" and resolve_engine_backend(cfg) == "cpu":
        issues.append(
            Issue(
                "engine.weight_sync",
                "rlpost's CPU engine holds its weights in host memory: it opens no CUDA IPC "
                "handle and joins no NCCL group, so the first weight update would fail after "
                "the engines and trainers had started",
                "use engine.weight_sync=disk (the auto choice for the CPU engine)",
                value=kind,
            )
        )
    if kind == "disk" and changed(cfg.engine, "weight_bucket_mb"):
        issues.append(
            Issue(
                "engine.weight_bucket_mb",
                "buckets size the tensor and distributed transfers, and this run syncs "
                "weights through disk",
                "remove it, or use engine.weight_sync=distributed",
                value=cfg.engine.weight_bucket_mb,
            )
        )
    return issues


@check("offload")
def check_offload(ctx: PlanContext) -> list[Issue]:
    if ctx.cfg.engine.offload and not ctx.sizes.colocate:
        devices = ctx.devices(2)
        return [
            Issue(
                "engine.offload",
                "offload releases the engines' memory so that training fits beside them on "
                f"the same {devices}, and this layout is decoupled (engines on their own "
                f"{devices})",
                "remove engine.offload, or set layout.colocate: true",
                value=True,
            )
        ]
    if ctx.cfg.engine.offload is False and ctx.sizes.colocate and ctx.cfg.hardware.kind == "gpu":
        return [
            Issue(
                "engine.offload",
                "colocated engines would keep their weights and KV cache (mem_fraction_static "
                "of each GPU) while the trainer runs on the same GPUs, and the training memory "
                "estimate counts on that memory being released: the first training step "
                "runs out of memory",
                "remove engine.offload (on for colocated GPU runs), or set layout.colocate: "
                "false to give the engines GPUs of their own",
                value=False,
            )
        ]
    return []
