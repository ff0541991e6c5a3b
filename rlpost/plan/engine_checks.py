"""Rules for engines and batches (registered into the same table as the training rules)."""

from __future__ import annotations

import math

from rlpost.errors import Issue
from rlpost.plan.checks import PlanContext, check, divisors
from rlpost.plan.placement import engine_offset, misplaced_engines
from rlpost.schema.recipe import prompts_filling_steps


@check("engine_divides_rollout", scope="engine")
def check_engine_divides_rollout(ctx: PlanContext) -> list[Issue]:
    size, gpus = ctx.engine.gpus_per_engine, ctx.sizes.rollout_gpus
    if gpus and gpus % size:
        return [
            Issue(
                "layout.rollout.gpus_per_engine",
                f"{gpus} rollout {ctx.devices(gpus)} {'does' if gpus == 1 else 'do'} not split "
                f"into engines of {size} {ctx.devices(size)}",
                f"use an engine size that divides {gpus}: {', '.join(map(str, divisors(gpus)))}",
                size,
            )
        ]
    return []


@check("engine_nodes", scope="engine")
def check_engine_nodes(ctx: PlanContext) -> list[Issue]:
    hw, size, s = ctx.cfg.hardware, ctx.engine.gpus_per_engine, ctx.sizes
    if not s.rollout_gpus or s.rollout_gpus % size:
        return []
    offset = engine_offset(s.colocate, s.train_gpus)
    bad = misplaced_engines(offset, size, s.rollout_gpus // size, hw.gpus_per_node)
    if not bad:
        return []
    first = offset + bad[0] * size
    if size > hw.gpus_per_node:
        why = (
            f"an engine of {size} {ctx.devices(size)} spans nodes of {hw.gpus_per_node}, so it "
            f"must cover whole nodes from a node boundary; engine {bad[0]} starts at "
            f"{ctx.devices(1)} "
            f"{first % hw.gpus_per_node} of node {first // hw.gpus_per_node}"
        )
        fix = (
            f"use a multiple of {hw.gpus_per_node} {ctx.devices(2)} per engine, and whole "
            "train nodes"
        )
    else:
        why = (
            f"engine {bad[0]} would take {ctx.devices(2)} {first}..{first + size - 1}, crossing "
            "from node "
            f"{first // hw.gpus_per_node} to node {(first + size - 1) // hw.gpus_per_node}; "
            "an engine that fits in a node keeps its TP group inside one"
        )
        fix = (
            f"use an engine size dividing {hw.gpus_per_node}, or make layout.train.num_gpus a "
            f"multiple of {size}"
        )
    return [Issue("layout.rollout.gpus_per_engine", why, fix, size)]


@check("engine_heads", scope="engine")
def check_engine_heads(ctx: PlanContext) -> list[Issue]:
    model, attention_tp = ctx.cfg.model, ctx.engine.attention_tp
    heads, groups = model.num_attention_heads, model.num_query_groups
    split = "attention TP (gpus_per_engine / dp_size)" if ctx.engine.dp_size > 1 else "engine TP"
    if heads % attention_tp:
        return [
            Issue(
                "layout.rollout.gpus_per_engine",
                f"SGLang splits the {heads} attention heads over the {split} of {attention_tp} "
                f"{ctx.devices(attention_tp)}, which does not divide them",
                f"use an attention TP that divides {heads}: {', '.join(map(str, divisors(heads)))}",
                ctx.engine.gpus_per_engine,
            )
        ]
    if model.mla is None and groups % attention_tp and attention_tp % groups:
        return [
            Issue(
                "layout.rollout.gpus_per_engine",
                f"SGLang needs the {groups} KV heads to split over, or replicate evenly across, "
                f"the {split} of {attention_tp} GPUs",
                f"use an attention TP that divides {groups} or is a multiple of it",
                ctx.engine.gpus_per_engine,
            )
        ]
    return []


@check("dp_attention", scope="engine")
def check_dp_attention(ctx: PlanContext) -> list[Issue]:
    options, size = ctx.engine.options, ctx.engine.gpus_per_engine
    dp_size = int(options.get("dp_size") or 1)
    if dp_size > 1 and not options.get("enable_dp_attention"):
        return [
            Issue(
                "layout.rollout.sglang.dp_size",
                f"dp_size={dp_size} without enable_dp_attention makes SGLang start {dp_size} "
                f"replicas of {size} GPUs each inside one engine, {dp_size * size} GPUs in all",
                "add layout.rollout.sglang.enable_dp_attention: true, or remove dp_size "
                "(more engines are the way to replicate)",
                dp_size,
            )
        ]
    if options.get("enable_dp_lm_head") and not options.get("enable_dp_attention"):
        return [
            Issue(
                "layout.rollout.sglang.enable_dp_lm_head",
                "it splits the LM head over the dp-attention groups, and enable_dp_attention "
                "is off: SGLang refuses the pair (an assertion in its server arguments) while "
                "the engines start, after the trainers have loaded",
                "remove enable_dp_lm_head, or set enable_dp_attention: true with a dp_size "
                f"that divides {size}",
                True,
            )
        ]
    if options.get("enable_dp_attention") and size % dp_size:
        return [
            Issue(
                "layout.rollout.sglang.dp_size",
                f"dp-attention splits each engine's {size} GPUs into dp_size={dp_size} "
                "attention groups, which does not divide them",
                f"use a dp_size that divides {size}: {', '.join(map(str, divisors(size)))}",
                dp_size,
            )
        ]
    return []


@check("sglang_expert_parallel", scope="engine")
def check_sglang_expert_parallel(ctx: PlanContext) -> list[Issue]:
    ep_size, size, moe = ctx.engine.ep_size, ctx.engine.gpus_per_engine, ctx.cfg.model.moe
    if ep_size == 1:
        return []
    if moe is None:
        return [
            Issue(
                "layout.rollout.sglang.ep_size",
                f"expert parallelism needs MoE experts, and {ctx.cfg.model.name} is dense",
                "remove layout.rollout.sglang.ep_size",
                ep_size,
            )
        ]
    if size % ep_size:
        return [
            Issue(
                "layout.rollout.sglang.ep_size",
                f"SGLang places the experts on ep_size={ep_size} of an engine's {size} GPUs "
                "(ep_size must divide tp_size)",
                f"use an ep_size dividing {size}: {', '.join(map(str, divisors(size)))}",
                ep_size,
            )
        ]
    return []


@check("global_batch_over_dp", scope="train")
def check_global_batch_over_dp(ctx: PlanContext) -> list[Issue]:
    gbs, dp = ctx.cfg.recipe.train.global_batch_size, ctx.parallel.dp
    if gbs % dp:
        return [
            Issue(
                "recipe.train.global_batch_size",
                f"each optimizer step spreads global_batch_size={gbs} samples over dp={dp} "
                "data-parallel ranks, and they do not divide evenly",
                _batch_for_dp_fix(ctx, gbs, dp),
                gbs,
            )
        ]
    return []


def _batch_for_dp_fix(ctx: PlanContext, gbs: int, dp: int) -> str:
    """A global batch that dp splits and that still divides a rollout's samples (validation
    has made gbs divide them): the nearest such multiples of dp, or, where no multiple of dp
    divides a rollout's samples, the nearest multiple of dp and of the group size, with a
    rollout that fills it."""
    rollout = ctx.cfg.recipe.rollout
    prompts, n = rollout.batch_size, rollout.n_samples_per_prompt
    samples = prompts * n
    fits = [d for d in divisors(samples) if d % dp == 0]
    if fits:
        below = [d for d in fits if d < gbs][-1:]
        above = [d for d in fits if d > gbs][:1]
        nearest = " or ".join(map(str, below + above))
        return (
            f"use a multiple of {dp} that divides the {samples} samples a rollout makes "
            f"(e.g. {nearest}), or change the data-parallel size"
        )
    # a multiple of both dp and n: whole groups fill each step
    unit = math.lcm(dp, n)
    batch = max(1, round(gbs / unit)) * unit
    step_prompts = batch // n
    filled = max(1, round(prompts / step_prompts)) * step_prompts
    return (
        f"no multiple of {dp} divides the {samples} samples a rollout makes (rollout.batch_size "
        f"x rollout.n_samples_per_prompt = {prompts} x {n}): set "
        f"recipe.train.global_batch_size: {batch} with recipe.rollout.batch_size: "
        f"{prompts_filling_steps(filled, n, batch)}, or change the data-parallel size to a "
        f"divisor of {gbs}"
    )


@check("micro_batch_within_step", scope="train")
def check_micro_batch_within_step(ctx: PlanContext) -> list[Issue]:
    train, dp = ctx.cfg.recipe.train, ctx.parallel.dp
    per_rank = train.global_batch_size // dp
    if train.use_dynamic_batch_size or not per_rank or train.micro_batch_size <= per_rank:
        return []
    return [
        Issue(
            "recipe.train.micro_batch_size",
            f"a micro-batch of {train.micro_batch_size} samples is more than a DP rank gets per "
            f"optimizer step (global_batch_size {train.global_batch_size} / dp {dp} = "
            f"{per_rank}): every micro-batch holds {per_rank}, and the memory plan is sized "
            "for samples that never come",
            f"set recipe.train.micro_batch_size <= {per_rank} (a divisor, e.g. "
            f"{max(d for d in divisors(per_rank) if d <= min(per_rank, 8))}), or raise "
            "global_batch_size",
            train.micro_batch_size,
        )
    ]


@check("rollout_feeds_engines", scope="engine")
def check_rollout_feeds_engines(ctx: PlanContext) -> list[Issue]:
    rollout, engines = ctx.cfg.recipe.rollout, ctx.engine.num_engines
    samples = rollout.batch_size * rollout.n_samples_per_prompt
    if engines and samples < engines:
        return [
            Issue(
                "recipe.rollout.batch_size",
                f"a rollout of {rollout.batch_size} prompts x {rollout.n_samples_per_prompt} "
                f"samples = {samples} requests cannot keep {engines} engines busy",
                f"raise recipe.rollout.batch_size to at least "
                f"{-(-engines // rollout.n_samples_per_prompt)}, or use fewer, larger engines",
                rollout.batch_size,
            )
        ]
    return []


@check("cpu_slots", scope="engine")
def check_cpu_slots(ctx: PlanContext) -> list[Issue]:
    if ctx.cfg.hardware.kind != "cpu":
        return []
    issues = []
    if ctx.engine.gpus_per_engine > 1:
        issues.append(
            Issue(
                "layout.rollout.gpus_per_engine",
                "the CPU engine runs in one device slot and has no tensor parallelism",
                "set layout.rollout.gpus_per_engine: 1 (or remove it)",
                ctx.engine.gpus_per_engine,
            )
        )
    return issues
