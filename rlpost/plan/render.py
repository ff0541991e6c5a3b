"""A plan as readable tables, or as JSON."""

from __future__ import annotations

import json
from collections.abc import Callable

from rlpost.backends.fp8_format import Fp8Format
from rlpost.plan.cost import StepCost
from rlpost.plan.engine_memory import RolloutMemory
from rlpost.plan.fsdp import FsdpTrainMemory
from rlpost.plan.loop import LoopPlan
from rlpost.plan.memory import gib_text
from rlpost.plan.model_args import format_value
from rlpost.plan.plan import Plan
from rlpost.plan.runtime import RuntimePlan
from rlpost.plan.table import Cell, format_cell, ranges, render_table
from rlpost.plan.work import SEND_WEIGHTS
from rlpost.schema.hardware import device_word
from rlpost.schema.run import OnSigterm

DERIVED_MARK = "*"


def _mark(plan: Plan, value: Cell, key: str) -> str:
    text = format_value(value) if isinstance(value, float) else format_cell(value)
    return f"{text}{DERIVED_MARK}" if plan.is_derived(key) else text


TRAINER_NAMES = {"megatron": "megatron-core", "torch": "torch (data parallel)"}
FSDP_TRAINER_NAME = "torch (FSDP2 over the data-parallel ranks)"


def _device(plan: Plan, count: int = 1) -> str:
    """What the plan's hardware calls a device (a GPU, or a device slot on kind cpu)."""
    return device_word(plan.hardware_kind, count)


def _count(n: int, noun: str) -> str:
    """'1 TP rank', '2 TP ranks'."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _shards(n: int) -> str:
    return "not sharded" if n == 1 else f"/{n} shards"


def _trainer_name(plan: Plan) -> str:
    if isinstance(plan.memory.train, FsdpTrainMemory):
        return FSDP_TRAINER_NAME
    return TRAINER_NAMES.get(plan.trainer_backend, plan.trainer_backend)


def _split(plan: Plan) -> tuple[str, str]:
    """Who has the devices, and what follows them: the trainer, or in mode=eval the train ranks
    (they load the weights and send them to the engines) or that none starts."""
    p = plan.placement
    trainer = _trainer_name(plan)
    train, rollout = _device(plan, p.train_gpus), _device(plan, p.rollout_gpus)
    if plan.trains:
        if p.colocate:
            return f"{p.train_gpus} {train} shared by training and rollout", f"trainer: {trainer}"
        return (
            f"{p.train_gpus} train + {p.rollout_gpus} rollout {_device(plan, 2)}",
            f"trainer: {trainer}",
        )
    if plan.starts_train_ranks:
        ranks = f"train ranks: {trainer}, to load the weights and send them to the engines once"
        if p.colocate:
            return f"{p.train_gpus} {train} shared by the engines and the train ranks", ranks
        return f"{p.rollout_gpus} engine + {p.train_gpus} train-rank {_device(plan, 2)}", ranks
    none = "no train rank starts (the engines load model.hf_checkpoint's weights)"
    if p.colocate:
        return f"{p.rollout_gpus} {rollout} for the engines", none
    return (
        f"{p.rollout_gpus} engine {rollout}",
        f"{none}; layout.train's {p.train_gpus} {train} idle",
    )


def render_header(plan: Plan) -> str:
    p = plan.placement
    mode = "colocated" if p.colocate else "decoupled"
    if not plan.trains:
        mode += " (mode=eval)"
    split, after = _split(plan)
    return (
        f"rlpost plan: model={plan.model} recipe={plan.recipe} hardware={plan.hardware} "
        f"(layout {plan.layout})\n"
        f"{mode}: {split} of {p.total_gpus} ({p.num_nodes} node(s) x {p.gpus_per_node}); "
        f"{after}\n"
        f"values marked {DERIVED_MARK} were derived by the planner (the layout left them null)"
    )


def render_placement(plan: Plan) -> str:
    p = plan.placement
    rows: list[list[Cell]] = []
    for node in range(p.num_nodes):
        ranks = [i for i, slot in enumerate(p.train_slots) if slot.node == node]
        gpus = [slot.gpu for slot in p.train_slots if slot.node == node]
        if ranks:
            role = "train" if plan.starts_train_ranks else "train (not started)"
            rows.append([role, f"ranks {ranges(ranks)}", node, ranges(gpus), "-"])
    for e in p.engines:
        for node in sorted({slot.node for slot in e.slots}):
            gpus = [slot.gpu for slot in e.slots if slot.node == node]
            ports = f"http {e.http_port}, nccl {e.nccl_port}"
            if e.dist_init_port is not None:
                ports += f", dist-init {e.dist_init_port}" if node == e.head_node else ""
            rows.append(
                [f"engine {e.index}", _count(len(e.slots), "TP rank"), node, ranges(gpus), ports]
            )
    if p.reward_slot is not None:
        rows.append(["reward model", "1 actor", p.reward_slot.node, p.reward_slot.gpu, "-"])
    whose = "trainer" if plan.trains else "train ranks'"  # mode=eval: they send weights
    title = f"Placement (router on node 0 port {p.router_port}" + (
        f", {whose} rendezvous {p.train_master_port}, weight updates {p.weight_update_port})"
        if plan.starts_train_ranks
        else ")"
    )
    return render_table(["role", "ranks", "node", _device(plan, 2), "ports"], rows, title)


def render_parallel(plan: Plan) -> str:
    par, k = plan.parallel, "layout.train."
    stages = plan.pipeline_stages
    optimizer = f"distributed over DP x CP = {par.optimizer_shards}"
    if not par.distributed_optimizer:
        optimizer = "replicated on every DP rank"
    train = plan.memory.train
    if isinstance(train, FsdpTrainMemory):
        where = (
            "on the host (FSDP2 CPU offload)" if train.cpu_offload else f"on the {_device(plan)}"
        )
        optimizer = f"FSDP2: weights, gradients, Adam sharded over {train.shards} ranks, {where}"
        if not train.reshard_after_forward:
            optimizer += "; layers kept gathered from forward to backward"
    rows: list[list[Cell]] = [
        [f"train {_device(plan, 2)}", _mark(plan, plan.placement.train_gpus, k + "num_gpus"), ""],
        ["TP (tensor)", _mark(plan, par.tp, k + "tp"), ""],
        ["SP (sequence)", _mark(plan, par.sequence_parallel, k + "sequence_parallel"), ""],
        ["PP (pipeline)", _mark(plan, par.pp, k + "pp"), f"layers per stage {list(stages)}"],
        ["CP (context)", _mark(plan, par.cp, k + "cp"), ""],
        ["EP (expert)", _mark(plan, par.ep, k + "ep"), ""],
        ["ETP (expert tensor)", _mark(plan, par.etp, k + "etp"), ""],
        ["DP (data)", _mark(plan, par.dp, k + "dp"), f"expert DP {par.expert_dp}"],
        [
            "recompute",
            _mark(plan, par.recompute, k + "recompute.granularity"),
            f"{par.recompute_method}, {par.recompute_num_layers} layer(s)",
        ],
        ["optimizer", optimizer, ""],
    ]
    if par.moe_token_dispatcher_type:
        deepep = ", DeepEP" if par.moe_enable_deepep else ""
        dispatcher = _mark(plan, par.moe_token_dispatcher_type, k + "moe_token_dispatcher_type")
        rows.append(["MoE dispatcher", dispatcher + deepep, ""])
    title = "Parallel layout" + ("" if plan.starts_train_ranks else " (no train rank starts)")
    return render_table(["training", "value", "note"], rows, title)


def render_engines(plan: Plan) -> str:
    eng, k = plan.engine, "layout.rollout."
    side = "rollout" if plan.trains else "engine"  # mode=eval: the engines evaluate
    rows: list[list[Cell]] = [
        [f"{side} {_device(plan, 2)}", _mark(plan, plan.placement.rollout_gpus, k + "num_gpus")],
        [
            f"{_device(plan, 2)} per engine (tp_size)",
            _mark(plan, eng.gpus_per_engine, k + "gpus_per_engine"),
        ],
        ["engines", eng.num_engines],
        ["attention TP x DP", f"{eng.attention_tp} x {eng.dp_size}"],
        ["SGLang EP", eng.ep_size],
    ]
    for name, value in eng.sglang:
        rows.append([f"sglang.{name}", _mark(plan, value, f"{k}sglang.{name}")])
    return render_table([f"{side}s" if side == "engine" else side, "value"], rows, "Engines")


def _micro_batch_tokens(plan: Plan) -> Cell:
    """The packing cap; a sample longer than it is trained whole in a micro-batch of its own
    (rlpost.algo.packing.pack_first_fit), which the row says beside the cap."""
    b = plan.batch
    cap = b.tokens_per_micro_batch
    if cap and b.longest_sample_tokens > cap:
        return f"{cap:,}; a longer sample alone, up to {b.longest_sample_tokens:,}"
    return cap


def render_batch(plan: Plan) -> str:
    """Training's batch arithmetic; in mode=eval, the evaluation sets in its place (no
    training rollout or optimizer step runs)."""
    if plan.generations:
        return render_eval_sets(plan)
    b = plan.batch
    rows: list[list[Cell]] = [
        ["prompts per rollout", b.rollout_batch_size],
        ["samples per prompt", b.n_samples_per_prompt],
        ["samples per rollout", b.samples_per_rollout],
        ["global batch (samples per optimizer step)", b.global_batch_size],
        ["optimizer steps per rollout", b.steps_per_rollout],
        ["rollouts / optimizer steps in all", f"{b.num_rollout} / {b.total_steps}"],
        ["samples per step per DP rank", b.samples_per_step_per_dp_rank],
        ["prompts per engine", format_value(b.prompts_per_engine)],
        ["samples per engine", format_value(b.samples_per_engine)],
        [f"max tokens per {_device(plan)}", b.max_tokens_per_gpu],
        ["tokens per micro-batch (x CP)", _micro_batch_tokens(plan)],
        ["longest sample (tokens)", b.longest_sample_tokens],
    ]
    if b.over_sampling_batch_size != b.rollout_batch_size:
        rows.insert(1, ["over-sampling batch (prompts)", b.over_sampling_batch_size])
    return render_table(["batch", "value"], rows, "Batch arithmetic")


def render_eval_sets(plan: Plan) -> str:
    """What each evaluation set makes the engines generate, one set after another: a set's
    prompts as its row slice counts them, else as assumed (rlpost.plan.generation)."""
    rows: list[list[Cell]] = [
        [
            g.name,
            f"{g.prompts} ({g.prompts_from.split(':')[0]})",
            g.samples // max(1, g.prompts),
            g.samples,
            g.prompt_tokens or "unset (counted 0)",
            g.response_tokens,
        ]
        for g in plan.generations
    ]
    header = ["evaluation set", "prompts", "samples per prompt", "samples", "prompt", "response"]
    return render_table(header, rows, "Evaluation sets (generated in turn; tokens at most)")


ENGINE_NAMES = {"sglang": "SGLang", "cpu": "rlpost CPU engine"}
SYNC_NAMES = {
    "disk": "disk (an HF folder the engines load)",
    "tensor": "tensor (CUDA IPC handles, same GPU)",
    "distributed": "distributed (broadcast group: NCCL on GPUs, gloo on CPU)",
}


LOOP_NAMES = {
    "sync": "sync (each rollout generated with the newest weights)",
    "async": "async (rollout N+1 generated while rollout N trains)",
    "fully_async": "fully_async (continuous generation into a bounded queue)",
}


def _ray_cluster(address: str | None, num_nodes: int) -> str:
    if address == "auto":
        return "joins the one this machine belongs to"
    if address:
        return f"joins the one at {address}"
    if num_nodes > 1:
        return f"joins RAY_ADDRESS (set it, or run.ray_address: {num_nodes} nodes)"
    return "joins RAY_ADDRESS when set, else a new one on this machine"


def _fp8(fp8: Fp8Format) -> str:
    blocks = (
        "one scale per row" if fp8.block_size is None else "blocks {}x{}".format(*fp8.block_size)
    )
    return f"FP8 e4m3 ({blocks})"


def _engine_weights(rt: RuntimePlan) -> str:
    if rt.fp8 is None:
        return "as trained (the checkpoint is not quantised)"
    return f"{_fp8(rt.fp8)}: each update quantised on the trainer"


def _rendezvous(rt: RuntimePlan) -> str:
    return "a file in the run directory" if rt.rendezvous == "file" else "TCP on rank 0's node"


def _requests(plan: Plan) -> str:
    rt = plan.runtime
    if rt.requests == "group":
        return f"one per group (its {plan.batch.n_samples_per_prompt} samples together)"
    return f"one per sample ({rt.requests_why})"


def _episodes(rt: RuntimePlan) -> list[list[Cell]]:
    """The generate function's time limit per call, where the run has a function of its own
    (rlpost.runtime.rollout.episode)."""
    if rt.generate_function is None:
        return []
    if rt.episode_timeout_s is None:
        limit = "unlimited (recipe.rollout.episode_timeout_s: null)"
    else:
        limit = f"{rt.episode_timeout_s:g} s, then the run stops"
    return [["a generate function call's own time (engine requests aside)", limit]]


def render_runtime(plan: Plan) -> str:
    if not plan.trains:
        return render_eval_runtime(plan)
    rt, loop = plan.runtime, plan.runtime.loop
    ahead = "unbounded" if loop.lookahead_steps is None else f"{loop.lookahead_steps} step(s)"
    rows: list[list[Cell]] = [
        ["engine backend", ENGINE_NAMES.get(rt.engine_backend, rt.engine_backend)],
        ["weight sync", SYNC_NAMES.get(rt.weight_sync, rt.weight_sync)],
        ["engine weights", _engine_weights(rt)],
        ["release memory around training", "yes" if rt.offload else "no"],
        ["train ranks meet through", _rendezvous(rt)],
        ["servers listen on", "loopback only" if rt.loopback_only else "each node's address"],
        ["Ray cluster", _ray_cluster(rt.ray_address, plan.placement.num_nodes)],
        ["generate requests", _requests(plan)],
        *_episodes(rt),
        [
            "loop",
            LOOP_NAMES.get(loop.mode, loop.mode)
            + ("; partial rollouts continue cut groups later" if loop.partial_rollout else ""),
        ],
        ["weights to the engines every", f"{loop.update_weights_interval} rollout(s)"],
        ["generation runs ahead of training by", ahead],
        [
            "staleness bound (policy versions)",
            f"{loop.max_staleness}, but for the tokens partial rollouts carry over (unbounded)"
            if loop.partial_rollout
            else loop.max_staleness,
        ],
        [
            "groups buffered ahead of the trainer",
            _buffered(loop),
        ],
    ]
    if loop.mode == "fully_async":
        rows.append(["a group past the bound is", f"{loop.stale_groups}d"])
    if loop.dynamic_sampling:
        rows.append(["a rollout's draws through the filter", _draw_limit(loop)])
    rows.append(["on SIGTERM (exit status 143)", SIGTERM_NAMES[rt.on_sigterm]])
    if rt.engine_backend == "cpu":
        rows.append(["engine CPU priority", _engine_priority(rt.engine_nice)])
    return render_table(["runtime", "value"], rows, "Runtime")


def _buffered(loop: LoopPlan) -> str:
    """The queue's bound and, where a whole draw can pass it, the most it holds."""
    most = loop.most_buffered_groups
    text = f"{loop.max_buffered_groups} (drawn {loop.draw_groups} at a time"
    if most != loop.max_buffered_groups:
        text += f", whole: {most} at most"
    return text + f"; {loop.queue_host_gib:.3f} GiB host memory at most)"


def _draw_limit(loop: LoopPlan) -> str:
    """How many draws a rollout may take to fill its batch through the dynamic sampling
    filter (rlpost.runtime.pipeline stops the run past them)."""
    if loop.max_draws_per_rollout is None:
        return "unlimited (rollout.max_draws_per_rollout: null)"
    prompts = loop.max_draws_per_rollout * loop.draw_groups
    return f"{loop.max_draws_per_rollout} ({prompts} prompts), then the run stops"


def _eval_requests(plan: Plan) -> str:
    rt = plan.runtime
    if rt.requests != "group":
        return f"one per sample ({rt.requests_why})"
    sizes = ", ".join(f"{g.name} {g.samples_per_prompt}" for g in plan.generations)
    return f"one per group (a set's samples per prompt together: {sizes})"


def _eval_weights(plan: Plan) -> str:
    """What reaches the engines before an evaluation (rlpost.plan.work.train_rank_work)."""
    rt = plan.runtime
    if plan.train_ranks == SEND_WEIGHTS:
        sync = SYNC_NAMES.get(rt.weight_sync, rt.weight_sync)
        return (
            "once, before the evaluation: the train ranks load them (run.resume's checkpoint "
            f"or model.load) and send them by {sync}"
        )
    return "none sent: the engines load model.hf_checkpoint's as they start"


def _eval_engine_weights(plan: Plan) -> str:
    fp8 = plan.runtime.fp8
    if fp8 is None:
        return "as loaded (the checkpoint is not quantised)"
    if plan.train_ranks == SEND_WEIGHTS:
        return f"{_fp8(fp8)}: quantised on the train ranks before they are sent"
    return f"{_fp8(fp8)}: model.hf_checkpoint's, as it holds them"


def render_eval_runtime(plan: Plan) -> str:
    """mode=eval: the sets generated once, no loop; weights sent once or not at all; a
    SIGTERM or Ctrl-C ends it at once, with nothing to save (rlpost.runtime.loop,
    rlpost.runtime.train)."""
    rt = plan.runtime
    rows: list[list[Cell]] = [
        ["engine backend", ENGINE_NAMES.get(rt.engine_backend, rt.engine_backend)],
        ["weights to the engines", _eval_weights(plan)],
        ["engine weights", _eval_engine_weights(plan)],
    ]
    if plan.train_ranks == SEND_WEIGHTS:
        rows.append(["train ranks meet through", _rendezvous(rt)])
    rows += [
        ["servers listen on", "loopback only" if rt.loopback_only else "each node's address"],
        ["Ray cluster", _ray_cluster(rt.ray_address, plan.placement.num_nodes)],
        ["generate requests", _eval_requests(plan)],
        *_episodes(rt),
        [
            "evaluation",
            f"once: each set in turn, its groups sent together, {rt.max_concurrency} samples "
            "in flight at most over all engines (recipe.rollout.max_concurrency); each "
            "generated and scored once (no filter, over-sampling or partial rollout)",
        ],
        [
            "on SIGTERM (exit status 143) or Ctrl-C (130)",
            "stop at once: nothing is saved or logged (the sets' metrics are logged when all "
            "are done); launch it again to evaluate anew",
        ],
    ]
    return render_table(["runtime", "value"], rows, "Runtime (mode=eval)")


SIGTERM_NAMES: dict[OnSigterm, str] = {
    "save": "save every finished rollout, then stop (a second SIGTERM: at once)",
    "stop": "stop at once, keeping the checkpoints saved so far",
}


def _engine_priority(nice: int) -> str:
    if not nice:
        return "the trainers' own"
    return (
        f"below the trainers' (niceness +{nice}): generation runs ahead on a shared CPU, "
        "training is the critical path"
    )


REFERENCE_RUNS = {
    "loss": "every rollout (its KL weighs in the loss)",
    "reward": "every rollout (its KL goes into the reward)",
    "metric": "every {n} rollout(s), to log the KL (it weighs nothing)",
    "off": "never: not loaded (nothing reads its KL)",
}


PROMPTS = {
    True: "packed once per micro-batch, its samples' responses attending to that copy",
    False: "packed with each of its samples",
}


def _flops(tflop: float) -> str:
    for unit, scale in (("EFLOP", 1e6), ("PFLOP", 1e3)):
        if tflop >= scale:
            return f"{tflop / scale:.3g} {unit}"
    return f"{tflop:.3g} TFLOP"


def render_work(plan: Plan) -> str:
    w = plan.work
    if not plan.trains:
        what = (
            "load the weights and send them to the engines once; no train step, no "
            "logprob or reference forward"
            if plan.starts_train_ranks
            else "none start (the engines load model.hf_checkpoint's weights themselves)"
        )
        rows: list[list[Cell]] = [["the train ranks", what]]
        return render_table(["train ranks", "value"], rows, "Train ranks (mode=eval)")
    old = (
        "from the training forward (one optimizer step per rollout)"
        if w.reuse_old_logprobs
        else f"a forward before training ({w.steps_per_rollout} optimizer steps per rollout)"
        if w.steps_per_rollout > 1
        else "a forward before training (the KL in the reward needs them first)"
    )
    passes = f"{w.passes_per_rollout:.2f}"
    if w.saved_fraction > 0:
        passes += (
            f" ({w.passes_every_forward:.0f} if the old-policy and reference forwards ran "
            f"every rollout: {w.saved_fraction:.0%} less)"
        )
    rows = [
        ["reference model runs", REFERENCE_RUNS[w.reference].format(n=w.reference_interval)],
        ["old-policy logprobs", old],
        ["forward-equivalents per token", passes],
        ["a group's prompt", PROMPTS[w.share_prompts]],
        ["train compute per rollout (longest samples)", _flops(w.train_tflop_per_rollout)],
        [
            "predicted, logged beside the measured",
            f"{plan.prediction.train_s:.3g} s per rollout (perf/train_time_vs_plan), "
            f"{plan.prediction.memory_gib:.2f} GiB per {_device(plan)} (perf/memory_vs_plan)"
            + _unseen_overhead(plan),
        ],
    ]
    return render_table(["trainer work", "value"], rows, "Trainer work per rollout")


def _unseen_overhead(plan: Plan) -> str:
    """The memory prediction is what torch's allocator sees: the training total less the CUDA
    context and workspaces (rlpost.plan.prediction), which the line says when it differs."""
    overhead = plan.memory.train.overhead_gib
    if not overhead:
        return ""
    total = plan.memory.train.total_gib
    return (
        f": the memory table's {total:.2f} less its {overhead:.2f} of CUDA context and "
        "workspaces, which the allocator does not see"
    )


def param_count(n: float) -> str:
    """4.02B, 3.15M, 850.0K: a tiny model's count in its own unit, not 0.00B."""
    for unit, size in (("B", 1e9), ("M", 1e6)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return f"{n / 1e3:.1f}K"


def _verdict(fits: bool, margin: float) -> str:
    if fits:
        return f"fits, {margin:.2f} GiB spare"
    return f"DOES NOT FIT, short by {gib_text(-margin)}"


def _kv_cache_row(r: RolloutMemory, device: str) -> list[Cell]:
    if r.kv_cache_gib < 0:  # the weights alone overfill what the engine may hold
        return [f"KV cache (none: the weights exceed the pool by {gib_text(-r.kv_cache_gib)})", 0.0]
    return [
        f"KV cache ({r.kv_cache_tokens_per_gpu:,} tokens/{device}, "
        f"{r.kv_cache_tokens_per_engine:,}/engine)",
        r.kv_cache_gib,
    ]


def _fsdp_state_rows(t: FsdpTrainMemory) -> list[list[Cell]]:
    """The torch trainer's FSDP2 shards (1/shards of the model each) and what it gathers."""
    where = " (on the host: FSDP2 CPU offload)" if t.cpu_offload else ""
    shard = f"fp32 shard, 1/{t.shards}{where}"
    return [
        [f"weights ({shard})", t.weights_gib],
        [f"gradients ({shard})", t.grads_gib],
        [f"optimizer (Adam moments, {shard})", t.optimizer_gib],
        [
            "gathered: root, "
            + ("2 layers" if t.reshard_after_forward else "every layer")
            + ", a layer's gradients",
            t.gathered_gib,
        ],
        [
            f"reference model ({'on the host' if t.cpu_offload else f'shard, 1/{t.shards}'})",
            t.reference_gib,
        ],
    ]


def _pool(plan: Plan) -> str:
    return "static pool" if plan.hardware_kind == "gpu" else "the CPU engine's share"


def _grouped_experts_row(gib: float) -> list[list[Cell]]:
    return [["grouped experts (one layer's stacked weights)", gib]] if gib else []


def render_memory(plan: Plan) -> str:
    m, par = plan.memory, plan.parallel
    t = m.train
    offload = " (on the host: CPU offload)" if t.host_optimizer_gib else ""
    state_rows: list[list[Cell]] = [
        ["weights", t.weights_gib],
        ["gradients (fp32 main grads)", t.grads_gib],
        [f"optimizer (master + Adam, {_shards(par.optimizer_shards)}){offload}", t.optimizer_gib],
    ]
    if isinstance(t, FsdpTrainMemory):
        state_rows = _fsdp_state_rows(t)
    context = "CUDA context, workspaces" + (", engine residue" if plan.placement.colocate else "")
    if plan.train_ranks == SEND_WEIGHTS:  # mode=eval: the weights and their way out, no step
        state_rows = [state_rows[0]]
        train_rows: list[list[Cell]] = [
            *state_rows,
            ["weight bucket on its way to the engines (and its flat copy)", t.weight_bucket_gib],
            [context, t.overhead_gib],
            ["total", t.total_gib],
        ]
        return _memory_tables(plan, train_rows, "train ranks (load and send weights)")
    train_rows = [
        *state_rows,
        [f"activations ({par.recompute} recompute, {t.tokens_per_gpu} tokens)", t.activations_gib],
        ["log-prob kernel (no whole logits)", t.logits_gib],
        *_grouped_experts_row(t.grouped_experts_gib),
        [context, t.overhead_gib],
        ["total", t.total_gib],
    ]
    return _memory_tables(plan, train_rows, "training" if plan.trains else "train ranks")


def _residue(plan: Plan) -> str:
    """What the train ranks leave on a colocated engine's device."""
    if plan.train_ranks == SEND_WEIGHTS:
        return "train ranks' weights (colocated, mode=eval)"
    if not plan.starts_train_ranks:
        return "train ranks (none start, mode=eval)"
    return "trainer residue (colocated)"


def _memory_tables(plan: Plan, train_rows: list[list[Cell]], side: str) -> str:
    m = plan.memory
    t, r, h = m.train, m.rollout, m.host
    if m.fp8_update_buffer_gib:
        train_rows.append(
            ["weight sync (no activations; + FP8 quantisation buffer)", m.weight_sync_gib]
        )
    rollout_rows: list[list[Cell]] = [
        ["weight shard", r.weights_gib],
        _kv_cache_row(r, _device(plan)),
        ["CUDA context", r.context_gib],
        [
            f"{_pool(plan)} ({r.mem_fraction_static} x {m.gpu_gib})",
            r.mem_fraction_static * m.gpu_gib,
        ],
        ["prefill activations, CUDA graphs", r.activation_reserve_gib],
        [_residue(plan), r.trainer_residual_gib],
        ["peak", r.total_gib],
    ]
    offloaded = "FSDP2 shards and reference" if isinstance(t, FsdpTrainMemory) else "optimizer"
    host_rows: list[list[Cell]] = [
        [f"offloaded {offloaded} ({_count(h.ranks_per_node, 'rank')})", h.optimizer_gib],
        ["reference weights", h.reference_weights_gib],
    ]
    if not plan.trains:  # mode=eval keeps no optimizer or reference (0.00 in its plan)
        host_rows = [row for row in host_rows if row[1]]
    host_rows += [["processes", h.processes_gib], ["total", h.total_gib]]
    engines = "rollout" if plan.trains else "engines"
    device = _device(plan)
    parts = [
        render_table(
            [f"{side}, per {device}", "GiB"],
            train_rows,
            f"Memory ({device} {m.gpu_gib} GiB; {param_count(m.params_total)} parameters, "
            f"{param_count(m.params_active)} active)\n{side}, stage {t.stage}: "
            + (
                _verdict(m.train_fits, m.train_margin_gib)
                if plan.starts_train_ranks
                else "not run (mode=eval of model.hf_checkpoint's weights: no train rank)"
            ),
        ),
        render_table(
            [
                f"{engines}, per {device}" if not plan.trains else f"rollout, per engine {device}",
                "GiB",
            ],
            rollout_rows,
            f"{engines}: {_verdict(m.rollout_fits, m.rollout_margin_gib)}",
        ),
        render_table(
            ["host, per node", "GiB"],
            host_rows,
            f"host ({h.host_gib} GiB): {_verdict(m.host_fits, m.host_margin_gib)}",
        ),
    ]
    fits = m.fits if plan.starts_train_ranks else m.rollout_fits
    verdict = "the run fits" if fits else "the run DOES NOT FIT"
    return "\n\n".join(parts) + f"\n\nVerdict: {verdict}"


SECTIONS: tuple[Callable[[Plan], str], ...] = (
    render_header,
    render_placement,
    render_parallel,
    render_engines,
    render_batch,
    render_runtime,
    render_work,
    render_memory,
)


def _parts(plan: Plan, cost: StepCost) -> str:
    """A candidate's predicted time by part; in mode=eval generation and the weight push (no
    train step or offload)."""
    if not plan.trains:
        return f"generation {cost.rollout.total_s:.2f}, weight sync {cost.sync_s:.2f}"
    return (
        f"rollout {cost.rollout.total_s:.2f}, train {cost.train.total_s:.2f}, weight sync "
        f"{cost.sync_s:.2f}, offload {cost.offload_s:.2f}"
    )


def render_search(plan: Plan) -> str:
    """layout=auto: the choice, the runners-up, what lost and why, the shipped layout."""
    search = plan.search
    assert search is not None and search.chosen is not None
    chosen = search.chosen
    per = "rollout" if plan.trains else "evaluation"  # mode=eval: the whole evaluation
    lines = [
        f"Layout search (layout=auto): {search.enumerated} candidates, {search.feasible} pass "
        f"every check and fit, searched in {search.seconds:.2f} s",
        f"  chosen: {chosen.describe()}",
        f"          {chosen.step_s:.2f} s per {per} predicted ({_parts(plan, chosen.cost)}); "
        f"{chosen.memory_text()}",
    ]
    # an evaluation that starts no train rank depends on its engines alone
    side = "train" if plan.starts_train_ranks else "engine"
    rows: list[list[Cell]] = [
        [
            i + 2,
            f"{c.step_s:.2f}",
            f"{(c.train if side == 'train' else c.rollout).memory.total_gib:.1f}",
            c.describe(),
        ]
        for i, c in enumerate(search.ranked[1:])
    ]
    if rows:
        header = ["rank", f"s/{per}", f"{side} GiB", "layout"]
        lines.append(render_table(header, rows, "  runners-up"))
        lines += _ties(plan)
    if search.rejected:
        lines.append("  rejected:")
        for r in search.rejected:
            timing = f" (would take {r.step_s:.2f} s)" if r.step_s is not None else ""
            lines.append(f"    - {r.description}{timing}: {r.reason}")
    ref = search.reference
    if ref is not None:
        rated = f"{ref.step_s:.2f} s per {per}" if ref.step_s is not None else "not rated"
        rank = f", rank {ref.rank} of {search.feasible}" if ref.rank else ""
        lines.append(f"  shipped layout {ref.name}: {ref.description}; {rated}{rank}")
        lines.append(f"    {ref.reason}")
    lines.append(
        "  predicted times come from rlpost/plan/cost.py's model: they rank layouts, they do "
        "not promise wall-clock time"
    )
    return "\n".join(lines)


def _ties(plan: Plan) -> list[str]:
    """Runners-up the cost model cannot tell from the choice (equal to 10 ms, the search's
    resolution): it charges a collective the bytes it moves, not the call, so a split that
    moves little costs nothing; say so rather than let their rank read as a measurement."""
    search = plan.search
    assert search is not None and search.chosen is not None
    chosen = round(search.chosen.step_s, 2)
    tied = [i + 2 for i, c in enumerate(search.ranked[1:]) if round(c.step_s, 2) == chosen]
    if not tied:
        return []
    ranks = f"rank {tied[0]}" if len(tied) == 1 else f"ranks {tied[0]}-{tied[-1]}"
    lines = [
        f"  {ranks} {'ties' if len(tied) == 1 else 'tie'} with the choice to 10 ms: the cost "
        "model charges collectives by the bytes they move, not per call, so it cannot tell "
        "them apart; the choice has the fewest model-parallel splits"
    ]
    split = any(
        search.ranked[r - 1].parallel.tp * search.ranked[r - 1].parallel.cp > 1 for r in tied
    )
    if plan.hardware_kind == "cpu" and split:
        lines.append(
            "  on device slots a layout that splits the model trains with megatron-core over "
            "gloo (trainer.backend=auto), which the figures rate as the torch trainer: the CPU "
            "default's 60 rollouts took 94 s with megatron-core, 30 s with the torch trainer"
        )
    return lines


def render_tables(plan: Plan) -> str:
    text = "\n\n".join(section(plan) for section in SECTIONS)
    if plan.search is not None:
        text = render_search(plan) + "\n\n" + text
    if plan.notes:
        text += "\n\nNotes:\n" + "\n".join(f"  - {note}" for note in plan.notes)
    return text + "\n"


def render_json(plan: Plan) -> str:
    return json.dumps(plan.to_dict(), indent=2) + "\n"


RENDERERS: dict[str, Callable[[Plan], str]] = {"table": render_tables, "json": render_json}


def render_plan(plan: Plan, fmt: str = "table") -> str:
    """`fmt` is plan.format: 'table' (readable) or 'json'."""
    try:
        renderer = RENDERERS[fmt]
    except KeyError:
        raise ValueError(
            f"unknown plan format {fmt!r}; choose one of {sorted(RENDERERS)}"
        ) from None
    return renderer(plan)
