"""Fill in what a layout leaves null: GPU split, training parallelism and engine size.

Rules, each recorded in the plan as derived:
- placement: colocated on every GPU, unless the loop is async (decoupled only), which splits
  the GPUs in half (whole nodes when there are several); given one side, the other gets the
  rest.
- training: pp = cp = etp = 1; ep = the largest divisor of the expert count whose EP x ETP
  grid fits world / pp (megatron-core's rule); tp = the smallest power of two, within a node,
  that divides the heads (and query groups) and the GPUs, and whose training memory fits;
  dp = world / (tp x pp x cp); sequence parallel whenever tp > 1; full recompute on GPUs;
  where no tp fits, the refusal names the remedies megatron-core's estimate fits
  (rlpost.plan.remedies.megatron_fixes).
  The torch trainer on GPUs (trainer.backend=torch, or auto for a generic model) is data
  parallel over every train GPU with FSDP2 (tp = ep = 1); a derived layout it cannot fit is
  refused with the remedies that do fit (rlpost.plan.remedies.fsdp_fixes).
- engines: the smallest power of two that divides the rollout GPUs, stays within a node (or
  covers whole nodes), divides the heads, and whose weight shard leaves a KV cache for at
  least one full sample under the memory fraction; `mem_fraction_static` defaults to
  SGLang's own, less the trainer's residue when colocated.
On `hardware.kind: cpu` every size is 1 and engines take one slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from rlpost.backends.fp8_format import Fp8Format
from rlpost.errors import Issue
from rlpost.plan.backends import resolve_trainer_backend
from rlpost.plan.engine_memory import (
    checkpoint_fp8,
    default_mem_fraction,
    estimate_rollout,
    longest_request,
)
from rlpost.plan.fsdp import estimate_fsdp_train, estimate_sender, fsdp_trains
from rlpost.plan.layout import RECOMPUTE_NONE, EngineLayout, ParallelLayout, Sizes
from rlpost.plan.loop import default_colocate
from rlpost.plan.memory import estimate_train
from rlpost.plan.placement import engine_offset, misplaced_engines
from rlpost.plan.remedies import fsdp_fixes, megatron_fixes
from rlpost.plan.runtime import resolve_engine_backend
from rlpost.plan.work import SEND_WEIGHTS, train_rank_work
from rlpost.schema import RunConfig


@dataclass
class _Record:
    """Derived key paths and issues met while deriving (both end up in the plan or error)."""

    derived: list[str] = field(default_factory=list)
    issues: list[Issue] = field(default_factory=list)

    def pick(self, value: Any, default: Any, key: str) -> Any:
        if value is not None:
            return value
        self.derived.append(key)
        return default


@dataclass(frozen=True)
class Resolution:
    sizes: Sizes
    parallel: ParallelLayout
    engine: EngineLayout
    derived: tuple[str, ...]
    issues: tuple[Issue, ...]


def powers_of_two(limit: int) -> list[int]:
    return [1 << i for i in range(limit.bit_length()) if (1 << i) <= limit]


def resolve_sizes(cfg: RunConfig, rec: _Record) -> Sizes:
    hw, layout = cfg.hardware, cfg.layout
    # a reward model on a slot of its own (reward.model_placement: actor) takes one
    total = hw.total_gpus - cfg.recipe.rollout.reward.device_slots
    train_n, rollout_n = layout.train.num_gpus, layout.rollout.num_gpus
    colocate = rec.pick(layout.colocate, default_colocate(cfg, bool(rollout_n)), "layout.colocate")
    if colocate:
        train = rec.pick(train_n, total, "layout.train.num_gpus")
        return Sizes(True, total, train, train)
    if train_n is None and rollout_n is None:
        whole_nodes = hw.num_nodes // 2 * hw.gpus_per_node
        train_n = whole_nodes if hw.num_nodes > 1 else max(1, total // 2)
        rec.derived.append("layout.train.num_gpus")
    if rollout_n is None:
        rollout_n = max(0, total - (train_n or 0))
        rec.derived.append("layout.rollout.num_gpus")
    if train_n is None:
        train_n = max(1, total - rollout_n)
        rec.derived.append("layout.train.num_gpus")
    return Sizes(False, total, train_n, rollout_n)


def _derive_ep(cfg: RunConfig, world: int, pp: int, etp: int) -> int:
    moe = cfg.model.moe
    if moe is None or cfg.hardware.kind == "cpu" or world % pp or _torch_on_gpus(cfg):
        return 1
    grid = world // pp
    divisors = [d for d in range(1, moe.num_experts + 1) if moe.num_experts % d == 0]
    return max((d for d in divisors if grid % (d * etp) == 0), default=1)


def _torch_on_gpus(cfg: RunConfig) -> bool:
    """The torch trainer trains (on GPUs it is chosen whatever the layout): data parallel
    over every train GPU, FSDP2 sharding the model."""
    return fsdp_trains(cfg, resolve_trainer_backend(cfg, ParallelLayout.single_process()))


def _sends_weights(cfg: RunConfig) -> bool:
    """mode=eval's train ranks only send weights: sized by estimate_sender, and the plan's
    memory verdict (rlpost.plan.fit) says what does not fit, not a training remedy here."""
    return train_rank_work(cfg) == SEND_WEIGHTS


def _check_fsdp_fits(cfg: RunConfig, sizes: Sizes, par: ParallelLayout, rec: _Record) -> None:
    if _sends_weights(cfg):
        return
    need = estimate_fsdp_train(cfg, par, sizes.colocate)
    gpu = cfg.hardware.gpu_memory_gib
    if need.total_gib <= gpu:
        return
    state = need.weights_gib + need.grads_gib + need.optimizer_gib
    rec.issues.append(
        Issue(
            key="layout.train",
            value=None,
            message=(
                f"the torch trainer (FSDP2 over {par.dp} GPU{'s' if par.dp > 1 else ''}, "
                f"{need.shards} per shard group) "
                f"needs {need.total_gib:.1f} GiB per GPU for {cfg.model.name} and "
                f"{cfg.hardware.name} has {gpu:g}: float32 shards of weights, gradients and "
                f"Adam {state:.1f}, gathered layers {need.gathered_gib:.1f}, reference shard "
                f"{need.reference_gib:.1f}, activations (recompute {par.recompute}) + logits "
                f"{need.activations_gib + need.logits_gib:.1f}"
            ),
            fix=fsdp_fixes(cfg, par, sizes.colocate),
        )
    )


def tp_candidates(cfg: RunConfig, world: int, pp: int, cp: int) -> list[int]:
    """Powers of two within a node that split the GPUs, the heads and the query groups."""
    model = cfg.model
    if world % (pp * cp):
        return [1]
    grid = world // (pp * cp)
    return [
        t
        for t in powers_of_two(min(grid, cfg.hardware.gpus_per_node))
        if grid % t == 0
        and model.num_attention_heads % t == 0
        and (model.mla is not None or model.num_query_groups % t == 0)
    ]


def _derive_tp(cfg: RunConfig, sizes: Sizes, base: ParallelLayout, rec: _Record) -> int:
    candidates = tp_candidates(cfg, sizes.train_gpus, base.pp, base.cp)
    best = None
    for tp in candidates:
        trial = _with_tp(cfg, base, tp, sizes.train_gpus)
        if _sends_weights(cfg):
            need = estimate_sender(cfg, trial, sizes.colocate, cfg.engine.weight_bucket_mb << 20)
        else:
            need = estimate_train(cfg.model, cfg.recipe, cfg.hardware, trial, sizes.colocate)
        if need.total_gib <= cfg.hardware.gpu_memory_gib:
            return tp
        best = (tp, need)
    assert best is not None
    tp, need = best
    if _sends_weights(cfg):
        return tp
    rec.issues.append(
        Issue(
            key="layout.train.tp",
            value=None,
            message=(
                f"no tensor-parallel size fits {cfg.model.name} on {sizes.train_gpus} x "
                f"{cfg.hardware.gpu_memory_gib} GiB: the largest valid, tp={tp}, still needs "
                f"{need.total_gib:.1f} GiB per GPU ({need.terms()})"
            ),
            fix=megatron_fixes(cfg, _with_tp(cfg, base, tp, sizes.train_gpus), sizes.colocate),
        )
    )
    return tp


def _with_tp(cfg: RunConfig, base: ParallelLayout, tp: int, world: int) -> ParallelLayout:
    sp = cfg.layout.train.sequence_parallel
    return replace(
        base,
        tp=tp,
        dp=max(1, world // (tp * base.pp * base.cp)),
        sequence_parallel=tp > 1 if sp is None else sp,
    )


def resolve_parallel(cfg: RunConfig, sizes: Sizes, rec: _Record) -> ParallelLayout:
    train, world = cfg.layout.train, sizes.train_gpus
    on_cpu = cfg.hardware.kind == "cpu"
    pp = rec.pick(train.pp, 1, "layout.train.pp")
    cp = rec.pick(train.cp, 1, "layout.train.cp")
    etp = rec.pick(train.etp, 1, "layout.train.etp")
    ep = train.ep if train.ep is not None else _derive_ep(cfg, world, pp, etp)
    if train.ep is None:
        rec.derived.append("layout.train.ep")
    default_recompute = RECOMPUTE_NONE if on_cpu else "full"
    torch_on_gpus = _torch_on_gpus(cfg)
    # megatron-core's token dispatcher; the torch trainer runs the model's own MoE layers
    moe_dispatcher = "alltoall" if cfg.model.moe is not None and not torch_on_gpus else None
    base = ParallelLayout.from_train(
        train,
        tp=train.tp or 1,
        pp=pp,
        cp=cp,
        ep=ep,
        etp=etp,
        dp=1,
        sequence_parallel=False,
        recompute=train.recompute.granularity or default_recompute,
        dispatcher=moe_dispatcher,
    )
    if train.recompute.granularity is None:
        rec.derived.append("layout.train.recompute.granularity")
    if train.moe_token_dispatcher_type is None and moe_dispatcher:
        rec.derived.append("layout.train.moe_token_dispatcher_type")
    tp = train.tp
    if tp is None:
        tp = 1 if on_cpu or torch_on_gpus else _derive_tp(cfg, sizes, base, rec)
        rec.derived.append("layout.train.tp")
    resolved = _with_tp(cfg, base, tp, world)
    if torch_on_gpus and train.tp is None and train.dp is None:
        _check_fsdp_fits(cfg, sizes, resolved, rec)
    if train.sequence_parallel is None:
        rec.derived.append("layout.train.sequence_parallel")
    if train.dp is not None:
        return replace(resolved, dp=train.dp)
    rec.derived.append("layout.train.dp")
    return resolved


def engine_shape(options: dict[str, Any]) -> tuple[int, int]:
    """(attention dp size, SGLang expert-parallel size) from the pass-through options."""
    dp_size = int(options.get("dp_size") or 1) if options.get("enable_dp_attention") else 1
    ep_size = int(options.get("ep_size") or options.get("expert_parallel_size") or 1)
    return dp_size, ep_size


def engine_size_candidates(cfg: RunConfig, sizes: Sizes, dp_size: int) -> list[int]:
    hw, model = cfg.hardware, cfg.model
    offset = engine_offset(sizes.colocate, sizes.train_gpus)
    found = []
    for size in powers_of_two(sizes.rollout_gpus):
        if sizes.rollout_gpus % size or size % dp_size:
            continue
        attention_tp = size // dp_size
        groups_ok = model.mla is not None or (
            model.num_query_groups % attention_tp == 0 or attention_tp % model.num_query_groups == 0
        )
        count = sizes.rollout_gpus // size
        placed = not misplaced_engines(offset, size, count, hw.gpus_per_node)
        if model.num_attention_heads % attention_tp == 0 and groups_ok and placed:
            found.append(size)
    return found


def _derive_engine_size(
    cfg: RunConfig, sizes: Sizes, options: dict[str, Any], fp8: Fp8Format | None, rec: _Record
) -> int:
    if cfg.hardware.kind == "cpu" or sizes.rollout_gpus == 0:
        return 1
    dp_size, _ = engine_shape(options)
    candidates = engine_size_candidates(cfg, sizes, dp_size) or [1]
    for size in candidates:
        fraction = options.get("mem_fraction_static") or default_mem_fraction(
            cfg.hardware, size, dp_size, options, sizes.colocate
        )
        need = estimate_rollout(
            cfg.model,
            longest_request(cfg),
            cfg.hardware,
            size,
            dp_size,
            fraction,
            options,
            sizes.colocate,
            fp8,
        )
        if need.holds_one_sample and need.total_gib <= cfg.hardware.gpu_memory_gib:
            return size
    size = candidates[-1]
    rec.issues.append(
        Issue(
            key="layout.rollout.gpus_per_engine",
            value=None,
            message=(
                f"no engine size up to {size} GPUs leaves a KV cache for one "
                f"{need.longest_sample_tokens}-token sample: the weight shard takes "
                f"{need.weights_gib:.1f} GiB of the {fraction} x {cfg.hardware.gpu_memory_gib} "
                f"GiB static pool"
            ),
            fix="set layout.rollout.gpus_per_engine (larger engines shard the weights "
            "further), raise layout.rollout.sglang.mem_fraction_static, or give rollout more GPUs",
        )
    )
    return size


DETERMINISTIC_OPTION = "enable_deterministic_inference"


def engine_options(cfg: RunConfig) -> dict[str, Any]:
    """layout.rollout.sglang, with what `run.deterministic` needs of SGLang engines: SGLang
    samples with a request's seed only in its deterministic inference mode (without it the
    per-sample seeds the run sends would be dropped and no two runs would sample alike)."""
    options = dict(cfg.layout.rollout.sglang)
    if cfg.run.deterministic and resolve_engine_backend(cfg) == "sglang":
        options.setdefault(DETERMINISTIC_OPTION, True)
    return options


def resolve_engine(cfg: RunConfig, sizes: Sizes, rec: _Record) -> EngineLayout:
    rollout = cfg.layout.rollout
    options = engine_options(cfg)
    if DETERMINISTIC_OPTION in options.keys() - rollout.sglang.keys():
        rec.derived.append(f"layout.rollout.sglang.{DETERMINISTIC_OPTION}")
    dp_size, ep_size = engine_shape(options)
    fp8 = checkpoint_fp8(cfg.model.hf_checkpoint)
    size = rollout.gpus_per_engine
    if size is None:
        size = _derive_engine_size(cfg, sizes, options, fp8, rec)
        rec.derived.append("layout.rollout.gpus_per_engine")
    if options.get("mem_fraction_static") is None:
        options["mem_fraction_static"] = default_mem_fraction(
            cfg.hardware, size, dp_size, options, sizes.colocate
        )
        rec.derived.append("layout.rollout.sglang.mem_fraction_static")
    return EngineLayout(
        gpus_per_engine=size,
        num_engines=sizes.rollout_gpus // size,
        mem_fraction_static=float(options["mem_fraction_static"]),
        dp_size=dp_size,
        ep_size=ep_size,
        sglang=tuple(options.items()),
        fp8=fp8,
    )


def resolve_layout(cfg: RunConfig) -> Resolution:
    """The layout with every null filled in, and what could not be."""
    rec = _Record()
    sizes = resolve_sizes(cfg, rec)
    parallel = resolve_parallel(cfg, sizes, rec)
    engine = resolve_engine(cfg, sizes, rec)
    return Resolution(sizes, parallel, engine, tuple(rec.derived), tuple(rec.issues))
