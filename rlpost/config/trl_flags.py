"""TRL's GRPO flags (`trl grpo --learning_rate 1e-6 --num_generations 8 ...`, GRPOConfig's
fields) on a launch's command line, answered with the rlpost key to write.

Each flag of the table below becomes an Issue naming rlpost's key and the override to write,
with the value converted where the two differ, or says that rlpost has no such setting, what
it does instead, and to drop it. The units differ most in the batch: TRL's is
--per_device_train_batch_size x --gradient_accumulation_steps x the processes, counted in
completions (rlpost's samples: recipe.train.global_batch_size), and a rollout is that many
completions, --num_generations (the group size) per prompt.

The fields are GRPOConfig's (trl/trainer/grpo_config.py, with transformers' TrainingArguments
and trl's ModelConfig and ScriptArguments, which `trl grpo` also parses) in trl 1.16.0, the
version pyproject's `bench` extra pins. Every override the table suggests validates on the CPU
default (tests/config/test_trl_flags.py).
"""

from __future__ import annotations

from typing import Any

from rlpost.config.peer_rows import (
    Line,
    Pairs,
    PeerRow,
    recompute,
    static_micro_batch,
    untruncated,
)

NO_VLLM = "rlpost's engines are SGLang servers on GPUs and its CPU engine on hardware kind cpu"
PER_DEVICE = "per_device_train_batch_size"
ACCUMULATION = "gradient_accumulation_steps"
BATCH_HOW = (
    "write recipe.train.global_batch_size=<per_device_train_batch_size x "
    "gradient_accumulation_steps x the GPUs> and recipe.rollout.batch_size=<that / "
    "num_generations> (the prompts of one generation batch)"
)


def _loss_type(value: Any, line: Line) -> Pairs | None:
    if value == "grpo":
        return (("recipe.algo.loss_reduction", "sample_mean"),)
    if value in ("dapo", "bnpo"):
        return (("recipe.algo.loss_reduction", "token_mean"),)
    return None


def _beta(value: Any, line: Line) -> Pairs:
    if not value:
        return (("recipe.algo.use_kl_loss", False),)
    return (
        ("recipe.algo.use_kl_loss", True),
        ("recipe.algo.kl_loss_coef", value),
        ("recipe.algo.kl_loss_type", "k3"),
    )


def _scale_rewards(value: Any, line: Line) -> Pairs | None:
    if value in (True, "group"):
        return (("recipe.algo.grpo_std_normalization", True),)
    if value in (False, "none"):
        return (("recipe.algo.grpo_std_normalization", False),)
    return None  # batch


def _report_to(value: Any, line: Line) -> Pairs:
    names = value if isinstance(value, list) else [value]
    return (
        ("tracking.wandb.enabled", "wandb" in names or "all" in names),
        ("tracking.tensorboard", "tensorboard" in names or "all" in names),
    )


TABLE: tuple[PeerRow, ...] = (
    PeerRow(
        "model_name_or_path",
        "model.hf_checkpoint",
        "the HF folder of the weights and tokenizer; its architecture is the model group's "
        "(model=qwen3-4b)",
        example="${asset:qwen3-tiny}",
    ),
    PeerRow(
        "dataset_name",
        "recipe.data.prompt_data",
        "a jsonl file, one prompt a line; rlpost names no dataset of the Hub",
        lambda value, line: None,
        "write the dataset's prompts to jsonl and write recipe.data.prompt_data=/path/train.jsonl; "
        "recipe.data.input_key names the prompt's field (TRL's: prompt)",
    ),
    PeerRow(
        "learning_rate",
        "recipe.optim.lr",
        "TRL decays it linearly to 0 by the run's end by default (--lr_scheduler_type "
        "linear), rlpost holds it constant unless recipe.optim.lr_decay_style (linear, with "
        "lr_decay_steps) says",
        example=1e-6,
    ),
    PeerRow("weight_decay", "recipe.optim.weight_decay", "", example=0.01),
    PeerRow("max_grad_norm", "recipe.optim.clip_grad", "", example=1.0),
    PeerRow(
        "warmup_steps",
        "recipe.optim.lr_warmup_steps",
        "optimizer steps in both; a value below 1 is TRL's share of the run, which rlpost "
        "does not take",
        lambda value, line: (
            (("recipe.optim.lr_warmup_steps", int(value)),) if value >= 1 or value == 0 else None
        ),
        "write recipe.optim.lr_warmup_steps=<the share x the run's optimizer steps> "
        "(`launch.py mode=plan` prints the steps)",
        example=10,
    ),
    PeerRow(
        "warmup_ratio",
        "recipe.optim.lr_warmup_steps",
        "rlpost counts warmup in optimizer steps, not as a share of them",
        lambda value, line: () if not value else None,
        "write recipe.optim.lr_warmup_steps=<the ratio x the run's optimizer steps> "
        "(`launch.py mode=plan` prints the steps)",
    ),
    PeerRow(
        "num_generations",
        "recipe.rollout.n_samples_per_prompt",
        "the group size: completions per prompt in both",
        example=8,
    ),
    PeerRow(
        PER_DEVICE,
        "recipe.train.micro_batch_size",
        "completions per micro-batch on each GPU; TRL's optimizer step is this x "
        "gradient_accumulation_steps x the GPUs (recipe.train.global_batch_size)",
        static_micro_batch,
        example=2,
    ),
    PeerRow(
        ACCUMULATION,
        "recipe.train.global_batch_size",
        "rlpost counts the optimizer step's samples, not micro-batches: "
        "per_device_train_batch_size x this x the GPUs",
        lambda value, line: None,
        BATCH_HOW,
    ),
    PeerRow("max_completion_length", "recipe.rollout.max_response_len", "", example=32),
    PeerRow(
        "max_prompt_length",
        "recipe.data.max_prompt_len",
        "longer prompts are dropped, not truncated (trl 1.16's GRPOConfig has no such field)",
        example=256,
    ),
    PeerRow("temperature", "recipe.rollout.temperature", "the rollouts' sampling", example=1.0),
    PeerRow(
        "top_p",
        "recipe.rollout.top_p",
        "rlpost samples rollouts untruncated (top_p 1.0): the trainer scores each token under "
        "the full softmax; evaluation may truncate (recipe.eval.top_p)",
        untruncated(1.0),
        "drop it; to truncate evaluation's sampling, write recipe.eval.top_p",
        example=1.0,
    ),
    PeerRow(
        "top_k",
        "recipe.rollout.top_k",
        "rlpost samples rollouts untruncated (TRL's 0, rlpost's -1)",
        lambda value, line: () if value in (0, -1, None) else None,
        "drop it; to truncate evaluation's sampling, write recipe.eval.top_k",
        example=0,
    ),
    PeerRow(
        "beta",
        "recipe.algo.kl_loss_coef",
        "the KL to the reference in the loss (TRL's estimator is k3); TRL's default 0.0 loads "
        "no reference, as rlpost's default does",
        _beta,
        example=0.04,
    ),
    PeerRow("epsilon", "recipe.algo.eps_clip", "an epsilon in both", example=0.2),
    PeerRow("epsilon_high", "recipe.algo.eps_clip_high", "an epsilon in both", example=0.28),
    PeerRow(
        "loss_type",
        "recipe.algo.loss_reduction",
        "grpo averages each completion's tokens (sample_mean); dapo and bnpo average the "
        "batch's tokens (token_mean: rlpost's is over the optimizer step, dapo's, where bnpo's "
        "is over the micro-batch); rlpost has no dr_grpo (a constant divisor: nearest "
        "token_mean), cispo, sapo, luspo or vespo",
        _loss_type,
        "write recipe.algo.loss_reduction=token_mean or =sample_mean, or drop it",
        example="dapo",
    ),
    PeerRow(
        "scale_rewards",
        "recipe.algo.grpo_std_normalization",
        "group divides by the group's reward std, none by nothing; rlpost has no batch scaling",
        _scale_rewards,
        "write recipe.algo.grpo_std_normalization=true (group) or =false (none)",
        example="group",
    ),
    PeerRow(
        "mask_truncated_completions",
        None,
        "rlpost trains on truncated samples as they are (their loss is not masked)",
    ),
    PeerRow("num_iterations", None, "rlpost trains on each rollout's samples once"),
    PeerRow(
        "importance_sampling_level",
        "recipe.algo.advantage_estimator",
        "rlpost's sequence-level ratios are gspo's, an estimator with its own loss",
        lambda value, line: (
            () if value == "token" else (("recipe.algo.advantage_estimator", "gspo"),)
        ),
        example="token",
    ),
    PeerRow("entropy_coef", "recipe.algo.entropy_coef", "", example=0.0),
    PeerRow("use_vllm", None, NO_VLLM),
    PeerRow(
        "vllm_mode",
        None,
        "rlpost's engines are servers; layout.colocate puts them on the training GPUs",
    ),
    PeerRow(
        "vllm_gpu_memory_utilization",
        "layout.rollout.sglang.mem_fraction_static",
        "SGLang's fraction of GPU memory for weights and KV cache, as vLLM's is",
        example=0.6,
    ),
    PeerRow(
        "vllm_tensor_parallel_size",
        "layout.rollout.gpus_per_engine",
        "an engine's tensor parallelism is its GPU count",
        example=1,
    ),
    PeerRow(
        "num_train_epochs",
        "recipe.rollout.num_rollout",
        "rlpost counts rollouts, not passes over the data",
        lambda value, line: None,
        "write recipe.rollout.num_rollout=<epochs x the prompts in the data / "
        "recipe.rollout.batch_size>",
    ),
    PeerRow(
        "max_steps",
        "recipe.rollout.num_rollout",
        "one optimizer step is one generation batch, one rollout, with num_iterations 1 and "
        "steps_per_generation unset (TRL's defaults)",
        example=5,
    ),
    PeerRow(
        "output_dir",
        "run.dir",
        "checkpoints go under <run.dir>/ckpt",
        example="/tmp/rlpost-trl-run",
    ),
    PeerRow(
        "save_steps",
        "recipe.save.interval",
        "in optimizer steps, one a rollout with num_iterations 1 and steps_per_generation "
        "unset (TRL's defaults)",
        lambda value, line: (("recipe.save.interval", int(value)),) if value >= 1 else None,
        "write recipe.save.interval=<rollouts between checkpoints> (a ratio of the run is no "
        "interval of rlpost's)",
        example=10,
    ),
    PeerRow("logging_steps", None, "rlpost logs every rollout"),
    PeerRow("seed", "run.seed", "", example=42),
    PeerRow("bf16", None, "the model group's params_dtype says it (bf16)"),
    PeerRow(
        "gradient_checkpointing", "layout.train.recompute.granularity", "", recompute, example=True
    ),
    PeerRow(
        "report_to",
        "tracking.wandb.enabled",
        "rlpost always writes metrics.jsonl and the console; wandb and TensorBoard are switches",
        _report_to,
        example="none",
    ),
    PeerRow(
        "run_name",
        "tracking.wandb.group",
        "rlpost names a run by its directory (run.dir); a wandb group gathers runs",
        lambda value, line: (("tracking.wandb.enabled", True), ("tracking.wandb.group", value)),
        example="grpo",
    ),
    PeerRow("use_peft", None, "rlpost trains every weight; it has no LoRA"),
    PeerRow("push_to_hub", None, "rlpost saves to run.dir; upload with huggingface-cli"),
    PeerRow(
        "hub_token",
        None,
        "rlpost uploads nothing; huggingface_hub reads HF_TOKEN from the environment",
        secret=True,
    ),
)
