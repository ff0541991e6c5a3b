"""Plan notes on what a valid layout leaves unused or unbalanced: GPUs no rank or engine is
placed on (or, in an evaluation that starts no train rank, layout.train's), multi-token-
prediction (MTP) layers that are trained with no engine drafting with them, or drafted with
while they stay as the checkpoint has them, an uneven pipeline split whose largest stage
holds far more layers than a balanced split would, clip bounds that one optimizer step a
rollout never reaches, save and evaluation intervals beyond the run (one save or
evaluation, at its end), and settings that act on nothing in the run as planned (a KL
estimator where no KL is computed, data balancing over one data-parallel rank, a router
policy with one engine).

Each is valid and may be meant (a smaller run beside another job, MTP layers trained for a
later deployment), so the plan says it and refuses nothing.
"""

from __future__ import annotations

from rlpost.plan.engine_options import KEY, MTP_DRAFT_ALGORITHMS
from rlpost.plan.layout import ParallelLayout, Sizes
from rlpost.plan.params import stage_layers
from rlpost.plan.stages import FIRST, LAST, lopsided, most_balanced_split, split_change
from rlpost.schema import RunConfig
from rlpost.schema.base import changed
from rlpost.schema.hardware import device_word

MTP_DRAFT_OPTIONS = (
    "speculative_algorithm: EAGLE, speculative_num_steps: 2, speculative_eagle_topk: 1, "
    "speculative_num_draft_tokens: 3"
)


def idle_gpu_notes(cfg: RunConfig, sizes: Sizes, par: ParallelLayout) -> list[str]:
    """GPUs of the hardware profile that neither a train rank nor an engine uses (a reward
    model's own slot is counted out of the total already)."""
    used = sizes.train_gpus if sizes.colocate else sizes.train_gpus + sizes.rollout_gpus
    idle = sizes.total_gpus - used
    if idle <= 0:
        return []
    unit = device_word(cfg.hardware.kind, sizes.total_gpus)
    where = f"{cfg.hardware.name} has {sizes.total_gpus} {unit}"
    if not sizes.colocate:
        return [
            f"{idle} of the {sizes.total_gpus} {unit} sit idle for the whole run: decoupled, "
            f"{sizes.train_gpus} train and {sizes.rollout_gpus} generate, and {where}; "
            f"layout.rollout.num_gpus: {sizes.total_gpus - sizes.train_gpus} gives them to "
            "the engines"
        ]
    replica = par.tp * par.pp * par.cp
    whole = sizes.total_gpus // replica * replica
    fixes = []
    if whole > sizes.train_gpus and replica > 1:
        device = device_word(cfg.hardware.kind).replace(" ", "-")
        fixes.append(
            f"layout.train.num_gpus: {whole} (whole tp x pp x cp = {replica}-{device} replicas; "
            "null takes every one) trains and generates on them"
        )
    elif whole > sizes.train_gpus:
        fixes.append(
            f"layout.train.num_gpus: {whole} (or null, every one) trains and generates on them"
        )
    fixes.append(
        f"layout.colocate: false with layout.rollout.num_gpus: {idle} gives them to "
        "engines of their own"
    )
    return [
        f"{idle} of the {sizes.total_gpus} {unit} sit idle for the whole run: colocated, "
        f"the trainer and the engines share layout.train.num_gpus={sizes.train_gpus}, and "
        f"{where}; " + ", or ".join(fixes)
    ]


def idle_train_gpu_notes(cfg: RunConfig, sizes: Sizes) -> list[str]:
    """An evaluation that starts no train rank (mode=eval of model.hf_checkpoint's weights),
    decoupled: the GPUs layout.train sets apart run nothing while the engines generate."""
    if sizes.colocate:
        return []
    n = sizes.train_gpus
    unit = device_word(cfg.hardware.kind, n)
    return [
        f"layout.train's {n} {unit} {'sit' if n > 1 else 'sits'} idle for the whole evaluation: it "
        f"starts no train rank (the engines load model.hf_checkpoint's weights), and "
        f"decoupled, the {sizes.rollout_gpus} of layout.rollout.num_gpus generate alone; "
        "layout.colocate: true with layout.train.num_gpus: null and layout.rollout.num_gpus: "
        f"null runs engines on all {sizes.total_gpus} of {cfg.hardware.name}"
    ]


def pipeline_balance_notes(cfg: RunConfig, par: ParallelLayout) -> list[str]:
    """An uneven split (first or last stage set) whose largest stage holds 1.5 times the
    layers of the most balanced split pp allows, or more (rlpost.plan.stages.lopsided). Each
    micro-batch passes every stage in turn, so the largest one sets the pipeline's pace and its
    memory the run's peak. A stage count kept from a layout written for another pp is the usual
    source (Megatron-Bridge#5884)."""
    first, last = par.num_layers_in_first_pipeline_stage, par.num_layers_in_last_pipeline_stage
    layers, pp = cfg.model.num_layers, par.pp
    stages = stage_layers(layers, pp, first, last) if pp > 1 and (first or last) else None
    best = most_balanced_split(layers, pp)
    if stages is None or best is None or not lopsided(stages, best[2]):
        return []
    given = ", ".join(
        f"{key}={value}" for key, value in ((FIRST, first), (LAST, last)) if value is not None
    )
    return [
        f"the {pp} pipeline stages hold {', '.join(map(str, stages))} of the model's {layers} "
        f"layers ({given} with pp={pp}): every micro-batch passes each stage in turn, so the "
        f"one of {max(stages)} layers sets the pace and the memory peak where the most even "
        f"split pp={pp} allows holds at most {max(best[2])} a stage; "
        + split_change(first, last, best)
    ]


def drafts_with_mtp(cfg: RunConfig) -> bool:
    """The engines' speculative decoder drafts with the policy checkpoint's MTP layers: an
    MTP algorithm without a draft model of its own, on SGLang engines, for a model that has
    them (rlpost.plan.engine_options refuses the pair for a model that has none)."""
    if cfg.engine.backend == "cpu" or cfg.model.mtp_num_layers == 0:
        return False
    options = cfg.layout.rollout.sglang
    algorithm = options.get("speculative_algorithm")
    return (
        isinstance(algorithm, str)
        and algorithm.upper() in MTP_DRAFT_ALGORITHMS
        and not options.get("speculative_draft_model_path")
    )


def mtp_notes(cfg: RunConfig) -> list[str]:
    """MTP layers trained that nothing drafts with, or drafted with and never trained.
    Training notes: an evaluation trains nothing."""
    if cfg.mode == "eval":
        return []
    trained, drafted = cfg.recipe.train.mtp_training, drafts_with_mtp(cfg)
    if trained and not drafted:
        return [
            "recipe.train.mtp_training trains the MTP layers on every rollout, and no engine "
            f"drafts with them ({KEY} sets no EAGLE or NEXTN speculative_algorithm without a "
            "speculative_draft_model_path): each optimizer step pays for their forward, "
            "backward and optimizer state, and the rollouts gain nothing from them (they only "
            f"reach the checkpoints and HF exports); {KEY} {MTP_DRAFT_OPTIONS} drafts with "
            "them, or recipe.train.mtp_training: false leaves them out"
        ]
    if drafted and not trained:
        algorithm = cfg.layout.rollout.sglang["speculative_algorithm"]
        return [
            f"{KEY}.speculative_algorithm={algorithm} drafts with {cfg.model.name}'s MTP "
            "layers, and recipe.train.mtp_training is false: they stay as model.hf_checkpoint "
            "has them while the policy trains away from it, so fewer and fewer drafted tokens "
            "are accepted and the speed-up fades as the run goes on (the policy verifies "
            "each drafted token, so it is the speed that suffers); "
            "recipe.train.mtp_training: true (Megatron trainer) trains them beside the "
            "policy and sends them to the engines with its weights"
        ]
    return []


def clip_notes(cfg: RunConfig, steps_per_rollout: int, dp: int) -> list[str]:
    """Clip bounds set where no token's ratio can reach them. With one optimizer step a
    rollout every token is trained by the weights that sampled it (the training forward's own
    logprobs are the old policy's, rlpost.plan.work), so pi / pi_old is 1 on every trained
    token: eps_clip_high (clip-higher) and eps_clip_c (dual clip) never bind, whatever their
    values. A training note."""
    algo, recipe = cfg.recipe.algo, cfg.recipe
    bounds = [
        f"recipe.algo.{name}={value:g}"
        for name, value in (("eps_clip_high", algo.eps_clip_high), ("eps_clip_c", algo.eps_clip_c))
        if value is not None
    ]
    if cfg.mode == "eval" or steps_per_rollout != 1 or not bounds:
        return []
    rollout = recipe.rollout
    samples = rollout.batch_size * rollout.n_samples_per_prompt
    # the fewest steps a rollout above one whose step still splits over the DP ranks
    halves = [n for n in range(2, samples + 1) if samples % n == 0 and samples // n % dp == 0]
    fix = (
        f"recipe.train.global_batch_size: {samples // halves[0]} gives {halves[0]} steps a "
        "rollout, from the second of which the ratio moves"
        if halves
        else "a rollout of more than one sample allows more steps a rollout"
    )
    return [
        f"{' and '.join(bounds)} never bind{'s' if len(bounds) == 1 else ''}: a rollout "
        f"(rollout.batch_size {rollout.batch_size} x n_samples_per_prompt "
        f"{rollout.n_samples_per_prompt} = {samples} samples) is one "
        f"optimizer step (train.global_batch_size {recipe.train.global_batch_size}), so each "
        "token is trained by the weights that sampled it and its ratio pi/pi_old is 1 (no "
        "update has moved the policy yet), inside every clip range; the clip acts only on a "
        "rollout's later steps: " + fix
    ]


def save_notes(cfg: RunConfig) -> list[str]:
    """Save and evaluation intervals beyond the run's rollouts: the loop saves and
    evaluates every interval and after the last rollout (rlpost.runtime.loop), so such an
    interval writes one checkpoint (or export), or evaluates once, at the end (and before
    training). A training note."""
    save, rollouts = cfg.recipe.save, cfg.recipe.rollout.num_rollout
    if cfg.mode == "eval":
        return []
    notes = []
    if save.interval is not None and save.interval > rollouts:
        state = " with the optimizer's state" if save.save_optimizer else ""
        notes.append(
            f"recipe.save.interval={save.interval} is beyond the run's {rollouts} rollouts: "
            f"the one checkpoint is written after the last rollout{state} (a run saves at "
            "its end whatever the interval), and a crash before then leaves none; "
            "recipe.save.interval: null writes no checkpoint, one below "
            f"{rollouts} writes some along the way"
        )
    if save.save_hf_interval is not None and save.save_hf_interval > rollouts:
        notes.append(
            f"recipe.save.save_hf_interval={save.save_hf_interval} is beyond the run's "
            f"{rollouts} rollouts: the one HF export is written after the last rollout (a run "
            "exports at its end whatever the interval); recipe.save.save_hf_interval: null "
            "writes none"
        )
    ev = cfg.recipe.eval
    if ev.datasets and ev.interval is not None and ev.interval > rollouts:
        when = (
            "after the last rollout"
            if ev.skip_before_train
            else ("before training and after the last rollout")
        )
        notes.append(
            f"recipe.eval.interval={ev.interval} is beyond the run's {rollouts} rollouts: "
            f"the evaluation sets are evaluated {when} only (a run evaluates at its end "
            "whatever the interval); recipe.eval.datasets: [] with recipe.eval.interval: null "
            "evaluates none, an interval "
            f"below {rollouts} evaluates along the way"
        )
    return notes


def inert_setting_notes(cfg: RunConfig, par: ParallelLayout, num_engines: int) -> list[str]:
    """Settings, changed from their defaults, that act on nothing in the run as planned: a
    KL estimator where no KL is computed, data balancing over one data-parallel rank, a
    router policy with one engine to route to. Shipped recipes set the first two (slime's
    seed scripts do), so the plan says it and refuses nothing."""
    notes: list[str] = []
    if cfg.mode != "eval":
        notes += _kl_estimator_notes(cfg) + _balance_notes(cfg, par)
    policy = cfg.engine.router_policy
    if num_engines == 1 and changed(cfg.engine, "router_policy"):
        devices = device_word(cfg.hardware.kind, 2)
        notes.append(
            f"engine.router_policy={policy} has one engine to choose: the plan starts one, and "
            "the router sends it every request; the policy acts once there are more "
            f"(layout.rollout.gpus_per_engine below the rollout's {devices}, or more rollout "
            f"{devices})"
        )
    return notes


def _kl_estimator_notes(cfg: RunConfig) -> list[str]:
    """A KL to the reference that nothing computes: use_kl_loss with kl_loss_coef 0 (as the
    seeds' recipes), or a kl_loss_type set (the estimator of that KL: rlpost.algo.losses, and
    the KL in the reward, rlpost.algo.steps), where the reference never runs
    (AlgoConfig.reference_interval 0)."""
    algo = cfg.recipe.algo
    if algo.reference_interval:
        return []
    if not changed(algo, "kl_loss_type"):
        if not algo.use_kl_loss:
            return []
        return [
            "recipe.algo.use_kl_loss with kl_loss_coef 0: the KL weighs nothing in the loss, "
            "so the reference model is neither loaded nor run (recipe.algo.kl_metric_interval: "
            "N logs the KL every N rollouts)"
        ]
    loss = (
        "use_kl_loss with kl_loss_coef 0 weighs it nothing in the loss"
        if algo.use_kl_loss
        else "use_kl_loss is false"
    )
    slime = (
        " (slime, given --use-kl-loss, loads the reference model and computes this estimate "
        "every step all the same, weighted 0)"
        if algo.use_kl_loss
        else ""
    )
    weigh = "kl_loss_coef above 0" if algo.use_kl_loss else "use_kl_loss with kl_loss_coef above 0"
    return [
        f"recipe.algo.kl_loss_type={algo.kl_loss_type} estimates a KL that is never "
        f"computed: {loss}, the reward carries none (kl_coef 0), and "
        "recipe.algo.kl_metric_interval is 0, so the reference model is neither loaded nor "
        f"run{slime}; recipe.algo.kl_metric_interval: N logs the KL with this estimator every "
        f"N rollouts, {weigh} puts it in the loss"
    ]


def _balance_notes(cfg: RunConfig, par: ParallelLayout) -> list[str]:
    """balance_data spreads a step's samples over the data-parallel ranks by their tokens
    (rlpost.algo.steps); one rank takes them all either way. A replica split over several
    GPUs (megatron's tp x pp x cp) leaves more ranks when smaller; the torch trainer's is one."""
    if not cfg.recipe.train.balance_data or par.dp != 1:
        return []
    devices = f"more train {device_word(cfg.hardware.kind, 2)}"
    smaller = ", or a smaller tp x pp x cp" if par.tp * par.pp * par.cp > 1 else ""
    return [
        "recipe.train.balance_data=true partitions nothing: the layout has one data-parallel "
        "rank (dp=1), which trains every sample of a step whatever the balance; it evens the "
        f"ranks' tokens once dp is above 1 ({devices}{smaller})"
    ]
