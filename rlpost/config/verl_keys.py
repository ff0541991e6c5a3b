"""verl's config keys on a launch's command line, answered with the rlpost key to write.

verl also takes Hydra overrides, so its users write its keys here
(`data.train_batch_size=1024 actor_rollout_ref.rollout.n=5`). Each key of the table below
becomes an Issue naming rlpost's key and the override to write, with the value converted where
the two count differently (verl's ppo_mini_batch_size counts prompts, rlpost's
recipe.train.global_batch_size samples: times actor_rollout_ref.rollout.n from the same
command line), or says that rlpost has no such setting, what it does instead, and to drop it.

The keys are those verl's GRPO and DAPO scripts set, read at volcengine/verl commit
b178a3cd56f58b2d502255daba591e92833930a7 (2026-01-29): verl/trainer/config/
_generated_ppo_trainer.yaml, examples/grpo_trainer/*.sh and tests/special_e2e/run_dapo.sh
(the DAPO recipe itself moved to the verl-recipe repository). Every override the table
suggests validates on the CPU default (tests/config/test_verl_keys.py holds that).
"""

from __future__ import annotations

import re
from typing import Any

from rlpost.config.peer_rows import HIDDEN, read_row, readings_issue
from rlpost.config.peer_rows import overrides as overrides
from rlpost.config.verl_values import (
    KL_TYPES,
    Line,
    VerlKey,
    choice,
    clip_fallback,
    dynamic_batch,
    estimator,
    eval_set,
    every,
    filter_groups,
    gen_batch_limit,
    greedy_eval,
    gspo,
    kl_in_reward,
    kl_loss,
    kl_reward_coef,
    loggers,
    low_clip,
    per_rollout,
    prompts,
    recompute,
    resume,
    reward_function,
    static_micro_batch,
    times_n,
    token_cap,
    untruncated,
    wandb,
)
from rlpost.errors import Issue, Location

# verl's top-level sections that rlpost has no section of the same name for
SECTIONS = frozenset(
    {
        "actor_rollout_ref",
        "data",
        "algorithm",
        "critic",
        "reward_model",
        "reward_manager",
        "custom_reward_function",
        "global_profiler",
        "ray_kwargs",
        "transfer_queue",
    }
)
SECRET = re.compile(r"api_key|secret|password|(^|[._])token$")


A = "actor_rollout_ref.actor"
R = "actor_rollout_ref.rollout"
LOG_PROB = (
    "rlpost computes log-probs in the train micro-batches: recipe.train.micro_batch_size, or "
    "recipe.train.max_tokens_per_gpu with use_dynamic_batch_size"
)
REF = "the reference model follows the policy's layout (layout.train); it has no setting of its own"
REWARD_SHAPE = (
    "verl's compute_score(data_source, solution_str, ground_truth, extra_info=None) works as "
    "it is: rlpost calls it as verl does, with the row's data_source column, the response, "
    "the label (recipe.data.label_key=reward_model.ground_truth) and the row's extra_info "
    "(recipe.data.metadata_key=extra_info), and a dict it returns gives its 'score'"
)
NO_VLLM = "rlpost's engines are SGLang servers on GPUs and its CPU engine on hardware kind cpu"

TABLE: tuple[VerlKey, ...] = (
    # data: prompts, lengths, batch
    VerlKey(
        "data.train_files",
        "recipe.data.prompt_data",
        "one jsonl or parquet file; verl's preprocessed files keep the prompt in 'prompt' "
        "and the answer in reward_model.ground_truth: recipe.data.input_key=prompt "
        "recipe.data.label_key=reward_model.ground_truth",
        prompts,
        "merge the files into one (rlpost reads one training file) and write "
        "recipe.data.prompt_data=/path/train.parquet",
    ),
    VerlKey(
        "data.val_files",
        "recipe.eval.datasets",
        "a list of named jsonl or parquet sets",
        eval_set,
        "write recipe.eval.datasets='[{name: val, path: /path/val.parquet}]'",
    ),
    VerlKey("data.prompt_key", "recipe.data.input_key", "", example="prompt"),
    VerlKey(
        "data.max_prompt_length",
        "recipe.data.max_prompt_len",
        "longer prompts are dropped, as verl's filter_overlong_prompts does",
        example=256,
    ),
    VerlKey("data.max_response_length", "recipe.rollout.max_response_len", "", example=32),
    VerlKey(
        "data.train_batch_size",
        "recipe.rollout.batch_size",
        "prompts per rollout in both",
        example=8,
    ),
    VerlKey(
        "data.gen_batch_size",
        "recipe.rollout.over_sampling_batch_size",
        "prompts drawn per generation batch in both; read with a dynamic_sampling_filter",
        example=8,
    ),
    VerlKey("data.shuffle", "recipe.data.shuffle", "", example=True),
    VerlKey("data.seed", "recipe.data.seed", "", example=1),
    VerlKey(
        "data.filter_overlong_prompts",
        None,
        "rlpost always drops prompts over recipe.data.max_prompt_len",
    ),
    VerlKey(
        "data.truncation",
        None,
        "rlpost drops prompts over recipe.data.max_prompt_len and truncates none",
    ),
    # the model
    VerlKey(
        "actor_rollout_ref.model.path",
        "model.hf_checkpoint",
        "the HF folder of the weights and tokenizer; its architecture is the model group's "
        "(model=qwen3-4b)",
        example="${asset:qwen3-tiny}",
    ),
    VerlKey(
        "actor_rollout_ref.model.enable_gradient_checkpointing",
        "layout.train.recompute.granularity",
        "",
        recompute,
        example=False,
    ),
    VerlKey(
        "actor_rollout_ref.model.use_remove_padding",
        None,
        "rlpost's trainers pack samples without padding; there is no switch",
    ),
    VerlKey(
        "actor_rollout_ref.model.use_fused_kernels",
        None,
        "rlpost uses the fused kernels that are installed, with a torch fallback; there is "
        "no switch",
    ),
    # the rollout
    VerlKey(f"{R}.n", "recipe.rollout.n_samples_per_prompt", "samples per prompt", example=8),
    VerlKey(f"{R}.temperature", "recipe.rollout.temperature", "", example=1.0),
    VerlKey(
        f"{R}.top_p",
        "recipe.rollout.top_p",
        "rlpost samples rollouts untruncated (top_p 1.0): the trainer scores each token "
        "under the full softmax; evaluation may truncate (recipe.eval.top_p)",
        untruncated("recipe.rollout.top_p", 1.0),
        "drop it; to truncate evaluation's sampling, write recipe.eval.top_p",
        example=1.0,
    ),
    VerlKey(
        f"{R}.top_k",
        "recipe.rollout.top_k",
        "rlpost samples rollouts untruncated (top_k -1): the trainer scores each token "
        "under the full softmax; evaluation may truncate (recipe.eval.top_k)",
        untruncated("recipe.rollout.top_k", -1),
        "drop it; to truncate evaluation's sampling, write recipe.eval.top_k",
        example=-1,
    ),
    VerlKey(f"{R}.val_kwargs.temperature", "recipe.eval.temperature", "", example=1.0),
    VerlKey(f"{R}.val_kwargs.top_p", "recipe.eval.top_p", "", example=0.7),
    VerlKey(f"{R}.val_kwargs.n", "recipe.eval.n_samples_per_prompt", "", example=1),
    VerlKey(
        f"{R}.val_kwargs.do_sample",
        "recipe.eval.temperature",
        "rlpost decodes evaluation greedily when recipe.eval.temperature is unset",
        greedy_eval,
        example=False,
    ),
    VerlKey(
        f"{R}.gpu_memory_utilization",
        "layout.rollout.sglang.mem_fraction_static",
        "SGLang's fraction of GPU memory for weights and KV cache, as vLLM's is",
        example=0.6,
    ),
    VerlKey(
        f"{R}.tensor_model_parallel_size",
        "layout.rollout.gpus_per_engine",
        "an engine's tensor parallelism is its GPU count",
        example=1,
    ),
    VerlKey(
        f"{R}.max_num_seqs",
        "layout.rollout.sglang.max_running_requests",
        "requests an engine runs at once",
        example=64,
    ),
    VerlKey(f"{R}.name", None, NO_VLLM),
    VerlKey(f"{R}.mode", None, "rlpost's engines are always servers that take requests"),
    VerlKey(
        f"{R}.enforce_eager", None, "SGLang's own setting: layout.rollout.sglang.disable_cuda_graph"
    ),
    VerlKey(
        f"{R}.free_cache_engine",
        None,
        "colocated engines release their memory for training by themselves (engine.offload)",
    ),
    VerlKey(
        f"{R}.enable_chunked_prefill",
        None,
        "SGLang chunks prefills by default (layout.rollout.sglang.chunked_prefill_size)",
    ),
    VerlKey(f"{R}.log_prob_micro_batch_size_per_gpu", None, LOG_PROB),
    VerlKey(f"{R}.log_prob_use_dynamic_bsz", None, LOG_PROB),
    VerlKey(f"{R}.log_prob_max_token_len_per_gpu", None, LOG_PROB),
    VerlKey("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", None, LOG_PROB),
    VerlKey("actor_rollout_ref.ref.log_prob_use_dynamic_bsz", None, LOG_PROB),
    VerlKey("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", None, LOG_PROB),
    VerlKey("actor_rollout_ref.ref.fsdp_config.param_offload", None, REF),
    VerlKey("actor_rollout_ref.ref.ulysses_sequence_parallel_size", None, REF),
    # the actor: batches
    VerlKey(
        f"{A}.ppo_mini_batch_size",
        "recipe.train.global_batch_size",
        "verl counts prompts per optimizer step, rlpost samples: times actor_rollout_ref.rollout.n",
        times_n("recipe.train.global_batch_size"),
        "write recipe.train.global_batch_size=<this value x actor_rollout_ref.rollout.n> "
        "(add actor_rollout_ref.rollout.n to this command line, or multiply by "
        "recipe.rollout.n_samples_per_prompt)",
        example=8,
    ),
    VerlKey(
        f"{A}.ppo_micro_batch_size_per_gpu",
        "recipe.train.micro_batch_size",
        "samples per micro-batch on each GPU in both; rlpost reads it when it does not "
        "pack micro-batches by tokens",
        static_micro_batch,
        example=2,
    ),
    VerlKey(
        f"{A}.use_dynamic_bsz",
        "recipe.train.use_dynamic_batch_size",
        "micro-batches packed up to recipe.train.max_tokens_per_gpu tokens",
        dynamic_batch,
        example=True,
    ),
    VerlKey(
        f"{A}.ppo_max_token_len_per_gpu",
        "recipe.train.max_tokens_per_gpu",
        "tokens per micro-batch on each GPU in both, read with use_dynamic_batch_size",
        token_cap,
        example=4096,
    ),
    VerlKey(f"{A}.ppo_epochs", None, "rlpost trains on each rollout's samples once"),
    # the actor: optimizer
    VerlKey(f"{A}.optim.lr", "recipe.optim.lr", "", example=1e-6),
    VerlKey(
        f"{A}.optim.lr_warmup_steps",
        "recipe.optim.lr_warmup_steps",
        "verl steps its learning-rate schedule once a training step (a rollout), rlpost once "
        "an optimizer step: times the mini-batches of a rollout (data.train_batch_size / "
        "ppo_mini_batch_size); verl's -1 defers to lr_warmup_steps_ratio",
        per_rollout("recipe.optim.lr_warmup_steps"),
        "write recipe.optim.lr_warmup_steps=<this value x data.train_batch_size / "
        "actor_rollout_ref.actor.ppo_mini_batch_size> (add both to this command line to have "
        "it computed)",
        example=10,
    ),
    VerlKey(
        f"{A}.optim.lr_warmup_steps_ratio",
        "recipe.optim.lr_warmup_steps",
        "rlpost counts warmup in optimizer steps, not as a share of them",
        lambda value, line: () if not value else None,
        "write recipe.optim.lr_warmup_steps=<the ratio x the run's optimizer steps> "
        "(`launch.py mode=plan` prints the steps)",
    ),
    VerlKey(f"{A}.optim.weight_decay", "recipe.optim.weight_decay", "", example=0.1),
    VerlKey(f"{A}.optim.clip_grad", "recipe.optim.clip_grad", "", example=1.0),
    VerlKey(f"{A}.grad_clip", "recipe.optim.clip_grad", "", example=1.0),
    VerlKey(
        f"{A}.fsdp_config.param_offload",
        "layout.train.fsdp.cpu_offload",
        "FSDP2's CPU offload of parameters, gradients and optimizer state together",
        example=False,
    ),
    VerlKey(
        f"{A}.fsdp_config.optimizer_offload",
        "layout.train.fsdp.cpu_offload",
        "FSDP2's CPU offload of parameters, gradients and optimizer state together",
        example=False,
    ),
    VerlKey(
        f"{A}.ulysses_sequence_parallel_size",
        "layout.train.cp",
        "rlpost splits long sequences with context parallelism, not Ulysses' all-to-all",
        example=1,
    ),
    VerlKey(f"{A}.megatron.tensor_model_parallel_size", "layout.train.tp", "", example=1),
    VerlKey(f"{A}.megatron.pipeline_model_parallel_size", "layout.train.pp", "", example=1),
    VerlKey(f"{A}.megatron.context_parallel_size", "layout.train.cp", "", example=1),
    VerlKey(f"{A}.megatron.expert_model_parallel_size", "layout.train.ep", "", example=1),
    VerlKey(f"{A}.megatron.expert_tensor_parallel_size", "layout.train.etp", "", example=1),
    VerlKey(f"{A}.use_torch_compile", None, "rlpost has no switch for torch.compile"),
    # the actor: the loss
    VerlKey(
        f"{A}.clip_ratio",
        "recipe.algo.eps_clip",
        "verl's PPO loss reads it only where clip_ratio_low or clip_ratio_high is null (both "
        "are 0.2 unless set)",
        clip_fallback,
        example=0.2,
    ),
    VerlKey(
        f"{A}.clip_ratio_low",
        "recipe.algo.eps_clip",
        "the low epsilon; verl's high one stays clip_ratio_high (0.2 unless set), rlpost's "
        "follows eps_clip unless recipe.algo.eps_clip_high is set",
        low_clip,
        example=0.2,
    ),
    VerlKey(f"{A}.clip_ratio_high", "recipe.algo.eps_clip_high", "", example=0.28),
    VerlKey(
        f"{A}.clip_ratio_c",
        "recipe.algo.eps_clip_c",
        "dual-clip's bound, > 1 in both; verl's PPO loss always dual-clips (3.0 unless set), "
        "rlpost's only with eps_clip_c set",
        example=3.0,
    ),
    VerlKey(
        f"{A}.loss_agg_mode",
        "recipe.algo.loss_reduction",
        "token-mean is token_mean, seq-mean-token-mean is sample_mean; rlpost has no "
        "seq-mean-token-sum or seq-mean-token-sum-norm (a constant divisor)",
        choice(
            "recipe.algo.loss_reduction",
            {"token-mean": "token_mean", "seq-mean-token-mean": "sample_mean"},
        ),
        "write recipe.algo.loss_reduction=token_mean or =sample_mean, or drop it",
        example="token-mean",
    ),
    VerlKey(f"{A}.entropy_coeff", "recipe.algo.entropy_coef", "", example=0.0),
    VerlKey(
        f"{A}.use_kl_loss",
        "recipe.algo.use_kl_loss",
        "with verl's weight and estimator where kl_loss_coef and kl_loss_type are not on this "
        "command line (0.001 and low_var_kl): rlpost's kl_loss_coef defaults to 0, which "
        "weighs nothing",
        kl_loss,
        example=True,
    ),
    VerlKey(f"{A}.kl_loss_coef", "recipe.algo.kl_loss_coef", "", example=0.001),
    VerlKey(
        f"{A}.kl_loss_type",
        "recipe.algo.kl_loss_type",
        "verl's kl is k1, mse is k2; rlpost has no abs, full or straight-through (+) form",
        choice("recipe.algo.kl_loss_type", KL_TYPES),
        "write recipe.algo.kl_loss_type= one of k1, k2, k3, low_var_kl",
        example="low_var_kl",
    ),
    VerlKey(
        f"{A}.policy_loss.loss_mode",
        "recipe.algo.advantage_estimator",
        "rlpost's gspo is an estimator with its own sequence-level loss; vanilla is the "
        "PPO clip loss it always uses",
        gspo,
        "drop it: rlpost's loss is the PPO clip loss (or gspo's: "
        "recipe.algo.advantage_estimator=gspo)",
        example="vanilla",
    ),
    # the algorithm
    VerlKey(
        "algorithm.adv_estimator",
        "recipe.algo.advantage_estimator",
        "rlpost's estimators are grpo, gspo, reinforce_plus_plus and "
        "reinforce_plus_plus_baseline; with no critic, no gae",
        estimator,
        "write recipe.algo.advantage_estimator= one of grpo, gspo, "
        "reinforce_plus_plus, reinforce_plus_plus_baseline",
        example="grpo",
    ),
    VerlKey(
        "algorithm.norm_adv_by_std_in_grpo", "recipe.algo.grpo_std_normalization", "", example=True
    ),
    VerlKey("algorithm.gamma", "recipe.algo.gamma", "read by reinforce_plus_plus", example=1.0),
    VerlKey(
        "algorithm.use_kl_in_reward",
        "recipe.algo.kl_coef",
        "rlpost puts a KL in the reward when recipe.algo.kl_coef > 0, with a "
        "reinforce_plus_plus estimator only; with grpo the KL goes in the loss "
        "(recipe.algo.use_kl_loss)",
        kl_in_reward,
        "write recipe.algo.kl_coef=<algorithm.kl_ctrl.kl_coef> with "
        "recipe.algo.advantage_estimator=reinforce_plus_plus; with grpo, weigh the KL in the "
        "loss: recipe.algo.use_kl_loss=true recipe.algo.kl_loss_coef=...",
        example=True,
    ),
    VerlKey(
        "algorithm.kl_ctrl.kl_coef",
        "recipe.algo.kl_coef",
        "the KL in the reward, which rlpost puts there with a reinforce_plus_plus estimator "
        "only; verl reads it only with use_kl_in_reward=True",
        kl_reward_coef,
        "with grpo, weigh the KL in the loss instead: recipe.algo.use_kl_loss=true "
        "recipe.algo.kl_loss_coef=<the value>; with reinforce_plus_plus, "
        "recipe.algo.kl_coef=<the value>",
        example=0.001,
    ),
    VerlKey(
        "algorithm.filter_groups.enable",
        "recipe.rollout.dynamic_sampling_filter",
        "DAPO's filter of groups whose rewards are all equal",
        filter_groups,
        example=True,
    ),
    VerlKey(
        "algorithm.filter_groups.metric",
        None,
        "rlpost.filters.check_reward_nonzero_std filters on the reward; another metric is a "
        "filter function of your own (recipe.rollout.dynamic_sampling_filter)",
    ),
    VerlKey(
        "algorithm.filter_groups.max_num_gen_batches",
        "recipe.rollout.max_draws_per_rollout",
        "draws of recipe.rollout.over_sampling_batch_size prompts (verl's gen_batch_size); "
        "verl's 0 (no limit) is null, and verl reads it only with filter_groups.enable",
        gen_batch_limit,
        example=10,
    ),
    # rewards
    VerlKey(
        "reward_model.reward_manager",
        None,
        "rlpost scores with recipe.rollout.reward.type (math, f1, ..., or custom_function)",
    ),
    VerlKey(
        "reward_model.overlong_buffer.enable",
        None,
        "rlpost has no overlong penalty; a reward function of your own "
        "(recipe.rollout.reward.custom_function) can subtract one",
    ),
    VerlKey("reward_model.overlong_buffer.len", None, "rlpost has no overlong penalty"),
    VerlKey("reward_model.overlong_buffer.penalty_factor", None, "rlpost has no overlong penalty"),
    VerlKey(
        "custom_reward_function.path",
        "recipe.rollout.reward.custom_function",
        f"{REWARD_SHAPE}; rlpost names it by dotted path (module.function), with the file's "
        "folder on PYTHONPATH, and imports and checks it at validation",
        reward_function,
        "put the file's folder on PYTHONPATH and write "
        "recipe.rollout.reward.custom_function=module.function (my_reward.py's "
        "compute_score: my_reward.compute_score; a file's name that is no Python identifier "
        "cannot be imported: rename it)",
    ),
    VerlKey(
        "custom_reward_function.name",
        "recipe.rollout.reward.custom_function",
        f"the function's name ends rlpost's dotted path (module.function); {REWARD_SHAPE}",
        reward_function,
        "write recipe.rollout.reward.custom_function=module.function, the module being the "
        "file's name (my_reward.py's compute_score: my_reward.compute_score)",
    ),
    # the trainer: schedule, checkpoints, logging, cluster
    VerlKey(
        "trainer.total_training_steps",
        "recipe.rollout.num_rollout",
        "a verl training step is one rollout",
        example=5,
    ),
    VerlKey(
        "trainer.total_epochs",
        "recipe.rollout.num_rollout",
        "rlpost counts rollouts, not passes over the data",
        lambda value, line: None,
        "write recipe.rollout.num_rollout=<epochs x the prompts in the data / "
        "recipe.rollout.batch_size>",
    ),
    VerlKey(
        "trainer.test_freq",
        "recipe.eval.interval",
        "in rollouts; null for never",
        every("recipe.eval.interval"),
        example=5,
    ),
    VerlKey(
        "trainer.save_freq",
        "recipe.save.interval",
        "in rollouts; null for never",
        every("recipe.save.interval"),
        example=-1,
    ),
    VerlKey(
        "trainer.val_before_train",
        "recipe.eval.skip_before_train",
        "the opposite sense",
        lambda value, line: (("recipe.eval.skip_before_train", not value),),
        example=False,
    ),
    VerlKey("trainer.balance_batch", "recipe.train.balance_data", "", example=True),
    VerlKey(
        "trainer.logger",
        "tracking.wandb.enabled",
        "rlpost always writes metrics.jsonl and the console; wandb and TensorBoard are switches",
        loggers,
        example=["console"],
    ),
    VerlKey(
        "trainer.project_name",
        "tracking.wandb.project",
        "wandb's project",
        wandb("tracking.wandb.project"),
        example="verl_examples",
    ),
    VerlKey(
        "trainer.experiment_name",
        "tracking.wandb.group",
        "rlpost names a run by its directory (run.dir); a wandb group gathers runs",
        wandb("tracking.wandb.group"),
        example="gsm8k",
    ),
    VerlKey(
        "trainer.default_local_dir",
        "run.dir",
        "checkpoints go under <run.dir>/ckpt",
        example="/tmp/rlpost-verl-run",
    ),
    VerlKey(
        "trainer.resume_mode",
        "run.resume",
        "auto resumes the run in run.dir",
        resume,
        "write run.resume=auto, or run.resume=<run.dir>/ckpt/rollout_<n> (a checkpoint "
        "of rlpost's; a verl checkpoint is not one)",
        example="auto",
    ),
    VerlKey(
        "trainer.n_gpus_per_node",
        "hardware.gpus_per_node",
        "a hardware profile says it (hardware=h100x8: one node of 8); this overrides the "
        "chosen profile's count",
        example=2,
    ),
    VerlKey(
        "trainer.nnodes",
        "hardware.num_nodes",
        "a hardware profile says it (hardware=h100x16: two nodes of 8); this overrides the "
        "chosen profile's count",
        example=1,
    ),
    VerlKey("trainer.critic_warmup", None, "rlpost has no critic: its estimators need none"),
    VerlKey(
        "trainer.log_val_generations",
        None,
        "rlpost logs each evaluation set's scores (eval/* in metrics.jsonl and the "
        "trackers) and writes no evaluation samples; run.dump_rollouts writes the training "
        "rollouts' samples",
    ),
    VerlKey("trainer.device", None, "the hardware profile's kind says it (hardware=cpu)"),
)

BY_KEY: dict[str, VerlKey] = {row.verl: row for row in TABLE}


def is_verl_key(path: str) -> bool:
    """Whether `path` (not a key of rlpost's) is one of verl's."""
    return path in BY_KEY or path.split(".", 1)[0] in SECTIONS


def _secret(path: str) -> bool:
    return SECRET.search(path.lower()) is not None


def section_issue(path: str, shown: Any, token: str, peers: str = "verl") -> Issue:
    """A key under one of verl's sections (`peers`: whose sections) that no table holds."""
    section = path.split(".", 1)[0]
    what = (
        "rlpost has no critic (no value model): its estimators use group baselines"
        if section == "critic"
        else f"{peers}'s section '{section}' has no counterpart of that name in rlpost"
    )
    fix = (
        "drop it"
        if section == "critic"
        else "find rlpost's setting with `rlpost show` (every key, with its value) and "
        "write it as key=value, or drop it"
    )
    head = f"{path} is {peers}'s key, not rlpost's"
    return Issue(
        key=path, value=shown, message=f"{head}: {what}", fix=fix, location=Location(override=token)
    )


def shown_value(path: str, value: Any, token: str, secret: bool = False) -> tuple[Any, str]:
    """The value and the token as an Issue shows them: a credential's as ***."""
    if (secret or _secret(path)) and value is not None:
        return HIDDEN, f"{path}={HIDDEN}"
    return value, token


def verl_issue(path: str, value: Any, line: Line, token: str) -> Issue:
    """The Issue for verl's key `path` given `value` (`line`: verl's keys on the command line)."""
    shown, token = shown_value(path, value, token)
    row = BY_KEY.get(path)
    if row is None:
        return section_issue(path, shown, token)
    reading = read_row("verl", row, shown, line)
    return readings_issue(path, "key", [reading], shown, token, tail=", not rlpost's")
