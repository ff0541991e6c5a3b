"""The Plan: everything a run will do on its hardware, derived once from a validated config."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import rlpost.plan.engine_checks  # registers the engine and batch rules
import rlpost.plan.engine_options  # noqa: F401  (registers the SGLang option rules)
from rlpost.errors import UserError
from rlpost.plan.backends import as_computed, resolve_trainer_backend
from rlpost.plan.batch import BatchPlan, plan_batch
from rlpost.plan.checks import PlanContext, run_checks
from rlpost.plan.engine_memory import (
    GIB,
    TRAINER_RESIDUAL_GIB,
    estimate_rollout,
    longest_request,
)
from rlpost.plan.fsdp import (
    FSDP_MOE_NOTE,
    FSDP_NOTE,
    FsdpTrainMemory,
    estimate_sender,
    estimate_trainer,
)
from rlpost.plan.generation import Generation, eval_generations
from rlpost.plan.layout import EngineLayout, ParallelLayout, Sizes
from rlpost.plan.loop import LoopPlan
from rlpost.plan.memory import (
    GENERIC_MEMORY_NOTE,
    MemoryPlan,
    TrainMemory,
    estimate_host,
    fp8_update_buffer_bytes,
    pipeline_stages,
)
from rlpost.plan.notes import (
    clip_notes,
    idle_gpu_notes,
    idle_train_gpu_notes,
    inert_setting_notes,
    mtp_notes,
    pipeline_balance_notes,
    save_notes,
)
from rlpost.plan.parallel import Resolution, resolve_layout
from rlpost.plan.params import count_params
from rlpost.plan.placement import Placement, plan_placement
from rlpost.plan.prediction import TrainPrediction, predict_train
from rlpost.plan.runtime import RuntimePlan, plan_runtime
from rlpost.plan.work import (
    NO_TRAIN_RANK,
    SEND_WEIGHTS,
    TRAIN,
    TrainWork,
    plan_work,
    skipped_rules,
    train_rank_work,
)
from rlpost.schema import GENERIC_FAMILY, RewardConfig, RunConfig
from rlpost.schema.evaluation import EvalConfig
from rlpost.schema.hardware import device_word
from rlpost.schema.prompt_file import split_prompt_path
from rlpost.schema.training_only import set_training_only

if TYPE_CHECKING:
    from rlpost.plan.candidates import LayoutSearch


@dataclass(frozen=True)
class Plan:
    """Placement, parallel layout, engines, batch arithmetic and memory of one run.

    `derived` lists the config key paths the planner filled in (null in the layout); `notes`
    are facts a user should know that are not errors.
    """

    model: str
    recipe: str
    hardware: str
    layout: str
    hardware_kind: str
    trainer_backend: str
    placement: Placement
    parallel: ParallelLayout
    engine: EngineLayout
    batch: BatchPlan
    memory: MemoryPlan
    runtime: RuntimePlan
    work: TrainWork
    prediction: TrainPrediction
    pipeline_stages: tuple[int, ...]
    derived: tuple[str, ...]
    notes: tuple[str, ...]
    # layout=auto: the search that chose this layout (rlpost.plan.candidates.LayoutSearch)
    search: LayoutSearch | None = None
    # what the train ranks do (rlpost.plan.work.train_rank_work): train; in mode=eval, send
    # the weights they load to the engines (the memory counts that alone), or start at all
    # (model.hf_checkpoint's own weights: the training side is shown, neither checked nor
    # held to the hardware)
    train_ranks: str = TRAIN
    # mode=eval: the evaluation sets as the engines generate them (rlpost.plan.generation),
    # shown in place of training's batch arithmetic; empty in training
    generations: tuple[Generation, ...] = ()

    @property
    def trains(self) -> bool:
        return self.train_ranks == TRAIN

    @property
    def starts_train_ranks(self) -> bool:
        return self.train_ranks != NO_TRAIN_RANK

    def is_derived(self, key: str) -> bool:
        return key in self.derived

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: plain types, floats rounded to 3 decimals."""
        data: dict[str, Any] = _rounded(
            {
                "run": {
                    "model": self.model,
                    "recipe": self.recipe,
                    "hardware": self.hardware,
                    "layout": self.layout,
                    "hardware_kind": self.hardware_kind,
                    "trainer_backend": self.trainer_backend,
                },
                "placement": _placement_dict(self.placement),
                "parallel": _parallel_dict(self.parallel, self.pipeline_stages),
                "engine": _engine_dict(self.engine),
                "batch": asdict(self.batch),
                "memory": _memory_dict(self.memory),
                "runtime": asdict(self.runtime),
                "work": {**asdict(self.work), "saved_fraction": self.work.saved_fraction},
                "prediction": asdict(self.prediction),
                "derived": list(self.derived),
                "notes": list(self.notes),
            }
        )
        if self.generations:
            data["evaluation"] = [asdict(g) for g in self.generations]
        if self.search is not None:
            data["search"] = self.search.to_dict()
        return data


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(item) for item in value]
    return value


def _placement_dict(p: Placement) -> dict[str, Any]:
    return {
        "colocate": p.colocate,
        "num_nodes": p.num_nodes,
        "gpus_per_node": p.gpus_per_node,
        "total_gpus": p.total_gpus,
        "train_gpus": p.train_gpus,
        "rollout_gpus": p.rollout_gpus,
        "gpus_per_engine": p.gpus_per_engine,
        "num_engines": p.num_engines,
        "train_ranks": [[slot.node, slot.gpu] for slot in p.train_slots],
        "reward_model": None if p.reward_slot is None else [p.reward_slot.node, p.reward_slot.gpu],
        "engines": [
            {
                "index": e.index,
                "gpus": [[slot.node, slot.gpu] for slot in e.slots],
                "http_port": e.http_port,
                "nccl_port": e.nccl_port,
                "dist_init_port": e.dist_init_port,
            }
            for e in p.engines
        ],
        "router_port": p.router_port,
        "train_master_port": p.train_master_port,
        "weight_update_port": p.weight_update_port,
    }


def _parallel_dict(par: ParallelLayout, stages: tuple[int, ...]) -> dict[str, Any]:
    data = asdict(par)
    data["sp"] = data.pop("sequence_parallel")
    data["expert_dp"] = par.expert_dp
    data["optimizer_shards"] = par.optimizer_shards
    data["layers_per_stage"] = list(stages)
    return data


def _engine_dict(engine: EngineLayout) -> dict[str, Any]:
    return {
        "gpus_per_engine": engine.gpus_per_engine,
        "num_engines": engine.num_engines,
        "attention_tp": engine.attention_tp,
        "dp_size": engine.dp_size,
        "ep_size": engine.ep_size,
        "mem_fraction_static": engine.mem_fraction_static,
        "sglang": engine.options,
    }


def _memory_dict(m: MemoryPlan) -> dict[str, Any]:
    return {
        "gpu_gib": m.gpu_gib,
        "fits": m.fits,
        "train_fits": m.train_fits,
        "rollout_fits": m.rollout_fits,
        "host_fits": m.host_fits,
        "train_gib_per_gpu": m.train.total_gib,
        "train_margin_gib": m.train_margin_gib,
        "weight_sync_gib_per_gpu": m.weight_sync_gib,
        "fp8_update_buffer_gib": m.fp8_update_buffer_gib,
        "rollout_weights_gib_per_gpu": m.rollout.weights_gib,
        "rollout_gib_per_gpu": m.rollout.total_gib,
        "rollout_margin_gib": m.rollout_margin_gib,
        "kv_cache_tokens_per_engine": m.rollout.kv_cache_tokens_per_engine,
        "host_gib_per_node": m.host.total_gib,
        "host_margin_gib": m.host_margin_gib,
        "params_total": m.params_total,
        "params_active": m.params_active,
        "train": asdict(m.train),
        "rollout": asdict(m.rollout),
        "host": asdict(m.host),
    }


def _notes(
    cfg: RunConfig,
    plan_parts: tuple[ParallelLayout, BatchPlan, EngineLayout, MemoryPlan],
    loop_plan: LoopPlan,
) -> tuple[str, ...]:
    par, batch, engine, memory = plan_parts
    notes: list[str] = []
    # what only training does (its reference, steps, schedule, staleness, saves, shards): an
    # evaluation, which trains nothing, leaves these out
    training: Callable[[str], None] = notes.append if cfg.mode != "eval" else _drop
    model = cfg.model
    reference = model.ref_load or model.hf_checkpoint
    if model.load not in (None, reference) and cfg.recipe.algo.reference_interval > 0:
        training(
            f"the KL's reference is model.ref_load={reference}, not the policy's start "
            f"(model.load={model.load}): the KL pulls the policy toward the reference's "
            "weights; model.ref_load: ${model.load} measures it against the start instead"
        )
    if cfg.recipe.data.max_prompt_len is None:
        training(
            "recipe.data.max_prompt_len is not set: the longest sample counts as "
            f"max_response_len = {batch.longest_sample_tokens} tokens (prompts add to it)"
        )
    response_key, prompt_key = memory.rollout.longest_sample_keys
    evaluated = cfg.mode == "eval" and prompt_key == "recipe.eval.max_prompt_len"
    if evaluated and cfg.recipe.eval.max_prompt_len is None:
        notes.append(
            "recipe.eval.max_prompt_len is not set: the longest request counts as "
            f"{response_key.removeprefix('recipe.')} = "
            f"{memory.rollout.longest_sample_tokens} tokens (prompts add to it)"
        )
    if batch.tokens_per_micro_batch and batch.longest_sample_tokens > batch.tokens_per_micro_batch:
        training(
            f"a sample of up to {batch.longest_sample_tokens} tokens exceeds max_tokens_per_gpu "
            f"x cp = {batch.tokens_per_micro_batch}: it gets a micro-batch of its own (never "
            "truncated), and the memory estimate holds such a micro-batch"
        )
    if par.tp > cfg.hardware.gpus_per_node:
        notes.append(f"tp={par.tp} spans nodes: its all-reduces leave the node's fast links")
    algo = cfg.recipe.algo
    interval, rollouts = algo.kl_metric_interval, cfg.recipe.rollout.num_rollout
    if algo.reference_interval == interval > 0 and interval >= rollouts > 1:
        training(
            f"recipe.algo.kl_metric_interval={interval} is not below the run's {rollouts} "
            f"rollouts: the KL is measured at rollouts 0, {interval}, ..., so only at rollout "
            "0, before the first update (against a reference that is the starting policy, "
            "that figure is 0), and the reference model is loaded and held for the whole "
            f"run for it; an interval below {rollouts} measures it as the policy moves"
        )
    fp8 = engine.fp8
    if fp8 is not None and cfg.model.load is None:
        training(
            "model.hf_checkpoint is FP8 and model.load is not set: the trainer starts from the "
            "FP8 weights dequantised, and on that grid updates smaller than an FP8 step are "
            "rounded away on the way to the engines (the rollout/trainer mismatch grows); "
            "point model.load at the bf16 checkpoint the FP8 one was converted from"
        )
    if fp8 is not None and algo.off_policy_correction == "none":
        training(
            "the engines serve FP8 and recipe.algo.off_policy_correction is none: tokens the "
            "FP8 policy sampled are trained as the trainer's own (train/rollout_logprob_abs_diff "
            "shows by how much they differ); tis reweights them"
        )
    stale = loop_plan.max_staleness
    if stale and algo.off_policy_correction == "none":
        loop = cfg.recipe.loop
        why = f"recipe.loop.mode={loop.mode}" + (
            f", update_weights_interval={loop.update_weights_interval}"
            if loop.update_weights_interval > 1
            else ""
        )
        training(
            f"a token may be trained up to {stale} policy version(s) after the one that "
            f"sampled it ({why}) and recipe.algo.off_policy_correction is none: it is "
            "trained as the trained policy's own (rollout/staleness_max shows how stale); "
            "tis or decoupled_ppo reweights such tokens"
        )
    optim, steps = cfg.recipe.optim, cfg.recipe.optimizer_steps
    if optim.lr_decay_steps is not None and optim.lr_decay_steps < steps and optim.min_lr > 0:
        rollouts = cfg.recipe.rollout.num_rollout
        ends = -(-optim.lr_decay_steps * rollouts // steps)
        training(
            f"recipe.optim.lr_decay_steps={optim.lr_decay_steps} ends the {optim.lr_decay_style} "
            f"decay at optimizer step {optim.lr_decay_steps} of {steps} (rollout {ends} of "
            f"{rollouts}): the rest of the run trains at min_lr={optim.min_lr:g}"
        )
    rollout = cfg.recipe.rollout
    if (
        rollout.partial_rollout
        and not rollout.mask_offpolicy_in_partial_rollout
        and algo.off_policy_correction == "none"
    ):
        training(
            "recipe.rollout.partial_rollout continues each group a rollout cut short in a later "
            "rollout, under newer weights: the tokens it carries over were sampled by an older "
            "policy, a version older for each rollout it is carried (a group cut short again "
            "is carried again; the staleness bound counts only the tokens since a group last "
            "started), and recipe.algo.off_policy_correction is none: they are trained as the "
            "trained policy's own (rollout/carried_over_tokens counts them); "
            "rollout.mask_offpolicy_in_partial_rollout takes them out of the loss, tis or "
            "decoupled_ppo reweights them"
        )
    save = cfg.recipe.save
    if save.interval is None and save.save_hf_interval is None:
        training(
            "recipe.save.interval and recipe.save.save_hf_interval are both null: the run "
            "writes no checkpoint and no HF export, so the trained policy ends with the run "
            "(or with a crash) and only its metrics remain; recipe.save.interval: N saves "
            "every N rollouts and at the end"
            + (" (a SIGTERM still saves: run.on_sigterm)" if cfg.run.on_sigterm == "save" else "")
        )
    ev, data = cfg.recipe.eval, cfg.recipe.data
    for i, dataset in enumerate(ev.datasets):
        if data.prompt_data and _rows_overlap(data.prompt_data, dataset.path):
            training(
                f"recipe.eval.datasets.{i} ({dataset.name}) is the training prompt file: its "
                "accuracy is measured on prompts the policy trains on, not held out"
            )
    rollout_len = cfg.recipe.rollout.max_response_len
    for key, length in ev.response_lens():
        if length < rollout_len:
            notes.append(
                f"recipe.{key}={length} is below recipe.rollout.max_response_len={rollout_len}: "
                "answers the policy finishes in training are cut off in evaluation, so its "
                "accuracy understates the policy, the more as its responses grow"
            )
    if not save.save_optimizer:
        again = (
            f"a restart (run.max_restarts={cfg.run.max_restarts}) or a resume"
            if cfg.run.max_restarts
            else "a resume"
        )
        training(
            "recipe.save.save_optimizer is false: checkpoints hold the weights only, so "
            f"{again} continues with Adam's moments at zero (its first steps move every "
            "weight by about the learning rate); save_optimizer: true keeps them"
        )
    if cfg.hardware.kind == "cpu":
        notes.append("hardware kind cpu: device slots share host memory; figures are nominal")
        if cfg.model.params_dtype != "fp32":
            notes.append(
                f"model.params_dtype={cfg.model.params_dtype} is for GPUs: on CPU the trainers "
                "and the CPU engines compute in float32, and the memory and time figures "
                "count float32"
            )
        if cfg.run.deterministic:
            notes.append(
                "run.deterministic: the CPU engines compute one sequence per forward (a "
                "batched forward's last bits depend on the batch, and a near-tie then samples "
                "another token)"
            )
    notes += _reward_notes(cfg.recipe.rollout.reward)
    notes += _eval_reward_notes(cfg.recipe.eval) + _unread_eval_notes(cfg.recipe.eval)
    if cfg.model.family == GENERIC_FAMILY:
        notes.append(GENERIC_MEMORY_NOTE.format(architecture=cfg.model.hf_architecture))
    if isinstance(memory.train, FsdpTrainMemory):
        moe = FSDP_MOE_NOTE if cfg.model.moe is not None else ""
        gathered = "two layers" if memory.train.reshard_after_forward else "every layer"
        training(FSDP_NOTE.format(shards=memory.train.shards, gathered=gathered) + moe)
    return tuple(notes)


def _rows_overlap(trained: str, evaluated: str) -> bool:
    """Whether an evaluation set's path may select prompts the training path does: the same
    file, where at most one of them slices it or both slice it alike (two other slices may
    or may not meet: that needs the file's row count, which planning does not read)."""
    a, b = split_prompt_path(trained), split_prompt_path(evaluated)
    same_file = os.path.realpath(a.path) == os.path.realpath(b.path)
    return same_file and (a.rows is None or b.rows is None or a.rows == b.rows)


def _drop(note: str) -> None:
    """A training note in a plan that trains nothing."""


def _reward_notes(reward: RewardConfig) -> list[str]:
    """Which function scores where both reward.type and reward.custom_function are set: a
    recipe derived from one that names a type, or a slime script that passes --rm-type beside
    --custom-rm-path (slime, too, scores with the custom function)."""
    default = RewardConfig.model_fields["type"].get_default()
    if not reward.custom_function or reward.type == default:
        return []
    who = (
        "called once per group (reward.group), scores every sample"
        if reward.group
        else "scores every sample, before a prompt line's metadata rm_type (an evaluation "
        "set's own reward_type still grades that set)"
    )
    return [
        f"recipe.rollout.reward.custom_function ({reward.custom_function}) {who}, not "
        f"recipe.rollout.reward.type={reward.type}: the type is passed on only as slime's "
        f"--rm-type (mode=slime_args)"
    ]


UNREAD_EVAL_SETTINGS_NOTE = (
    "recipe.eval.datasets names no evaluation set, so no evaluation runs: what the files give "
    "of how the sets are evaluated ({given}) is not read"
)


def _unread_eval_notes(ev: EvalConfig) -> list[str]:
    """The set settings a file gives while no set is named (a command line's are refused:
    rlpost.config.eval_sets)."""
    given = ev.unread_set_settings()
    if not given:
        return []
    return [UNREAD_EVAL_SETTINGS_NOTE.format(given=", ".join(f"recipe.eval.{n}" for n in given))]


def _eval_reward_notes(ev: EvalConfig) -> list[str]:
    """Which evaluation sets a custom function of the evaluation's scores, and which."""
    scored = [(d.name, ev.reward_function(i)) for i, d in enumerate(ev.datasets)]
    named = [f"{name} by {found[1]} (recipe.{found[0]})" for name, found in scored if found]
    if not named:
        return []
    return [
        "evaluation sets scored by a custom function of the evaluation's, before any reward "
        f"type and in place of recipe.rollout.reward's: {'; '.join(named)}"
    ]


TRAIN_LAYOUT = "layout.train"
NO_TRAINING_NOTE = (
    "mode=eval of model.hf_checkpoint's own weights starts no train rank: the training side "
    "of this plan (layout.train, its memory and time) is shown as the layout states it, and "
    "neither checked nor held to the hardware"
)
SEND_WEIGHTS_NOTE = (
    "mode=eval of {weights}: the train ranks only load these weights and send them to the "
    "engines, once, before the evaluation; they build no optimizer and no reference model "
    "and run no train step, so their memory counts the weights, a weight bucket and the CUDA "
    "context (no gradients, optimizer state or activations), and they take no time after it"
)
EVAL_SEARCH_NOTE = (
    "layout=auto in mode=eval ranks the layouts by the evaluation's work, not training's: "
    "the engines' generation of each evaluation set in turn, at the set's own lengths and "
    "samples ({sets}), plus the one weight push; the train side only has to hold the "
    "weights, so a split that takes {devices} from the engines for training gains nothing"
)


def eval_search_note(cfg: RunConfig) -> str:
    """EVAL_SEARCH_NOTE with what each evaluation set was timed at (rlpost.plan.generation)."""
    sets = "; ".join(g.describe() for g in eval_generations(cfg.recipe))
    return EVAL_SEARCH_NOTE.format(sets=sets, devices=device_word(cfg.hardware.kind, 2))


TRAINING_SETTINGS_NOTE = (
    "mode=eval trains nothing: the training settings the files give in {given} are not read"
)


def _evaluated_weights(cfg: RunConfig) -> str:
    if cfg.run.resume is not None:
        return f"run.resume's checkpoint ({cfg.run.resume})"
    return f"model.load={cfg.model.load}"


def _train_rank_notes(cfg: RunConfig, train_ranks: str, sizes: Sizes) -> tuple[str, ...]:
    colocate = sizes.colocate
    if train_ranks == TRAIN:
        return ()
    notes = [eval_search_note(cfg)] if cfg.layout.search else []
    given = set_training_only(cfg)  # the command line may give none (rlpost.config.eval_mode)
    if given:
        notes.append(TRAINING_SETTINGS_NOTE.format(given=", ".join(given)))
    if train_ranks == NO_TRAIN_RANK:
        return (*notes, NO_TRAINING_NOTE, *idle_train_gpu_notes(cfg, sizes))
    note = SEND_WEIGHTS_NOTE.format(weights=_evaluated_weights(cfg))
    if colocate and cfg.hardware.kind == "gpu":
        note += (
            "; colocated, those weights stay on each GPU beside its engine through the "
            "evaluation (the engines' memory table counts them, and a derived "
            "layout.rollout.sglang.mem_fraction_static leaves room for them)"
        )
    return (*notes, note)


def build_plan(cfg: RunConfig) -> Plan:
    """Resolve the layout, check every rule, then place, batch and size the run.

    Raises UserError listing every problem found, never just the first.
    """
    counted = as_computed(cfg)  # what the figures count (float32 on CPU)
    train_ranks = train_rank_work(cfg)
    resolved = resolve_layout(counted)
    train = train_rank_memory(counted, resolved.parallel, resolved.sizes.colocate, train_ranks)
    res = _room_for_sent_weights(counted, resolved, train_ranks, train)
    ctx = PlanContext(cfg, res.sizes, res.parallel, res.engine)
    starts = train_ranks != NO_TRAIN_RANK
    issues = [i for i in res.issues if starts or not i.key.startswith(TRAIN_LAYOUT)]
    issues += run_checks(ctx, skip=skipped_rules(train_ranks))
    if issues:
        raise UserError(issues, title="planning error")
    sizes, par, engine = res.sizes, res.parallel, res.engine
    hw = cfg.hardware
    placement = plan_placement(
        sizes.colocate,
        hw.num_nodes,
        hw.gpus_per_node,
        sizes.train_gpus,
        sizes.rollout_gpus,
        engine.gpus_per_engine,
        cfg.recipe.rollout.reward.device_slots,
    )
    batch = plan_batch(cfg.recipe, par, engine)
    memory = estimate_memory(counted, sizes, engine, train, train_ranks)
    work = plan_work(counted, par, batch)
    runtime = plan_runtime(
        cfg, sizes.colocate, batch.longest_sample_tokens, placement.num_engines, engine.fp8
    )
    return Plan(
        model=cfg.model.name,
        recipe=cfg.recipe.name,
        hardware=hw.name,
        layout=cfg.layout.name,
        hardware_kind=hw.kind,
        trainer_backend=resolve_trainer_backend(cfg, par),
        placement=placement,
        parallel=par,
        engine=engine,
        batch=batch,
        memory=memory,
        runtime=runtime,
        work=work,
        prediction=predict_train(counted, par, batch, work, memory.train, sizes.train_gpus),
        pipeline_stages=pipeline_stages(cfg.model, par),
        derived=res.derived,
        notes=_notes(cfg, (par, batch, engine, memory), runtime.loop)
        + tuple(idle_gpu_notes(cfg, sizes, par) + mtp_notes(cfg))
        + tuple(pipeline_balance_notes(cfg, par))
        + tuple(clip_notes(cfg, batch.steps_per_rollout, par.dp) + save_notes(cfg))
        + tuple(inert_setting_notes(cfg, par, placement.num_engines))
        + _train_rank_notes(cfg, train_ranks, sizes),
        train_ranks=train_ranks,
        generations=eval_generations(cfg.recipe) if cfg.mode == "eval" else (),
    )


MEM_FRACTION_KEY = "layout.rollout.sglang.mem_fraction_static"


def train_rank_memory(
    cfg: RunConfig, par: ParallelLayout, colocate: bool, train_ranks: str
) -> TrainMemory:
    """A train rank's peak per GPU: the trainer's, or, where the train ranks only send
    weights (mode=eval), the sender's."""
    if train_ranks == SEND_WEIGHTS:
        return estimate_sender(cfg, par, colocate, cfg.engine.weight_bucket_mb << 20)
    return estimate_trainer(cfg, par, colocate)


def _room_for_sent_weights(
    cfg: RunConfig, res: Resolution, train_ranks: str, train: TrainMemory
) -> Resolution:
    """mode=eval's train ranks keep the weights they sent on each colocated GPU through the
    evaluation (nothing offloads them): a derived mem_fraction_static leaves room for them,
    as in training it leaves room for the offloaded trainer's residue; where no train rank
    starts, nothing shares the GPU and it leaves room for none (SGLang's own default). A
    fraction the user set stays as set, and the plan's memory check holds it to the weights.
    `train` is the train ranks' memory (train_rank_memory)."""
    engine, hw = res.engine, cfg.hardware
    derived = MEM_FRACTION_KEY in res.derived
    if not (derived and train_ranks != TRAIN and res.sizes.colocate and hw.kind == "gpu"):
        return res
    kept = _kept_beside_engines(train_ranks, train)
    extra = (
        kept - TRAINER_RESIDUAL_GIB
        if train_ranks == NO_TRAIN_RANK
        else max(0.0, kept - TRAINER_RESIDUAL_GIB)
    )
    fraction = round(engine.mem_fraction_static - extra / hw.gpu_memory_gib, 3)
    options = dict(engine.sglang) | {"mem_fraction_static": fraction}
    engine = replace(engine, mem_fraction_static=fraction, sglang=tuple(options.items()))
    return replace(res, engine=engine)


def _kept_beside_engines(train_ranks: str, train: TrainMemory) -> float:
    """mode=eval, colocated: what the train ranks keep on an engine's GPU (GiB) in place of a
    trainer's offload residue: the weights they sent, or nothing where none starts."""
    return train.weights_gib if train_ranks == SEND_WEIGHTS else 0.0


def estimate_memory(
    cfg: RunConfig,
    sizes: Sizes,
    engine: EngineLayout,
    train: TrainMemory,
    train_ranks: str = TRAIN,
) -> MemoryPlan:
    """Training (or, in mode=eval, the train ranks' weights on their way to the engines:
    `train`, train_rank_memory's) and rollout peaks per GPU, and the host need per node."""
    model, recipe, hw = cfg.model, cfg.recipe, cfg.hardware
    colocate = sizes.colocate
    bucket_bytes = cfg.engine.weight_bucket_mb << 20
    rollout = estimate_rollout(
        model,
        longest_request(cfg),
        hw,
        engine.gpus_per_engine,
        engine.dp_size,
        engine.mem_fraction_static,
        engine.options,
        colocate,
        engine.fp8,
    )
    if train_ranks != TRAIN and colocate and hw.kind == "gpu":
        # nothing offloads them after the push: the train ranks' weights stay on the GPU
        # beside the engine through the evaluation, in place of a trainer's offload residue
        # (and where no train rank starts, nothing does)
        kept = _kept_beside_engines(train_ranks, train)
        total = rollout.total_gib - rollout.trainer_residual_gib + kept
        rollout = replace(rollout, trainer_residual_gib=kept, total_gib=total)
    params = count_params(model)
    return MemoryPlan(
        gpu_gib=hw.gpu_memory_gib,
        params_total=params.total,
        params_active=params.active,
        train=train,
        rollout=rollout,
        host=estimate_host(model, recipe, hw, train, sizes, trains=train_ranks == TRAIN),
        fp8_update_buffer_gib=(
            fp8_update_buffer_bytes(model, bucket_bytes) / GIB if engine.fp8 else 0.0
        ),
    )
