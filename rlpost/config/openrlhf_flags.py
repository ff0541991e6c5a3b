"""OpenRLHF's flags on a launch's command line, answered with the rlpost key to write.

`python -m openrlhf.cli.train_ppo_ray --actor_learning_rate 5e-7 --n_samples_per_prompt 8`:
each flag of the table below becomes an Issue naming rlpost's key and the override to write,
with the value converted where the two differ, or says that rlpost has no such setting, what
it does instead, and to drop it. OpenRLHF counts as rlpost does where it matters most:
--rollout_batch_size in prompts, --train_batch_size in samples, --save_steps and
--eval_steps in rollouts (one PPO step of OpenRLHF's trains on one rollout).

The flags are those of openrlhf/cli/train_ppo_ray.py and examples/scripts/train_*_ray*.sh /
train_*_hybrid_engine.sh, read at OpenRLHF/OpenRLHF commit
76351db1ffe8e12db632a5bf450bbafb3e2031ed (2026-04-17, the flat names, v0.10.1.post2), and
their dotted successors (`--actor.adam.lr`, each row's aliases) at commit
3c3be6234e0cb353e76bb8019947db9dfe99fca7 (2026-08-13). Every override the table suggests
validates on the CPU default (tests/config/test_openrlhf_flags.py).
"""

from __future__ import annotations

from typing import Any

from rlpost.config.peer_rows import (
    Line,
    Pairs,
    PeerRow,
    choice,
    every,
    recompute,
    switch,
    token_cap,
)

NO_DEEPSPEED = "rlpost trains with FSDP2 or Megatron-core, not DeepSpeed"
REF = "the reference model follows the policy's layout (layout.train); it has no setting of its own"
ESTIMATORS = {
    "group_norm": (("recipe.algo.advantage_estimator", "grpo"),),
    "reinforce": (("recipe.algo.advantage_estimator", "reinforce_plus_plus"),),
    "reinforce_baseline": (("recipe.algo.advantage_estimator", "reinforce_plus_plus_baseline"),),
    "dr_grpo": (
        ("recipe.algo.advantage_estimator", "grpo"),
        ("recipe.algo.grpo_std_normalization", False),
    ),
}


def _estimator(value: Any, line: Line) -> Pairs | None:
    return ESTIMATORS.get(value)


def _kl_in_loss(coef: Any, line: Line) -> Pairs:
    kind = line.get("kl_estimator", "k1")  # OpenRLHF's default k1 has no gradient as a loss
    return (
        ("recipe.algo.use_kl_loss", True),
        ("recipe.algo.kl_loss_coef", coef),
        ("recipe.algo.kl_loss_type", "k3" if kind == "k1" else kind),
    )


def _kl(value: Any, line: Line) -> Pairs | None:
    """--init_kl_coef weighs the KL in the loss with --use_kl_loss, in the reward without."""
    if not value:
        return (("recipe.algo.use_kl_loss", False),)
    if line.get("use_kl_loss") is True:
        return _kl_in_loss(value, line)
    if line.get("advantage_estimator") in ("reinforce", "reinforce_baseline"):
        return (("recipe.algo.kl_coef", value),)
    return None


def _use_kl_loss(value: Any, line: Line) -> Pairs:
    """--use_kl_loss with OpenRLHF's --init_kl_coef (0.01 unless on the line): rlpost's
    kl_loss_coef defaults to 0, which weighs nothing."""
    if not value:
        return ()
    coef = line.get("init_kl_coef", 0.01)
    return _kl_in_loss(coef, line) if coef else (("recipe.algo.use_kl_loss", False),)


def _is_correction(value: Any, line: Line) -> Pairs | None:
    """--enable_vllm_is_correction: OpenRLHF's tis clamps to [0.5, 5.0] unless
    --vllm_is_truncated_threshold says; icepop and seq-mask-tis mask, which rlpost does not."""
    if not value:
        return ()
    if line.get("vllm_is_correction_type", "tis") != "tis":
        return None
    return _is_range(line.get("vllm_is_truncated_threshold", [0.5, 5.0]), line)


def _clip_pair(value: Any, line: Line) -> Pairs | None:
    if not isinstance(value, list) or len(value) != 2:
        return None
    return (("recipe.algo.eps_clip", value[0]), ("recipe.algo.eps_clip_high", value[1]))


def _is_range(value: Any, line: Line) -> Pairs | None:
    if not isinstance(value, list) or len(value) != 2:
        return None
    if line.get("vllm_is_correction_type", "tis") != "tis":
        return None
    if line.get("enable_vllm_is_correction") is not True:
        return ()  # OpenRLHF reads it with --enable_vllm_is_correction only
    return (
        ("recipe.algo.off_policy_correction", "tis"),
        ("recipe.algo.tis_clip_low", value[0]),
        ("recipe.algo.tis_clip_high", value[1]),
    )


def _prompt_data(value: Any, line: Line) -> Pairs | None:
    text = str(value)
    return (("recipe.data.prompt_data", text),) if text.endswith(".jsonl") else None


def _reward(value: Any, line: Line) -> Pairs | None:
    text = str(value)
    if text.startswith(("http://", "https://")):
        return (
            ("recipe.rollout.reward.type", "remote"),
            ("recipe.rollout.reward.remote_url", text),
        )
    return None  # a .py file: rlpost takes module.function


TABLE: tuple[PeerRow, ...] = (
    PeerRow(
        "pretrain",
        "model.hf_checkpoint",
        "the HF folder of the weights and tokenizer; its architecture is the model group's "
        "(model=qwen3-4b)",
        example="${asset:qwen3-tiny}",
        aliases=("actor.model_name_or_path",),
    ),
    PeerRow(
        "prompt_data",
        "recipe.data.prompt_data",
        "a jsonl file, one prompt a line; rlpost names no dataset of the Hub",
        _prompt_data,
        "write the prompts to jsonl and write recipe.data.prompt_data=/path/train.jsonl",
        aliases=("data.prompt_dataset",),
    ),
    PeerRow(
        "input_key", "recipe.data.input_key", "", example="prompt", aliases=("data.input_key",)
    ),
    PeerRow("label_key", "recipe.data.label_key", "", example="label", aliases=("data.label_key",)),
    PeerRow(
        "apply_chat_template",
        "recipe.data.apply_chat_template",
        "",
        example=True,
        aliases=("data.apply_chat_template",),
    ),
    PeerRow(
        "rollout_batch_size",
        "recipe.rollout.batch_size",
        "prompts per rollout in both",
        example=8,
        aliases=("rollout.batch_size",),
    ),
    PeerRow(
        "n_samples_per_prompt",
        "recipe.rollout.n_samples_per_prompt",
        "samples per prompt in both",
        example=8,
        aliases=("rollout.n_samples_per_prompt",),
    ),
    PeerRow(
        "train_batch_size",
        "recipe.train.global_batch_size",
        "samples per optimizer step in both",
        example=8,
        aliases=("train.batch_size",),
    ),
    PeerRow(
        "micro_train_batch_size",
        "recipe.train.micro_batch_size",
        "samples per micro-batch on each GPU in both",
        lambda value, line: (
            (
                ("recipe.train.use_dynamic_batch_size", False),
                ("recipe.train.max_tokens_per_gpu", None),
                ("recipe.train.micro_batch_size", value),
            )
            if line.get("use_dynamic_batch") is not True
            else ()
        ),
        example=2,
        aliases=("train.micro_batch_size",),
    ),
    PeerRow(
        "use_dynamic_batch",
        "recipe.train.use_dynamic_batch_size",
        "micro-batches packed up to recipe.train.max_tokens_per_gpu tokens",
        lambda value, line: token_cap(line.get("train_max_tokens_per_gpu", 16384), line),
        example=True,
        aliases=("train.dynamic_batch_enable",),
    ),
    PeerRow(
        "train_max_tokens_per_gpu",
        "recipe.train.max_tokens_per_gpu",
        "tokens per micro-batch on each GPU in both",
        token_cap,
        example=4096,
        aliases=("train.max_tokens_per_gpu",),
    ),
    PeerRow(
        "max_new_tokens",
        "recipe.rollout.max_response_len",
        "",
        example=32,
        aliases=("rollout.max_new_tokens",),
    ),
    PeerRow(
        "max_len",
        "recipe.rollout.max_response_len",
        "OpenRLHF caps prompt + response together, rlpost each: recipe.data.max_prompt_len "
        "and recipe.rollout.max_response_len",
        lambda value, line: None,
        "write recipe.data.max_prompt_len=<the longest prompt> and "
        "recipe.rollout.max_response_len=<this value - that> (--max_new_tokens is the latter)",
        aliases=("data.max_len",),
    ),
    PeerRow(
        "temperature",
        "recipe.rollout.temperature",
        "the rollouts' sampling",
        example=1.0,
        aliases=("rollout.temperature",),
    ),
    PeerRow(
        "actor_learning_rate",
        "recipe.optim.lr",
        "OpenRLHF decays it by default (--lr_scheduler cosine_with_min_lr, to a tenth of it "
        "by the run's end), rlpost holds it constant unless recipe.optim.lr_decay_style "
        "(cosine, with lr_decay_steps and min_lr) says",
        example=1e-6,
        aliases=("actor.adam.lr",),
    ),
    PeerRow(
        "l2", "recipe.optim.weight_decay", "", example=0.01, aliases=("actor.adam.weight_decay",)
    ),
    PeerRow("max_norm", "recipe.optim.clip_grad", "", example=1.0, aliases=("actor.max_norm",)),
    PeerRow(
        "lr_warmup_ratio",
        "recipe.optim.lr_warmup_steps",
        "rlpost counts warmup in optimizer steps, not as a share of them",
        lambda value, line: () if not value else None,
        "write recipe.optim.lr_warmup_steps=<the ratio x the run's optimizer steps> "
        "(`launch.py mode=plan` prints the steps)",
        aliases=("actor.scheduler.warmup_ratio",),
    ),
    PeerRow(
        "advantage_estimator",
        "recipe.algo.advantage_estimator",
        "group_norm is grpo, reinforce reinforce_plus_plus, reinforce_baseline "
        "reinforce_plus_plus_baseline, dr_grpo grpo without std normalization; rlpost has no "
        "rloo: its leave-one-out advantage is n/(n-1) times the group-centred reward, so the "
        "nearest is grpo with recipe.algo.grpo_std_normalization=false, whose advantages are "
        "(n-1)/n of rloo's; with no critic, no gae",
        _estimator,
        "write recipe.algo.advantage_estimator= one of grpo, gspo, reinforce_plus_plus, "
        "reinforce_plus_plus_baseline",
        example="group_norm",
        aliases=("algo.advantage.estimator",),
    ),
    PeerRow(
        "init_kl_coef",
        "recipe.algo.kl_loss_coef",
        "with --use_kl_loss the KL's weight in the loss (k3 where --kl_estimator is k1, which "
        "has no gradient as a loss); without, in the reward (recipe.algo.kl_coef, with a "
        "reinforce_plus_plus estimator only)",
        _kl,
        "with grpo, weigh the KL in the loss: recipe.algo.use_kl_loss=true "
        "recipe.algo.kl_loss_coef=<the value> recipe.algo.kl_loss_type=k3",
        example=0.01,
        aliases=("algo.kl.init_coef",),
    ),
    PeerRow(
        "use_kl_loss",
        "recipe.algo.use_kl_loss",
        "with OpenRLHF's weight where --init_kl_coef is not on this command line (0.01; k3 "
        "where --kl_estimator is k1): rlpost's kl_loss_coef defaults to 0, which weighs nothing",
        _use_kl_loss,
        example=True,
        aliases=("algo.kl.use_loss",),
    ),
    PeerRow(
        "kl_estimator",
        "recipe.algo.kl_loss_type",
        "k1, k2 and k3 in both",
        choice("recipe.algo.kl_loss_type", {"k1": "k1", "k2": "k2", "k3": "k3"}),
        example="k3",
        aliases=("algo.kl.estimator",),
    ),
    PeerRow(
        "eps_clip",
        "recipe.algo.eps_clip",
        "an epsilon in both; OpenRLHF reads it only without --eps_clip_low_high",
        lambda value, line: (
            () if "eps_clip_low_high" in line else (("recipe.algo.eps_clip", value),)
        ),
        example=0.2,
        aliases=("actor.eps_clip",),
    ),
    PeerRow(
        "eps_clip_low_high",
        "recipe.algo.eps_clip_high",
        "the low and high epsilons: recipe.algo.eps_clip and recipe.algo.eps_clip_high",
        _clip_pair,
        example=[0.2, 0.27],
        aliases=("actor.eps_clip_low_high",),
    ),
    PeerRow(
        "dual_clip",
        "recipe.algo.eps_clip_c",
        "dual-clip's bound, > 1 in both",
        example=3.0,
        aliases=("actor.dual_clip",),
    ),
    PeerRow(
        "no_advantage_std_norm",
        None,
        "rlpost's reinforce_plus_plus estimators always divide by the batch's std (OpenRLHF "
        "reads it with reinforce, reinforce_baseline and gae only); grpo without std "
        "normalization is recipe.algo.grpo_std_normalization=false",
        aliases=("algo.advantage.no_std_norm",),
    ),
    PeerRow(
        "entropy_loss_coef",
        "recipe.algo.entropy_coef",
        "",
        example=0.0,
        aliases=("actor.entropy_coef",),
    ),
    PeerRow(
        "gamma",
        "recipe.algo.gamma",
        "read by reinforce_plus_plus",
        example=1.0,
        aliases=("algo.advantage.gamma",),
    ),
    PeerRow(
        "dynamic_filtering",
        "recipe.rollout.dynamic_sampling_filter",
        "drops groups whose rewards are all equal (for 0/1 rewards, OpenRLHF's range 0 1)",
        switch("recipe.rollout.dynamic_sampling_filter", "rlpost.filters.check_reward_nonzero_std"),
        example=True,
        aliases=("algo.dynamic_filtering_enable",),
    ),
    PeerRow(
        "dynamic_filtering_reward_range",
        None,
        "rlpost.filters.check_reward_nonzero_std keeps groups whose rewards differ; another "
        "range is a filter function of your own (recipe.rollout.dynamic_sampling_filter)",
        aliases=("algo.dynamic_filtering_range",),
    ),
    PeerRow(
        "enable_vllm_is_correction",
        "recipe.algo.off_policy_correction",
        "tis weighs each token by pi_old/pi_rollout clamped to [tis_clip_low, tis_clip_high], "
        "OpenRLHF's [0.5, 5.0] unless --vllm_is_truncated_threshold says; rlpost has no "
        "icepop or seq-mask-tis (they zero tokens or samples out of range, tis clamps them)",
        _is_correction,
        "for icepop, the nearest is recipe.algo.off_policy_correction=decoupled_ppo "
        "recipe.algo.behaviour_weight_cap=<the high threshold> (drops tokens above the cap, "
        "keeps those below the low one); else tis with the thresholds: "
        "recipe.algo.off_policy_correction=tis recipe.algo.tis_clip_low=0.5 "
        "recipe.algo.tis_clip_high=5.0",
        example=True,
        aliases=("algo.advantage.is_correction_enable",),
    ),
    PeerRow(
        "vllm_is_correction_type",
        "recipe.algo.off_policy_correction",
        "tis in both; rlpost has no icepop or seq-mask-tis (they zero tokens or samples out of "
        "range, tis clamps them)",
        lambda value, line: () if value == "tis" else None,
        "for icepop, the nearest is recipe.algo.off_policy_correction=decoupled_ppo "
        "recipe.algo.behaviour_weight_cap=<the high threshold>; else drop it and take tis",
        example="tis",
        aliases=("algo.advantage.is_correction_type",),
    ),
    PeerRow(
        "vllm_is_truncated_threshold",
        "recipe.algo.tis_clip_high",
        "the importance weight's low and high bounds: tis_clip_low and tis_clip_high",
        _is_range,
        example=[0.5, 5.0],
        aliases=("algo.advantage.is_correction_threshold",),
    ),
    PeerRow(
        "remote_rm_url",
        "recipe.rollout.reward.remote_url",
        "a URL is a remote reward; a .py file's function is recipe.rollout.reward.custom_function "
        "(a dotted path, module.function)",
        _reward,
        "put the file's folder on PYTHONPATH and write recipe.rollout.reward.type=custom_function "
        "recipe.rollout.reward.custom_function=module.reward_func",
        aliases=("reward.remote_url",),
    ),
    PeerRow(
        "normalize_reward",
        None,
        "rlpost scales no rewards by a running mean and std",
        aliases=("reward.normalize_enable",),
    ),
    PeerRow(
        "num_episodes",
        "recipe.rollout.num_rollout",
        "rlpost counts rollouts, not passes over the data",
        lambda value, line: None,
        "write recipe.rollout.num_rollout=<episodes x the prompts in the data / "
        "recipe.rollout.batch_size>",
        aliases=("train.num_episodes",),
    ),
    PeerRow(
        "max_epochs",
        None,
        "rlpost trains on each rollout's samples once",
        aliases=("train.max_epochs",),
    ),
    PeerRow(
        "save_steps",
        "recipe.save.interval",
        "in rollouts; -1 for never (rlpost's null)",
        every("recipe.save.interval"),
        example=-1,
        aliases=("ckpt.save_steps",),
    ),
    PeerRow(
        "eval_steps",
        "recipe.eval.interval",
        "in rollouts; -1 for never (rlpost's null)",
        every("recipe.eval.interval"),
        example=5,
        aliases=("eval.steps",),
    ),
    PeerRow(
        "ckpt_path",
        "run.dir",
        "checkpoints go under <run.dir>/ckpt",
        example="/tmp/rlpost-openrlhf-run",
        aliases=("ckpt.path",),
    ),
    PeerRow(
        "save_path",
        "run.dir",
        "the run's folder; the HF weights go under it",
        example="/tmp/rlpost-openrlhf-run",
        aliases=("ckpt.output_dir",),
    ),
    PeerRow("seed", "run.seed", "", example=42, aliases=("train.seed",)),
    PeerRow(
        "use_wandb",
        "tracking.wandb.enabled",
        "OpenRLHF's value is wandb's API key, which rlpost reads from the environment",
        lambda value, line: (("tracking.wandb.enabled", True),),
        "write tracking.wandb.enabled=true and export WANDB_API_KEY=<the key>",
        aliases=("logger.wandb.key",),
        secret=True,
    ),
    PeerRow(
        "wandb_project",
        "tracking.wandb.project",
        "wandb's project",
        lambda value, line: (("tracking.wandb.enabled", True), ("tracking.wandb.project", value)),
        example="openrlhf_train_ppo",
        aliases=("logger.wandb.project",),
    ),
    PeerRow(
        "use_tensorboard",
        "tracking.tensorboard",
        "rlpost writes TensorBoard's events under run.dir",
        lambda value, line: (("tracking.tensorboard", True),),
        example="/tmp/runs",
        aliases=("logger.tensorboard_dir",),
    ),
    PeerRow(
        "vllm_num_engines",
        "layout.rollout.num_gpus",
        "rlpost counts the engines' GPUs: engines x layout.rollout.gpus_per_engine",
        lambda value, line: (
            ("layout.rollout.num_gpus", value * line.get("vllm_tensor_parallel_size", 1)),
        ),
        aliases=("vllm.num_engines",),
    ),
    PeerRow(
        "vllm_tensor_parallel_size",
        "layout.rollout.gpus_per_engine",
        "an engine's tensor parallelism is its GPU count",
        example=1,
        aliases=("vllm.tensor_parallel_size",),
    ),
    PeerRow(
        "vllm_gpu_memory_utilization",
        "layout.rollout.sglang.mem_fraction_static",
        "SGLang's fraction of GPU memory for weights and KV cache, as vLLM's is",
        example=0.6,
        aliases=("vllm.gpu_memory_utilization",),
    ),
    PeerRow(
        "colocate_all_models",
        "layout.colocate",
        "engines on the training GPUs",
        switch("layout.colocate", True, False),
        example=True,
        aliases=("train.colocate_all",),
    ),
    PeerRow(
        "actor_num_gpus_per_node",
        "hardware.gpus_per_node",
        "a hardware profile says it (hardware=h100x8); this overrides the profile's count",
        example=2,
        aliases=("actor.num_gpus_per_node",),
    ),
    PeerRow(
        "actor_num_nodes",
        "hardware.num_nodes",
        "a hardware profile says it (hardware=h100x16); this overrides the profile's count",
        example=1,
        aliases=("actor.num_nodes",),
    ),
    PeerRow("ref_num_nodes", None, REF, aliases=("ref.num_nodes",)),
    PeerRow("ref_num_gpus_per_node", None, REF, aliases=("ref.num_gpus_per_node",)),
    PeerRow(
        "gradient_checkpointing",
        "layout.train.recompute.granularity",
        "",
        recompute,
        example=True,
        aliases=("actor.gradient_checkpointing_enable",),
    ),
    PeerRow("zero_stage", None, NO_DEEPSPEED, aliases=("ds.zero_stage",)),
    PeerRow(
        "deepspeed_enable_sleep",
        None,
        "colocated trainers release their memory by themselves (engine.offload)",
        aliases=("ds.enable_sleep",),
    ),
    PeerRow(
        "vllm_enable_sleep",
        None,
        "colocated engines release their memory by themselves (engine.offload)",
        aliases=("vllm.enable_sleep",),
    ),
    PeerRow(
        "enforce_eager",
        None,
        "SGLang's own setting: layout.rollout.sglang.disable_cuda_graph",
        aliases=("vllm.enforce_eager",),
    ),
    PeerRow(
        "packing_samples",
        None,
        "rlpost's trainers pack samples without padding; there is no switch",
        aliases=("ds.packing_samples",),
    ),
    PeerRow(
        "param_dtype",
        None,
        "the model group's params_dtype says it (bf16)",
        aliases=("ds.param_dtype",),
    ),
    PeerRow(
        "vllm_sync_backend",
        None,
        "the plan picks how weights reach the engines",
        aliases=("vllm.sync_backend",),
    ),
)
