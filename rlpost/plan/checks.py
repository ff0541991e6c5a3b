"""Rules a resolved layout must satisfy before anything starts; each broken rule is an Issue.

Every check is a small function registered by name; `check_layout` runs them all so a user
sees every problem at once. Rules mirror what megatron-core, SGLang and the placement would
reject later (or silently get wrong), with the value, the reason and the fix.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from rlpost.errors import Issue
from rlpost.plan.backends import (
    GENERIC_TRAINERS,
    GPU_TRAINERS,
    compute_dtype,
    resolve_trainer_backend,
    unsupported_parallel,
)
from rlpost.plan.layout import EngineLayout, ParallelLayout, Sizes
from rlpost.plan.params import stage_layers
from rlpost.plan.stages import FIRST, LAST, lopsided, most_balanced_split, split_change
from rlpost.schema import GENERIC_FAMILY, ModelConfig, RunConfig
from rlpost.schema.hardware import device_word


@dataclass(frozen=True)
class PlanContext:
    cfg: RunConfig
    sizes: Sizes
    parallel: ParallelLayout
    engine: EngineLayout

    def devices(self, count: int) -> str:
        """What `count` of the profile's devices are called: GPUs, or device slots on CPU."""
        return device_word(self.cfg.hardware.kind, count)

    def replicas(self, size: int) -> str:
        """Model replicas of `size` devices each: '2-GPU model replicas', or on CPU
        '2-device-slot model replicas'."""
        return f"{size}-{self.devices(1).replace(' ', '-')} model replicas"


Check = Callable[[PlanContext], list[Issue]]
CHECKS: dict[str, Check] = {}
# What a rule reads besides the config: "train" the training grid, "engine" the engines,
# "run" only the GPU split. The layout search checks each part of a candidate on its own.
SCOPES: dict[str, str] = {}


def check(name: str, scope: str = "run") -> Callable[[Check], Check]:
    def register(fn: Check) -> Check:
        CHECKS[name] = fn
        SCOPES[name] = scope
        return fn

    return register


def run_checks(
    ctx: PlanContext, scope: str | None = None, skip: frozenset[str] = frozenset()
) -> list[Issue]:
    """Every registered rule's issues (of one scope when given, none of the `skip` scopes or
    rules), in registration order."""
    return [
        issue
        for name, rule in CHECKS.items()
        if (scope is None or SCOPES[name] == scope)
        and SCOPES[name] not in skip
        and name not in skip
        for issue in rule(ctx)
    ]


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _examples(values: list[int], limit: int = 6) -> str:
    return ", ".join(map(str, values[:limit]))


@check("gpu_budget")
def check_gpu_budget(ctx: PlanContext) -> list[Issue]:
    s, hw = ctx.sizes, ctx.cfg.hardware
    where = (
        f"{hw.name} has {s.total_gpus} {ctx.devices(s.total_gpus)} "
        f"({hw.num_nodes} x {hw.gpus_per_node}"
    )
    kept = hw.total_gpus - s.total_gpus
    where += f", less {kept} for the reward model)" if kept else ")"
    if s.colocate and s.train_gpus > s.total_gpus:
        return [
            Issue(
                "layout.train.num_gpus",
                f"colocated training and rollout share {s.train_gpus} {ctx.devices(s.train_gpus)}, "
                f"but {where}",
                f"set layout.train.num_gpus <= {s.total_gpus}, or pick a larger hardware profile",
                s.train_gpus,
            )
        ]
    if s.colocate:
        return []
    if s.rollout_gpus == 0:
        return [
            Issue(
                "layout.rollout.num_gpus",
                f"decoupled (colocate: false) leaves no {ctx.devices(0)} for the engines: "
                f"{s.train_gpus} train {ctx.devices(s.train_gpus)} take all of them",
                f"set layout.train.num_gpus below {s.total_gpus} and layout.rollout.num_gpus "
                "to the rest, or layout.colocate: true",
                0,
            )
        ]
    if s.train_gpus + s.rollout_gpus > s.total_gpus:
        return [
            Issue(
                "layout.rollout.num_gpus",
                f"decoupled placement asks for {s.train_gpus} train + {s.rollout_gpus} rollout = "
                f"{s.train_gpus + s.rollout_gpus} {ctx.devices(2)}, but {where}",
                f"make layout.train.num_gpus + layout.rollout.num_gpus <= {s.total_gpus} "
                f"(e.g. rollout {max(0, s.total_gpus - s.train_gpus)}), or pick larger hardware",
                s.rollout_gpus,
            )
        ]
    return []


@check("train_grid", scope="train")
def check_train_grid(ctx: PlanContext) -> list[Issue]:
    p, world = ctx.parallel, ctx.sizes.train_gpus
    model_parallel = p.tp * p.pp * p.cp
    if world % model_parallel:
        return [
            Issue(
                "layout.train.num_gpus",
                f"{world} train {ctx.devices(world)} "
                f"{'does' if world == 1 else 'do'} not split into tp x pp x cp = "
                f"{p.tp} x {p.pp} x {p.cp} = {ctx.replicas(model_parallel)} (data parallelism "
                "needs whole replicas)",
                _train_grid_fix(ctx),
                world,
            )
        ]
    if p.world != world:
        return [
            Issue(
                "layout.train.dp",
                f"tp x pp x cp x dp = {p.tp} x {p.pp} x {p.cp} x {p.dp} = {p.world}, but there "
                f"{'is' if world == 1 else 'are'} {world} train {ctx.devices(world)}",
                f"set layout.train.dp: {world // model_parallel}, or remove it to derive it",
                p.dp,
            )
        ]
    return []


def _train_grid_fix(ctx: PlanContext) -> str:
    """What makes whole replicas on this hardware: a tp the model splits into that divides
    the train GPUs, more train GPUs where the profile has them, else a larger profile."""
    p, s, model = ctx.parallel, ctx.sizes, ctx.cfg.model
    model_parallel, others = p.tp * p.pp * p.cp, p.pp * p.cp
    room = s.total_gpus if s.colocate else s.total_gpus - s.rollout_gpus
    fixes = []
    if s.train_gpus % others == 0:
        per_replica = s.train_gpus // others
        tps = [t for t in divisors(per_replica) if _tp_splits(model, t)]
        within = f" / pp x cp = {per_replica}" if others > 1 else ""
        fixes.append(f"use a layout.train.tp that divides {s.train_gpus}{within}: {_examples(tps)}")
    more = list(range(model_parallel, room + 1, model_parallel))
    if more and _tp_splits(model, p.tp):
        fixes.append(
            f"use a multiple of {model_parallel} train {ctx.devices(2)} that "
            f"{ctx.cfg.hardware.name} has "
            f"(layout.train.num_gpus: {_examples(more)})"
        )
    elif _tp_splits(model, p.tp) and model_parallel <= s.total_gpus:
        fixes.append(_room_for_training(ctx, model_parallel))
    elif _tp_splits(model, p.tp):
        fixes.append(f"use a hardware profile of {model_parallel} {ctx.devices(2)} or more")
    if s.train_gpus % others != 0:
        fixes.append("change layout.train.pp/cp")
    return "; or ".join(fixes)


def _room_for_training(ctx: PlanContext, model_parallel: int) -> str:
    """Decoupled, the rollout's devices leave training too few for one replica, though the
    profile holds one: colocate, or hand training more of them."""
    s, name = ctx.sizes, ctx.cfg.hardware.name
    fix = (
        f"{name} has {s.total_gpus} {ctx.devices(s.total_gpus)} and the rollout takes "
        f"{s.rollout_gpus}: set layout.colocate: true and remove layout.train.num_gpus and "
        f"layout.rollout.num_gpus (training and rollout then share all {s.total_gpus})"
    )
    rest = s.total_gpus - model_parallel
    if rest > 0:
        fix += f", or layout.train.num_gpus: {model_parallel} with layout.rollout.num_gpus: {rest}"
    return fix


def _tp_splits(model: ModelConfig, tp: int) -> bool:
    """check_attention_heads' rule: whole heads, and whole query groups without MLA."""
    heads_ok = model.num_attention_heads % tp == 0
    return heads_ok and (model.mla is not None or model.num_query_groups % tp == 0)


@check("attention_heads", scope="train")
def check_attention_heads(ctx: PlanContext) -> list[Issue]:
    model, tp = ctx.cfg.model, ctx.parallel.tp
    issues = []
    heads = model.num_attention_heads
    if heads % tp:
        kind = "multi-latent attention splits" if model.mla else "tensor parallelism splits"
        issues.append(
            Issue(
                "layout.train.tp",
                f"{kind} the {heads} attention heads over tp={tp} ranks, and {heads} is not a "
                "multiple of it",
                f"use a tp that divides {heads}: {_examples(divisors(heads))}",
                tp,
            )
        )
    groups = model.num_query_groups
    if model.mla is None and groups % tp and not heads % tp:
        issues.append(
            Issue(
                "layout.train.tp",
                f"tensor parallelism splits the {groups} query groups (KV heads) over tp={tp} "
                "ranks, and megatron-core needs whole groups per rank",
                f"use a tp that divides {groups}: {_examples(divisors(groups))}",
                tp,
            )
        )
    return issues


@check("experts", scope="train")
def check_experts(ctx: PlanContext) -> list[Issue]:
    moe, p = ctx.cfg.model.moe, ctx.parallel
    if moe is None:
        if p.ep > 1:
            return [
                Issue(
                    "layout.train.ep",
                    f"expert parallelism splits MoE experts, and {ctx.cfg.model.name} is dense",
                    "set layout.train.ep: 1 (or remove it)",
                    p.ep,
                )
            ]
        if p.etp > 1:
            return [
                Issue(
                    "layout.train.etp",
                    f"expert tensor parallelism splits each MoE expert's weights, and "
                    f"{ctx.cfg.model.name} is dense (no model.moe): it would have no effect, "
                    "and the dense layers split by layout.train.tp alone",
                    "remove it (or set layout.train.etp: 1); to split the dense layers "
                    "further, raise layout.train.tp",
                    p.etp,
                )
            ]
        return _dense_dispatcher(ctx)
    issues = []
    if moe.num_experts % p.ep:
        issues.append(
            Issue(
                "layout.train.ep",
                f"{moe.num_experts} experts do not split evenly over ep={p.ep} ranks",
                f"use an ep that divides {moe.num_experts}: {_examples(divisors(moe.num_experts))}",
                p.ep,
            )
        )
    grid = p.etp * p.ep * p.pp
    world = ctx.sizes.train_gpus
    grid_room = world // p.pp if world % p.pp == 0 else f"{world}/{p.pp}"
    if world % grid:
        issues.append(
            Issue(
                "layout.train.ep",
                f"megatron-core lays experts on an etp x ep x pp grid that must divide the world: "
                f"{p.etp} x {p.ep} x {p.pp} = {grid} does not divide {world} train "
                f"{ctx.devices(world)} (equivalently, ep x etp must divide tp x cp x dp)",
                f"pick ep and etp whose product divides world / pp (here {grid_room})",
                p.ep,
            )
        )
    return issues


def _dense_dispatcher(ctx: PlanContext) -> list[Issue]:
    """MoE token-dispatch settings on a dense model: nothing dispatches tokens."""
    train, name = ctx.cfg.layout.train, ctx.cfg.model.name
    for key, value in (
        ("moe_token_dispatcher_type", train.moe_token_dispatcher_type),
        ("moe_enable_deepep", train.moe_enable_deepep or None),
    ):
        if value is not None:
            return [
                Issue(
                    f"layout.train.{key}",
                    f"it routes tokens between MoE experts, and {name} is dense (no model.moe): "
                    "it would have no effect",
                    "remove it, or choose an MoE model (a layout copied from one keeps it)",
                    value,
                )
            ]
    return []


@check("pipeline", scope="train")
def check_pipeline(ctx: PlanContext) -> list[Issue]:
    p, layers = ctx.parallel, ctx.cfg.model.num_layers
    first, last = p.num_layers_in_first_pipeline_stage, p.num_layers_in_last_pipeline_stage
    if p.pp == 1 and (first or last) and ctx.cfg.trainer.backend == "torch":
        return []  # the torch trainer has no stages: _megatron_only_settings says so
    if p.pp == 1 and (first or last):
        return [
            Issue(
                "layout.train.num_layers_in_first_pipeline_stage"
                if first
                else "layout.train.num_layers_in_last_pipeline_stage",
                "uneven pipeline stages need more than one stage, and pp=1",
                "remove it, or set layout.train.pp >= 2",
                first or last,
            )
        ]
    if stage_layers(layers, p.pp, first, last) is not None:
        return []
    if first or last:
        return [_uneven_split_issue(layers, p.pp, first, last)]
    uneven = (layers + p.pp - 1) // p.pp
    return [
        Issue(
            "layout.train.pp",
            f"{layers} layers do not split evenly over pp={p.pp} pipeline stages "
            "(megatron-core would silently build only pp x floor(layers/pp) of them)",
            f"use a pp that divides {layers} ({_examples(divisors(layers))}), or an uneven split: "
            f"layout.train.num_layers_in_last_pipeline_stage: {layers - uneven * (p.pp - 1)}",
            p.pp,
        )
    ]


def _uneven_split_issue(layers: int, pp: int, first: int | None, last: int | None) -> Issue:
    """First and/or last stage counts that leave the stages between them no even share: the
    stage count refused (the first where both are set), what it leaves, and the most balanced
    split that keeps it (where that one is not lopsided), besides the most balanced of all."""
    key, value = (FIRST, first) if first is not None else (LAST, last)
    ends = [v for v in (first, last) if v is not None]
    taken, between, rest = sum(ends), pp - len(ends), layers - sum(ends)
    if len(ends) == 2:
        what = f"the first and last stages are set to {ends[0]} + {ends[1]} = {taken} layers"
    else:
        what = f"the {'first' if first is not None else 'last'} stage is set to {taken} layers"
    if between == 0:
        why = "and with no stage between them the two must hold them all"
    elif rest <= 0:
        others = "the other stage" if between == 1 else f"the other {between} stages"
        why = f"which leaves none for {others}"
    else:
        why = (
            f"which leaves {rest} for the {between} stages between, and {rest} does not split "
            f"evenly over {between} (megatron-core builds the same count on each)"
        )
    best = most_balanced_split(layers, pp)
    kept = most_balanced_split(layers, pp, first, None) if first is not None else None
    if kept is None and last is not None:
        kept = most_balanced_split(layers, pp, None, last)
    splits = [best] if best is None or kept is None or lopsided(kept[2], best[2]) else [kept, best]
    fixes = [split_change(first, last, split) for split in splits if split is not None]
    return Issue(
        key,
        f"with pp={pp}, {what} of the model's {layers}, {why}",
        "; or ".join(dict.fromkeys(fixes)),
        value,
    )


@check("uniform_recompute_groups", scope="train")
def check_uniform_recompute_groups(ctx: PlanContext) -> list[Issue]:
    """megatron-core's uniform recompute checkpoints each stage's layers in groups of
    recompute_num_layers without clamping the last group to the stage: a stage whose layer
    count is not a multiple of the group indexes a layer it does not hold (an IndexError in
    the first training forward, after the first rollout). The torch trainer refuses groups
    above 1 on its own (torch_recompute_issues)."""
    p = ctx.parallel
    if p.recompute != "full" or p.recompute_method != "uniform" or p.recompute_num_layers == 1:
        return []
    if resolve_trainer_backend(ctx.cfg, p) != "megatron":
        return []
    first, last = p.num_layers_in_first_pipeline_stage, p.num_layers_in_last_pipeline_stage
    stages = stage_layers(ctx.cfg.model.num_layers, p.pp, first, last)
    if stages is None:  # check_pipeline says why
        return []
    group = p.recompute_num_layers
    uneven = sorted({s for s in stages if s % group})
    if not uneven:
        return []
    fitting = divisors(math.gcd(*stages))
    if p.pp == 1:
        where = f"the model's {stages[0]} layers are"
    else:
        where = f"stages of {' and '.join(map(str, uneven))} layers (of {list(stages)}) are"
    return [
        Issue(
            "layout.train.recompute.num_layers",
            f"uniform recompute checkpoints each stage's layers in groups of {group}, and "
            f"{where} not a multiple of {group}: megatron-core's last group reaches past the "
            "stage's last layer, and the first training step fails (IndexError) after the "
            "first rollout",
            f"use a group size that divides every stage's layers ({_examples(fitting)}), or "
            f"method: block to recompute the first {min(group, max(stages))} layers of each "
            "stage",
            group,
        )
    ]


@check("sequence_parallel", scope="train")
def check_sequence_parallel(ctx: PlanContext) -> list[Issue]:
    p = ctx.parallel
    if p.sequence_parallel and p.tp == 1:
        return [
            Issue(
                "layout.train.sequence_parallel",
                "sequence parallelism splits activations over the tensor-parallel group, "
                "which has size tp=1",
                "set layout.train.sequence_parallel: false, or tp >= 2",
                True,
            )
        ]
    if not p.sequence_parallel and p.tp > 1 and p.ep > 1:
        return [
            Issue(
                "layout.train.sequence_parallel",
                f"megatron-core requires sequence parallelism when expert (ep={p.ep}) and "
                f"tensor (tp={p.tp}) parallelism combine",
                "set layout.train.sequence_parallel: true (or remove it to derive it)",
                False,
            )
        ]
    return []


@check("context_parallel", scope="train")
def check_context_parallel(ctx: PlanContext) -> list[Issue]:
    train = ctx.cfg.recipe.train
    if ctx.parallel.cp > 1 and not train.use_dynamic_batch_size:
        return [
            Issue(
                "layout.train.cp",
                f"context parallelism (cp={ctx.parallel.cp}) splits packed micro-batches of "
                "max_tokens_per_gpu x cp tokens over the CP group, and packing is off "
                "(recipe.train.use_dynamic_batch_size: false)",
                "set recipe.train.use_dynamic_batch_size: true with max_tokens_per_gpu "
                "(about max_response_len / cp), or layout.train.cp: 1",
                ctx.parallel.cp,
            )
        ]
    return []


@check("trainer_backend", scope="train")
def check_trainer_backend(ctx: PlanContext) -> list[Issue]:
    configured = ctx.cfg.trainer.backend
    backend = resolve_trainer_backend(ctx.cfg, ctx.parallel)
    issues = generic_model_issues(ctx.cfg)
    if issues:
        return issues
    if ctx.cfg.hardware.kind == "gpu" and backend not in GPU_TRAINERS:
        issues.append(
            Issue(
                "trainer.backend",
                f"the {backend} trainer trains on CPU, and {ctx.cfg.hardware.name} is a GPU "
                "machine",
                "set trainer.backend=megatron (or auto)",
                value=configured,
            )
        )
    unsupported = unsupported_parallel(backend, ctx.parallel)
    if unsupported:
        sizes = ", ".join(f"{k}={v}" for k, v in unsupported.items())
        keys = " and ".join(f"layout.train.{k}" for k in unsupported)
        if "tp" in unsupported and ctx.parallel.sequence_parallel:
            keys += " and set layout.train.sequence_parallel: false (it splits over TP)"
        megatron = "" if ctx.cfg.model.family == GENERIC_FAMILY else "; or trainer.backend=megatron"
        issues.append(
            Issue(
                "trainer.backend",
                f"the {backend} trainer is data parallel only (FSDP2 shards the model over the "
                f"data-parallel ranks; it has no tensor, pipeline, context or expert "
                f"parallelism), and the layout has {sizes}",
                f"remove {keys} (every train {ctx.devices(1)} then holds 1/DP of the model); "
                f"if it does not fit, layout.train.fsdp.cpu_offload: true or more "
                f"{ctx.devices(2)}; or layout=auto, which "
                "searches this trainer's layouts" + megatron,
                value=configured,
            )
        )
    if backend == "torch":
        issues += torch_recompute_issues(ctx.parallel)
        issues += torch_dtype_issues(ctx.cfg)
        issues += _megatron_only_settings(ctx)
    if backend == "megatron":
        issues += megatron_model_issues(ctx.cfg.model)
    issues += router_dtype_issues(ctx.cfg, backend)
    issues += grouped_gemm_issues(ctx.cfg, ctx.parallel, backend)
    return issues


def megatron_model_issues(model: ModelConfig) -> list[Issue]:
    """Architectures rlpost's megatron-core layers would compute differently from the
    checkpoint (the torch trainer runs transformers' own code for each)."""
    found = []
    fix = "set trainer.backend=torch (it runs transformers' code for the model)"
    if model.activation != "swiglu":
        found.append(
            Issue(
                "model.activation",
                "the megatron trainer builds SwiGLU MLPs only",
                fix,
                model.activation,
            )
        )
    moe = model.moe
    if moe and moe.router_score == "sigmoid" and not moe.norm_topk_prob and moe.top_k > 1:
        found.append(
            Issue(
                "model.moe.norm_topk_prob",
                "megatron-core always normalises a sigmoid router's top-k scores",
                "set norm_topk_prob: true if the HF config says so; else " + fix,
                False,
            )
        )
    if moe and moe.grouped_gemm and model.add_bias_linear:
        found.append(
            Issue(
                "model.moe.grouped_gemm",
                "the megatron trainer's grouped experts have no biases, and "
                "model.add_bias_linear is true (megatron-core's own grouped experts refuse "
                "biases too)",
                "set model.moe.grouped_gemm: false (the experts then run one at a time, biases "
                "included)",
                True,
            )
        )
    if model.mla is not None and model.rope_scaling and model.rope_scaling.type != "yarn":
        found.append(
            Issue(
                "model.rope_scaling.type",
                "megatron-core's multi-latent attention scales RoPE with YaRN only",
                fix,
                model.rope_scaling.type,
            )
        )
    return found


HALF_PRECISION_ROUTERS = ("qwen3_moe",)
"""The families whose transformers router computes in the layer's dtype, so that the torch
trainer can run it in bf16; the others' (GLM-4.5, DeepSeek-V3) upcast to float32 in their own
code, and a generic model's router is whatever its architecture writes."""


def router_dtype_issues(cfg: RunConfig, backend: str) -> list[Issue]:
    """model.moe.router_dtype: bf16 where a GPU trainer would route in another precision. On
    CPU both trainers compute everything in float32 (the plan says so)."""
    moe = cfg.model.moe
    if moe is None or moe.router_dtype != "bf16" or cfg.hardware.kind != "gpu":
        return []
    model = cfg.model
    fix = "set model.moe.router_dtype: fp32 (the default; slime's MoE models all route in fp32)"
    if backend == "megatron" and model.params_dtype != "bf16":
        reason = (
            f"megatron-core routes in the model's dtype unless told fp32, and "
            f"model.params_dtype is {model.params_dtype}"
        )
    elif backend == "torch" and model.family not in HALF_PRECISION_ROUTERS:
        reason = (
            f"the torch trainer runs transformers' {model.hf_architecture} router, which "
            "computes in float32 in its own code"
            if model.family != GENERIC_FAMILY
            else f"the torch trainer runs transformers' {model.hf_architecture} router as its "
            "code is written, and rlpost can only raise a router's precision, not lower it"
        )
    else:
        return []
    return [Issue("model.moe.router_dtype", f"{reason}: it would not route in bf16", fix, "bf16")]


GROUPED_GEMM_ROW_BYTES = 16
"""torch's grouped GEMM (both trainers' `model.moe.grouped_gemm: true`) takes operands whose
rows start every 16 bytes: a hidden size and an expert FFN size (per expert-TP rank) of a
multiple of 8 elements in bf16, of 4 in float32."""


def grouped_gemm_issues(cfg: RunConfig, parallel: ParallelLayout, backend: str) -> list[Issue]:
    """model.moe.grouped_gemm: true where torch's grouped GEMM, which both trainers' grouped
    experts call, cannot run as asked: in another dtype than bf16 on CUDA (its kernel is
    bf16 only; other dtypes run one GEMM per expert behind a host sync), or on sizes whose
    rows it cannot address."""
    moe = cfg.model.moe
    if moe is None or not moe.grouped_gemm:
        return []
    fix = "set model.moe.grouped_gemm: false (the experts then run one at a time)"
    on_gpu = cfg.hardware.kind == "gpu"
    dtype = compute_dtype(cfg)
    if on_gpu and dtype != "bf16":
        return [
            Issue(
                "model.moe.grouped_gemm",
                f"torch's grouped GEMM kernel on CUDA is bf16 only, and model.params_dtype is "
                f"{dtype}: it would run each expert's GEMM in turn, behind a host "
                "synchronisation per call",
                fix + ", or model.params_dtype: bf16",
                True,
            )
        ]
    per_row = GROUPED_GEMM_ROW_BYTES // (2 if dtype == "bf16" else 4)
    etp = parallel.etp if backend == "megatron" else 1
    ffn = moe.expert_ffn_hidden_size // etp
    sizes = {"model.hidden_size": cfg.model.hidden_size, "the expert FFN per rank": ffn}
    odd = [f"{name} {size}" for name, size in sizes.items() if size % per_row]
    if not odd:
        return []
    return [
        Issue(
            "model.moe.grouped_gemm",
            f"torch's grouped GEMM reads rows that start every {GROUPED_GEMM_ROW_BYTES} bytes "
            f"(multiples of {per_row} elements in {dtype}), and {' and '.join(odd)} "
            f"{'is' if len(odd) == 1 else 'are'} not",
            fix,
            True,
        )
    ]


def torch_dtype_issues(cfg: RunConfig) -> list[Issue]:
    """The torch trainer computes in model.params_dtype on GPUs, bf16 or fp32 (float32 master
    weights either way; on CPU always float32); fp16 would need loss scaling, which megatron's
    optimizer has and this trainer does not."""
    if cfg.model.params_dtype != "fp16":
        return []
    megatron = "" if cfg.model.family == GENERIC_FAMILY else ", or trainer.backend=megatron"
    return [
        Issue(
            "model.params_dtype",
            "the torch trainer computes in bf16 or fp32: fp16 needs a loss scale to keep "
            "small gradients from flushing to zero, and this trainer has none",
            "set model.params_dtype: bf16 (the same bytes as fp16, float32's range; the "
            f"engines follow it){megatron}, whose fp16 optimizer scales the loss",
            value=cfg.model.params_dtype,
        )
    ]


def torch_recompute_issues(parallel: ParallelLayout) -> list[Issue]:
    """The torch trainer recomputes whole decoder layers (activation checkpointing): every
    layer, or with method block the first num_layers; nothing finer, nothing grouped."""
    if parallel.recompute == "selective":
        return [
            Issue(
                "layout.train.recompute.granularity",
                "the torch trainer checkpoints whole decoder layers; selective recompute (of "
                "the attention core inside a layer) is megatron-core's",
                "set granularity: full (every decoder layer recomputed) or none, or "
                "trainer.backend=megatron",
                value=parallel.recompute,
            )
        ]
    if (
        parallel.recompute == "full"
        and parallel.recompute_method == "uniform"
        and parallel.recompute_num_layers != 1
    ):
        return [
            Issue(
                "layout.train.recompute.num_layers",
                f"the torch trainer checkpoints decoder layers one by one; uniform recompute "
                f"of groups of {parallel.recompute_num_layers} layers is megatron-core's",
                "set num_layers: 1 (every layer), or method: block to recompute only the "
                "first num_layers layers",
                value=parallel.recompute_num_layers,
            )
        ]
    return []


@check("fsdp_layout", scope="train")
def check_fsdp_layout(ctx: PlanContext) -> list[Issue]:
    """layout.train.fsdp configures the torch trainer's FSDP2 sharding; megatron would
    ignore it, and an HSDP shard group must divide the data-parallel ranks."""
    fsdp = ctx.cfg.layout.train.fsdp
    backend = resolve_trainer_backend(ctx.cfg, ctx.parallel)
    evaluating = ctx.cfg.mode == "eval"  # no optimizer: recipe.optim goes unread
    default = type(fsdp)().model_dump()
    chosen = {k: v for k, v in fsdp.model_dump().items() if v != default[k]}
    if backend != "torch" and chosen:
        return [
            Issue(
                f"layout.train.fsdp.{name}",
                f"FSDP2's {name} configures the torch trainer, and this run trains with "
                f"{backend}, which would ignore it",
                "remove layout.train.fsdp"
                + ("" if evaluating else MEGATRON_OFFLOAD)
                + ", or set trainer.backend=torch",
                value=value,
            )
            for name, value in chosen.items()
        ]
    size = fsdp.shard_group_size
    if size is not None and ctx.parallel.dp % size:
        return [
            Issue(
                "layout.train.fsdp.shard_group_size",
                f"HSDP shards within groups of shard_group_size={size} ranks and replicates "
                f"across them, and {size} does not divide the dp={ctx.parallel.dp} "
                "data-parallel ranks",
                f"set shard_group_size to a divisor of {ctx.parallel.dp}, or null to shard "
                "over all of them",
                value=size,
            )
        ]
    return []


MEGATRON_OFFLOAD = " (megatron: recipe.optim.cpu_offload, the distributed optimizer)"


def _megatron_only_settings(ctx: PlanContext) -> list[Issue]:
    """Settings only megatron-core reads: the torch trainer would ignore them. MoE dispatch
    settings on a dense model are left to _dense_dispatcher, which says why they mean nothing
    under either trainer. recipe.optim's are training's: an evaluation reads neither trainer's
    optimizer settings."""
    cfg = ctx.cfg
    train, optim = cfg.layout.train, cfg.recipe.optim
    fsdp = "layout.train.fsdp.cpu_offload: true (FSDP2 keeps shards and Adam on the host)"
    megatron = "" if cfg.model.family == GENERIC_FAMILY else ", or set trainer.backend=megatron"
    dispatch = "megatron-core's expert token dispatch"
    own_moe = "remove it (the torch trainer runs the model's own MoE layers on every rank)"
    trains = cfg.mode != "eval"
    found: list[tuple[str, object, bool, str, str]] = [
        (
            "recipe.optim.cpu_offload",
            optim.cpu_offload,
            optim.cpu_offload and trains,
            "megatron's CPU Adam (HybridDeviceOptimizer)",
            f"remove it; the torch trainer offloads with {fsdp}",
        ),
        (
            "recipe.optim.precision_aware_optimizer",
            optim.precision_aware_optimizer,
            optim.precision_aware_optimizer and trains,
            "megatron's precision-aware optimizer",
            "remove it (the torch trainer keeps float32 master weights and Adam state)",
        ),
        (
            "layout.train.distributed_optimizer",
            train.distributed_optimizer,
            not train.distributed_optimizer,
            "megatron's choice between a replicated and a distributed optimizer",
            "remove it (FSDP2 always shards the optimizer state over the data-parallel ranks)",
        ),
    ]
    if cfg.model.moe is not None:
        found += [
            (
                "layout.train.moe_token_dispatcher_type",
                train.moe_token_dispatcher_type,
                train.moe_token_dispatcher_type is not None,
                dispatch,
                own_moe,
            ),
            (
                "layout.train.moe_enable_deepep",
                train.moe_enable_deepep,
                train.moe_enable_deepep,
                dispatch,
                own_moe,
            ),
        ]
    issues = [
        Issue(
            key,
            f"{key} configures {what}, and trainer.backend resolves to torch: it would be ignored",
            fix + megatron,
            value=value,
        )
        for key, value, is_set, what, fix in found
        if is_set
    ]
    return issues + _pipeline_stage_settings(ctx, megatron)


def _pipeline_stage_settings(ctx: PlanContext, megatron: str) -> list[Issue]:
    """Uneven pipeline stages given to trainer.backend=torch, which has none (under auto,
    a pp of 2 or more makes the trainer megatron's, and check_pipeline asks for one)."""
    if ctx.cfg.trainer.backend != "torch":
        return []
    if megatron and ctx.parallel.pp == 1:
        megatron += " with layout.train.pp >= 2"
    train, found = ctx.cfg.layout.train, []
    for field in ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"):
        value = getattr(train, field)
        if value is not None:
            key = f"layout.train.{field}"
            found.append(
                Issue(
                    key,
                    f"{key} configures megatron-core's pipeline stages, and trainer.backend is "
                    "torch: it would be ignored",
                    "remove it (the torch trainer has no pipeline stages: every rank holds 1/DP "
                    "of the model)" + megatron,
                    value=value,
                )
            )
    return found


def generic_model_issues(cfg: RunConfig) -> list[Issue]:
    """A generic model trains only where a trainer builds it from its HF config (the torch
    trainer, on CPU and on GPUs), whatever the layout, so the layout search asks before it
    enumerates."""
    model = cfg.model
    if model.family != GENERIC_FAMILY:
        return []
    backend = "torch" if cfg.trainer.backend == "auto" else cfg.trainer.backend
    shipped = "a model of a family megatron-core expresses (qwen3, llama, glm4, deepseek_v3, ...)"
    if backend not in GENERIC_TRAINERS:
        return [
            Issue(
                "trainer.backend",
                f"model {model.name} is family generic ({model.hf_architecture}): megatron-core "
                "has no layer spec for it, so the megatron trainer cannot build it",
                "set trainer.backend=torch (it loads the model with transformers), or use "
                + shipped,
                value=cfg.trainer.backend,
            )
        ]
    return []
