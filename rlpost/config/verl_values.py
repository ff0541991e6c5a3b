"""How verl's values become rlpost's overrides: one small function per kind of conversion.

Each takes verl's value and the line (verl's keys on the same command line, read where a value
depends on another: a prompt count times rollout.n) and returns the (key, value) pairs to
write, () where the key is to be dropped, or None where the line does not say enough. The
table that uses them is rlpost.config.verl_keys.
"""

from __future__ import annotations

from typing import Any

from rlpost.config.peer_rows import Convert, Line, Pairs, PeerRow, choice

__all__ = ["Convert", "Line", "Pairs", "VerlKey", "choice"]

N = "actor_rollout_ref.rollout.n"
A = "actor_rollout_ref.actor"
CLIP = 0.2  # verl's clip_ratio, clip_ratio_low and clip_ratio_high alike
# verl's kl_loss_type -> rlpost's (abs, full and the straight-through "+" forms have none)
KL_TYPES = {"kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2", "k3": "k3", "low_var_kl": "low_var_kl"}


class VerlKey(PeerRow):
    """One verl key and rlpost's answer: its key (None: rlpost has none), what differs, and
    `convert`, which turns verl's value into the overrides to write."""

    @property
    def verl(self) -> str:
        return self.name


def times_n(key: str) -> Convert:
    """A count of prompts (verl's) as a count of samples: times rollout.n from the line."""
    return lambda value, line: ((key, value * line[N]),) if N in line else None


def per_rollout(key: str) -> Convert:
    """A count of verl's training steps (rollouts: its lr scheduler steps once a rollout) as a
    count of rlpost's optimizer steps: times the mini-batches of a rollout, from the line."""

    def convert(value: Any, line: Line) -> Pairs | None:
        if value < 0:
            return ()  # verl's -1: the ratio decides (lr_warmup_steps_ratio)
        prompts, mini = line.get("data.train_batch_size"), line.get(f"{A}.ppo_mini_batch_size")
        if value == 0:
            return ((key, 0),)
        if not isinstance(prompts, int) or not isinstance(mini, int) or prompts % mini:
            return None
        return ((key, value * (prompts // mini)),)

    return convert


def low_clip(value: Any, line: Line) -> Pairs:
    """verl's low epsilon; its high one stays clip_ratio_high (0.2 unless set; clip_ratio where
    that is null), where rlpost's follows eps_clip unless eps_clip_high is set."""
    high = line.get(f"{A}.clip_ratio_high", CLIP)
    high = line.get(f"{A}.clip_ratio", CLIP) if high is None else high
    pairs: Pairs = (("recipe.algo.eps_clip", value),)
    return pairs if high == value else (*pairs, ("recipe.algo.eps_clip_high", high))


def clip_fallback(value: Any, line: Line) -> Pairs:
    """clip_ratio: verl's vanilla loss reads it only for a clip_ratio_low / clip_ratio_high
    set to null (both default to 0.2)."""
    low, high = line.get(f"{A}.clip_ratio_low", CLIP), line.get(f"{A}.clip_ratio_high", CLIP)
    if low is not None and high is not None:
        return ()
    low, high = value if low is None else low, value if high is None else high
    pairs: Pairs = (("recipe.algo.eps_clip", low),)
    return pairs if high == low else (*pairs, ("recipe.algo.eps_clip_high", high))


def kl_loss(value: Any, line: Line) -> Pairs:
    """use_kl_loss with verl's coefficient (0.001 unless kl_loss_coef says) and estimator
    (low_var_kl unless kl_loss_type says): rlpost's kl_loss_coef defaults to 0, no KL."""
    if not value:
        return (("recipe.algo.use_kl_loss", False),)
    kind = KL_TYPES.get(line.get(f"{A}.kl_loss_type", "low_var_kl"), "low_var_kl")
    return (
        ("recipe.algo.use_kl_loss", True),
        ("recipe.algo.kl_loss_coef", line.get(f"{A}.kl_loss_coef", 0.001)),
        ("recipe.algo.kl_loss_type", kind),
    )


def static_micro_batch(value: Any, line: Line) -> Pairs:
    if line.get("actor_rollout_ref.actor.use_dynamic_bsz") is True:
        return ()  # verl packs by tokens then, and reads no micro-batch count
    train = "recipe.train"
    return (
        (f"{train}.use_dynamic_batch_size", False),
        (f"{train}.max_tokens_per_gpu", None),
        (f"{train}.micro_batch_size", value),
    )


def dynamic_batch(value: Any, line: Line) -> Pairs:
    if not value:
        return (("recipe.train.use_dynamic_batch_size", False),)
    cap = line.get("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", 16384)  # verl's default
    return (("recipe.train.use_dynamic_batch_size", True), ("recipe.train.max_tokens_per_gpu", cap))


def token_cap(value: Any, line: Line) -> Pairs:
    return (
        ("recipe.train.use_dynamic_batch_size", True),
        ("recipe.train.max_tokens_per_gpu", value),
    )


def loggers(value: Any, line: Line) -> Pairs:
    names = value if isinstance(value, list) else [value]
    return (
        ("tracking.wandb.enabled", "wandb" in names),
        ("tracking.tensorboard", "tensorboard" in names),
    )


def wandb(key: str) -> Convert:
    return lambda value, line: (("tracking.wandb.enabled", True), (key, value))


def every(key: str) -> Convert:
    """verl's frequencies in training steps, -1 for never; rlpost's intervals in rollouts
    (one verl step is one rollout), null for never."""
    return lambda value, line: ((key, value if value > 0 else None),)


def resume(value: Any, line: Line) -> Pairs | None:
    if value == "disable":
        return ()  # rlpost starts afresh unless run.resume is set
    if value == "auto":  # in the folder verl would have resumed from
        project = line.get("trainer.project_name", "verl_examples")
        folder = f"checkpoints/{project}/{line.get('trainer.experiment_name', 'gsm8k')}"
        return (("run.dir", line.get("trainer.default_local_dir", folder)), ("run.resume", "auto"))
    return None  # resume_path: verl's checkpoint folder is no rlpost checkpoint


KL_REWARD_ESTIMATORS = ("reinforce_plus_plus", "reinforce_plus_plus_baseline")


def kl_in_reward(value: Any, line: Line) -> Pairs | None:
    if not value:
        return ()
    if line.get("algorithm.adv_estimator") not in KL_REWARD_ESTIMATORS:
        return None
    return (("recipe.algo.kl_coef", line.get("algorithm.kl_ctrl.kl_coef", 0.001)),)  # verl's


def kl_reward_coef(value: Any, line: Line) -> Pairs | None:
    if not value or line.get("algorithm.use_kl_in_reward") is not True:
        return ()  # verl reads it only with use_kl_in_reward=True
    if line.get("algorithm.adv_estimator") in KL_REWARD_ESTIMATORS:
        return (("recipe.algo.kl_coef", value),)
    return None


def filter_groups(value: Any, line: Line) -> Pairs:
    if not value:
        return ()
    return (("recipe.rollout.dynamic_sampling_filter", "rlpost.filters.check_reward_nonzero_std"),)


def gen_batch_limit(value: Any, line: Line) -> Pairs | None:
    """max_num_gen_batches: read with filter_groups.enable only; 0 (or less) is no limit."""
    if line.get("algorithm.filter_groups.enable") is not True:
        return ()
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    return (("recipe.rollout.max_draws_per_rollout", value if value > 0 else None),)


def eval_set(value: Any, line: Line) -> Pairs | None:
    files = value if isinstance(value, list) else [value]
    return (
        ("recipe.eval.datasets", [{"name": f"val{i}", "path": f} for i, f in enumerate(files)]),
    )


def prompts(value: Any, line: Line) -> Pairs | None:
    if isinstance(value, list):
        return None
    return (("recipe.data.prompt_data", value),)


def untruncated(key: str, off: Any) -> Convert:
    """top_p / top_k for rollouts: rlpost samples them untruncated (the trainer scores the
    full softmax), so only the no-cut value converts."""
    return lambda value, line: () if value == off else None


def estimator(value: Any, line: Line) -> Pairs | None:
    same = ("grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline")
    if value == "grpo_vectorized":
        value = "grpo"
    return (("recipe.algo.advantage_estimator", value),) if value in same else None


def gspo(value: Any, line: Line) -> Pairs | None:
    if value == "vanilla":
        return ()
    return (("recipe.algo.advantage_estimator", "gspo"),) if value == "gspo" else None


def greedy_eval(value: Any, line: Line) -> Pairs:
    return () if value else (("recipe.eval.temperature", None),)


def recompute(value: Any, line: Line) -> Pairs:
    return (("layout.train.recompute.granularity", "full" if value else "none"),)


REWARD_PATH, REWARD_NAME = "custom_reward_function.path", "custom_reward_function.name"


def reward_function(value: Any, line: Line) -> Pairs | None:
    """verl's reward function file and name (compute_score unless the line names another) as
    the dotted path module.function, the module being the file's name; rlpost calls verl's
    shape as it is (rlpost.hooks.VERL_COMPUTE_SCORE)."""
    path = line.get(REWARD_PATH)
    name = line.get(REWARD_NAME, "compute_score")
    if not isinstance(path, str) or not path.endswith(".py") or not isinstance(name, str):
        return None
    module = path.replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".py")
    if not (module.isidentifier() and name.isidentifier()):
        return None
    return (("recipe.rollout.reward.custom_function", f"{module}.{name}"),)
