"""NeMo-RL's config keys on a launch's command line, answered with the rlpost key to write.

NeMo-RL's examples take OmegaConf overrides (`python examples/run_grpo_math.py
grpo.num_prompts_per_step=32 policy.train_global_batch_size=512`), so its users write its
keys here. Each key of the table below becomes an Issue naming rlpost's key and the override
to write, with the value converted where the two count differently (NeMo-RL caps prompt and
response together with policy.max_total_sequence_length, rlpost each on its own), or says
that rlpost has no such setting, what it does instead, and to drop it.

The keys are those NeMo-RL's GRPO configs and their users set, read at NVIDIA-NeMo/RL commit
7ea279abfbeb698b092856d0dab61e7cf39bc909 (2026-08-22): examples/configs/grpo_math_1B.yaml and
the loss's config (ClippedPGLossConfig, nemo_rl/algorithms/loss/loss_functions.py). Every
override the table suggests validates on the CPU default (tests/config/test_nemo_rl_keys.py).
"""

from __future__ import annotations

from typing import Any

from rlpost.config.peer_rows import (
    Convert,
    Line,
    Pairs,
    PeerRow,
    choice,
    every,
    recompute,
    static_micro_batch,
    switch,
    token_cap,
    untruncated,
)

# NeMo-RL's top-level sections; `data` is verl's as well (rlpost.config.peer_keys)
SECTIONS = frozenset(
    {
        "policy",
        "grpo",
        "loss_fn",
        "checkpointing",
        "logger",
        "cluster",
        "env",
        "data",
        "reward_penalties",
        "data_plane",
    }
)
G = "policy.generation"
V = f"{G}.vllm_cfg"
M = "policy.megatron_cfg"
D = "policy.dtensor_cfg"
TOTAL = "policy.max_total_sequence_length"
PROMPT = "data.max_input_seq_length"
NO_VLLM = "rlpost's engines are SGLang servers on GPUs and its CPU engine on hardware kind cpu"
LOG_PROB = "rlpost computes log-probs in the train micro-batches (recipe.train.micro_batch_size)"


def _split_length(value: Any, line: Line) -> Pairs | None:
    """prompt + response (NeMo-RL's one cap) as rlpost's two caps, with the prompt's from
    data.max_input_seq_length on the same line."""
    prompt = line.get(PROMPT)
    if not isinstance(prompt, int) or not 0 < prompt < value:
        return None
    return (
        ("recipe.data.max_prompt_len", prompt),
        ("recipe.rollout.max_response_len", value - prompt),
    )


def _prompt_length(value: Any, line: Line) -> Pairs:
    total = line.get(TOTAL)
    if isinstance(total, int) and 0 < value < total:
        return _split_length(total, line) or ()
    return (("recipe.data.max_prompt_len", value),)


def _kl_loss(value: Any, line: Line) -> Pairs | None:
    if not value:
        return (("recipe.algo.use_kl_loss", False),)
    if line.get("loss_fn.use_kl_in_reward") is True:
        return None  # the KL goes in the reward then
    kind = line.get("loss_fn.reference_policy_kl_type", "k3")  # NeMo-RL's default
    return (
        ("recipe.algo.use_kl_loss", True),
        ("recipe.algo.kl_loss_coef", value),
        ("recipe.algo.kl_loss_type", kind if kind in ("k1", "k2", "k3") else "k3"),
    )


def _steps_per_rollout(line: Line) -> int | None:
    """Optimizer steps per GRPO step from the line: NeMo-RL steps its learning-rate schedule
    once a GRPO step (a rollout), rlpost once an optimizer step."""
    keys = ("grpo.num_prompts_per_step", "grpo.num_generations_per_prompt")
    counts = [line.get(key) for key in (*keys, "policy.train_global_batch_size")]
    ints = [v for v in counts if isinstance(v, int) and v > 0]
    if len(ints) != len(counts):
        return None
    prompts, n, batch = ints
    return prompts * n // batch if prompts * n % batch == 0 else None


def _in_steps(key: str) -> Convert:
    """A count of NeMo-RL's GRPO steps (its scheduler's ticks) as rlpost's optimizer steps."""

    def convert(value: Any, line: Line) -> Pairs | None:
        steps = _steps_per_rollout(line)
        return None if steps is None else ((key, value * steps),)

    return convert


STEPS_HOW = (
    "x grpo.num_prompts_per_step x grpo.num_generations_per_prompt / "
    "policy.train_global_batch_size> (add the three to this command line to have it computed)"
)


def _estimator(value: Any, line: Line) -> Pairs | None:
    """NeMo-RL's reinforce_plus_plus subtracts the group's mean unless minus_baseline=false:
    rlpost's reinforce_plus_plus_baseline."""
    if value == "grpo":
        return (("recipe.algo.advantage_estimator", "grpo"),)
    if value != "reinforce_plus_plus":
        return None
    centred = line.get("grpo.adv_estimator.minus_baseline", True)
    name = "reinforce_plus_plus_baseline" if centred else "reinforce_plus_plus"
    return (("recipe.algo.advantage_estimator", name),)


def _is_correction(value: Any, line: Line) -> Pairs | None:
    """NeMo-RL's weights are unbounded unless truncated_importance_sampling_type tis with a
    ratio bounds them; rlpost's tis always clamps (to [0, 2] unless set)."""
    if not value:
        return ()
    kind = line.get("loss_fn.truncated_importance_sampling_type")
    high = line.get("loss_fn.truncated_importance_sampling_ratio")
    if kind != "tis" or high is None:
        return None
    low = line.get("loss_fn.truncated_importance_sampling_ratio_min") or 0.0
    return (
        ("recipe.algo.off_policy_correction", "tis"),
        ("recipe.algo.tis_clip_low", low),
        ("recipe.algo.tis_clip_high", high),
    )


def _low_clip(value: Any, line: Line) -> Pairs:
    """NeMo-RL's high epsilon stays ratio_clip_max (0.2 unless set), where rlpost's follows
    eps_clip unless eps_clip_high is set."""
    high = line.get("loss_fn.ratio_clip_max", 0.2)
    pairs: Pairs = (("recipe.algo.eps_clip", value),)
    return pairs if high == value else (*pairs, ("recipe.algo.eps_clip_high", high))


def _min_lr(value: Any, line: Line) -> Pairs:
    if line.get(f"{M}.scheduler.lr_decay_style", "constant") == "constant":  # NeMo-RL's default
        return ()  # a constant rate never decays to it
    return (("recipe.optim.min_lr", value),)


def _decay_style(value: Any, line: Line) -> Pairs | None:
    if value not in ("constant", "linear", "cosine"):
        return None
    if value == "constant":
        return (("recipe.optim.lr_decay_style", value),)
    iters = line.get(f"{M}.scheduler.lr_decay_iters", 1000)  # grpo_math_1B.yaml's
    steps = _steps_per_rollout(line)
    if steps is None:
        return None
    return (("recipe.optim.lr_decay_style", value), ("recipe.optim.lr_decay_steps", iters * steps))


def _decay_steps(value: Any, line: Line) -> Pairs | None:
    if line.get(f"{M}.scheduler.lr_decay_style", "constant") == "constant":
        return ()  # a constant rate reads no decay steps
    return _in_steps("recipe.optim.lr_decay_steps")(value, line)


_filter = switch(
    "recipe.rollout.dynamic_sampling_filter", "rlpost.filters.check_reward_nonzero_std"
)


TABLE: tuple[PeerRow, ...] = (
    # the model, the batch, lengths
    PeerRow(
        "policy.model_name",
        "model.hf_checkpoint",
        "the HF folder of the weights and tokenizer; its architecture is the model group's "
        "(model=qwen3-4b)",
        example="${asset:qwen3-tiny}",
    ),
    PeerRow("policy.tokenizer.name", None, "rlpost reads the tokenizer from model.hf_checkpoint"),
    PeerRow(
        "grpo.num_prompts_per_step",
        "recipe.rollout.batch_size",
        "prompts per rollout in both",
        example=8,
    ),
    PeerRow(
        "grpo.num_generations_per_prompt",
        "recipe.rollout.n_samples_per_prompt",
        "samples per prompt in both",
        example=8,
    ),
    PeerRow(
        "policy.train_global_batch_size",
        "recipe.train.global_batch_size",
        "samples per optimizer step in both (num_prompts_per_step x num_generations_per_prompt "
        "for one step per rollout)",
        example=8,
    ),
    PeerRow(
        "policy.train_micro_batch_size",
        "recipe.train.micro_batch_size",
        "samples per micro-batch on each GPU in both; rlpost reads it when it does not pack "
        "micro-batches by tokens",
        static_micro_batch,
        example=2,
    ),
    PeerRow("policy.logprob_batch_size", None, LOG_PROB),
    PeerRow(
        TOTAL,
        "recipe.rollout.max_response_len",
        "NeMo-RL caps prompt + response together, rlpost each: recipe.data.max_prompt_len "
        "and recipe.rollout.max_response_len (this - data.max_input_seq_length)",
        _split_length,
        "write recipe.data.max_prompt_len=<the longest prompt> and "
        "recipe.rollout.max_response_len=<this value - that> (add data.max_input_seq_length "
        "to this command line to have them computed)",
    ),
    PeerRow(
        PROMPT,
        "recipe.data.max_prompt_len",
        "longer prompts are dropped",
        _prompt_length,
        example=256,
    ),
    PeerRow(
        "policy.dynamic_batching.enabled",
        "recipe.train.use_dynamic_batch_size",
        "micro-batches packed up to recipe.train.max_tokens_per_gpu tokens",
        example=True,
    ),
    PeerRow(
        "policy.dynamic_batching.train_mb_tokens",
        "recipe.train.max_tokens_per_gpu",
        "tokens per micro-batch on each GPU in both",
        token_cap,
        example=4096,
    ),
    PeerRow(
        "policy.sequence_packing.enabled",
        None,
        "rlpost's trainers pack samples without padding; there is no switch",
    ),
    PeerRow("policy.precision", None, "the model group's params_dtype says it (bf16)"),
    # the optimizer
    PeerRow("policy.optimizer.kwargs.lr", "recipe.optim.lr", "", example=1e-6),
    PeerRow("policy.optimizer.kwargs.weight_decay", "recipe.optim.weight_decay", "", example=0.01),
    PeerRow("policy.optimizer.kwargs.eps", "recipe.optim.adam_eps", "", example=1e-8),
    PeerRow("policy.max_grad_norm", "recipe.optim.clip_grad", "", example=1.0),
    PeerRow(f"{M}.optimizer.lr", "recipe.optim.lr", "", example=1e-6),
    PeerRow(
        f"{M}.optimizer.min_lr",
        "recipe.optim.min_lr",
        "read with a decaying rate (scheduler.lr_decay_style linear or cosine) in both",
        _min_lr,
        example=1e-7,
    ),
    PeerRow(f"{M}.optimizer.weight_decay", "recipe.optim.weight_decay", "", example=0.01),
    PeerRow(
        f"{M}.scheduler.lr_warmup_iters",
        "recipe.optim.lr_warmup_steps",
        "NeMo-RL steps its schedule once a GRPO step (a rollout), rlpost once an optimizer "
        "step: times the optimizer steps of a rollout; NeMo-RL warms up from "
        "scheduler.lr_warmup_init, rlpost from 0",
        _in_steps("recipe.optim.lr_warmup_steps"),
        f"write recipe.optim.lr_warmup_steps=<this value {STEPS_HOW}",
        example=10,
    ),
    PeerRow(
        f"{M}.scheduler.lr_decay_style",
        "recipe.optim.lr_decay_style",
        "constant, linear or cosine in both, decaying over scheduler.lr_decay_iters (1000 in "
        "grpo_math_1B.yaml), which NeMo-RL counts in GRPO steps (rollouts) and rlpost's "
        "lr_decay_steps in optimizer steps",
        _decay_style,
        "write recipe.optim.lr_decay_style= one of constant, linear, cosine, with "
        f"recipe.optim.lr_decay_steps=<scheduler.lr_decay_iters {STEPS_HOW}",
        example="cosine",
    ),
    PeerRow(
        f"{M}.scheduler.lr_decay_iters",
        "recipe.optim.lr_decay_steps",
        "read with a decaying rate; NeMo-RL counts GRPO steps (rollouts), rlpost optimizer "
        "steps: times the optimizer steps of a rollout",
        _decay_steps,
        f"write recipe.optim.lr_decay_steps=<this value {STEPS_HOW}",
        example=1000,
    ),
    # the trainer's layout
    PeerRow(
        f"{M}.enabled",
        "trainer.backend",
        "megatron trains with Megatron-core, torch with FSDP2 (NeMo-RL's DTensor path); auto "
        "picks by the model and hardware",
        lambda value, line: (("trainer.backend", "megatron" if value else "torch"),),
    ),
    PeerRow(f"{M}.tensor_model_parallel_size", "layout.train.tp", "", example=1),
    PeerRow(f"{M}.pipeline_model_parallel_size", "layout.train.pp", "", example=1),
    PeerRow(f"{M}.context_parallel_size", "layout.train.cp", "", example=1),
    PeerRow(f"{M}.expert_model_parallel_size", "layout.train.ep", "", example=1),
    PeerRow(
        f"{M}.activation_checkpointing",
        "layout.train.recompute.granularity",
        "",
        recompute,
        example=False,
    ),
    PeerRow(f"{D}.tensor_parallel_size", "layout.train.tp", "", example=1),
    PeerRow(f"{D}.context_parallel_size", "layout.train.cp", "", example=1),
    PeerRow(
        f"{D}.activation_checkpointing",
        "layout.train.recompute.granularity",
        "",
        recompute,
        example=False,
    ),
    PeerRow(
        f"{D}.cpu_offload",
        "layout.train.fsdp.cpu_offload",
        "FSDP2's CPU offload of parameters, gradients and optimizer state together",
        example=False,
    ),
    # generation
    PeerRow(f"{G}.backend", None, NO_VLLM),
    PeerRow(f"{G}.temperature", "recipe.rollout.temperature", "", example=1.0),
    PeerRow(
        f"{G}.top_p",
        "recipe.rollout.top_p",
        "rlpost samples rollouts untruncated (top_p 1.0): the trainer scores each token under "
        "the full softmax; evaluation may truncate (recipe.eval.top_p)",
        untruncated(1.0),
        "drop it; to truncate evaluation's sampling, write recipe.eval.top_p",
        example=1.0,
    ),
    PeerRow(
        f"{G}.top_k",
        "recipe.rollout.top_k",
        "rlpost samples rollouts untruncated (NeMo-RL's null, rlpost's -1): the trainer "
        "scores each token under the full softmax; evaluation may truncate (recipe.eval.top_k)",
        untruncated(-1),
        "drop it; to truncate evaluation's sampling, write recipe.eval.top_k",
        example=None,
    ),
    PeerRow(f"{G}.max_new_tokens", "recipe.rollout.max_response_len", "", example=32),
    PeerRow(f"{G}.val_temperature", "recipe.eval.temperature", "", example=1.0),
    PeerRow(
        f"{V}.tensor_parallel_size",
        "layout.rollout.gpus_per_engine",
        "an engine's tensor parallelism is its GPU count",
        example=1,
    ),
    PeerRow(
        f"{V}.gpu_memory_utilization",
        "layout.rollout.sglang.mem_fraction_static",
        "SGLang's fraction of GPU memory for weights and KV cache, as vLLM's is",
        example=0.6,
    ),
    PeerRow(
        f"{V}.enforce_eager", None, "SGLang's own setting: layout.rollout.sglang.disable_cuda_graph"
    ),
    PeerRow(
        f"{G}.colocated.enabled",
        "layout.colocate",
        "engines on the training GPUs (true) or on GPUs of their own",
        example=True,
    ),
    # the algorithm and its loss
    PeerRow(
        "grpo.adv_estimator.name",
        "recipe.algo.advantage_estimator",
        "grpo in both (NeMo-RL's with a leave-one-out baseline unless "
        "grpo.use_leave_one_out_baseline=false, which rlpost has not); NeMo-RL's "
        "reinforce_plus_plus subtracts the group's mean unless "
        "grpo.adv_estimator.minus_baseline=false: rlpost's reinforce_plus_plus_baseline "
        "(without it, reinforce_plus_plus, whose KL in the reward is summed to the end "
        "where NeMo-RL's is each token's)",
        _estimator,
        "write recipe.algo.advantage_estimator= one of grpo, gspo, reinforce_plus_plus, "
        "reinforce_plus_plus_baseline",
        example="grpo",
    ),
    PeerRow(
        "grpo.normalize_rewards",
        "recipe.algo.grpo_std_normalization",
        "divides each advantage by its group's reward std in both",
        example=True,
    ),
    PeerRow(
        "grpo.use_leave_one_out_baseline",
        "recipe.algo.advantage_estimator",
        "rlpost has no leave-one-out baseline: its grpo subtracts the mean of the whole group, "
        "the sample included (without std normalization, a leave-one-out advantage is "
        "n/(n-1) times that; with it, NeMo-RL divides by the std of the other samples)",
        lambda value, line: () if not value else None,
        "drop it: the nearest is rlpost's grpo (recipe.algo.advantage_estimator=grpo), whose "
        "baseline is the whole group's mean",
        example=False,
    ),
    PeerRow(
        "grpo.use_dynamic_sampling",
        "recipe.rollout.dynamic_sampling_filter",
        "DAPO's filter of groups whose rewards are all equal",
        _filter,
        example=True,
    ),
    PeerRow(
        "grpo.overlong_filtering",
        None,
        "rlpost trains on truncated samples as they are (their loss is not masked)",
    ),
    PeerRow(
        "loss_fn.reference_policy_kl_penalty",
        "recipe.algo.kl_loss_coef",
        "the KL to the reference in the loss, NeMo-RL's k3 unless reference_policy_kl_type says",
        _kl_loss,
        "with loss_fn.use_kl_in_reward, the KL goes in the reward: write "
        "recipe.algo.advantage_estimator=reinforce_plus_plus_baseline (NeMo-RL's "
        "reinforce_plus_plus with its minus_baseline) recipe.algo.kl_coef=<the value>",
        example=0.01,
    ),
    PeerRow(
        "loss_fn.reference_policy_kl_type",
        "recipe.algo.kl_loss_type",
        "k1, k2 and k3 in both",
        choice("recipe.algo.kl_loss_type", {"k1": "k1", "k2": "k2", "k3": "k3"}),
        "write recipe.algo.kl_loss_type= one of k1, k2, k3, low_var_kl",
        example="k3",
    ),
    PeerRow(
        "loss_fn.ratio_clip_min",
        "recipe.algo.eps_clip",
        "the low epsilon; NeMo-RL's high one stays ratio_clip_max (0.2 unless set), rlpost's "
        "follows eps_clip unless recipe.algo.eps_clip_high is set",
        _low_clip,
        example=0.2,
    ),
    PeerRow(
        "loss_fn.ratio_clip_max", "recipe.algo.eps_clip_high", "an epsilon in both", example=0.28
    ),
    PeerRow("loss_fn.ratio_clip_c", "recipe.algo.eps_clip_c", "dual-clip's bound", example=3.0),
    PeerRow(
        "loss_fn.token_level_loss",
        "recipe.algo.loss_reduction",
        "true averages over the batch's tokens (token_mean), false over each sample's "
        "(sample_mean)",
        lambda value, line: (
            ("recipe.algo.loss_reduction", "token_mean" if value else "sample_mean"),
        ),
        example=True,
    ),
    PeerRow(
        "loss_fn.use_importance_sampling_correction",
        "recipe.algo.off_policy_correction",
        "tis weighs each token by pi_old/pi_rollout, clamped to [tis_clip_low, tis_clip_high] "
        "(0 and 2 unless set); NeMo-RL's weights are unbounded unless "
        "loss_fn.truncated_importance_sampling_type=tis with _ratio (and _ratio_min) bounds "
        "them, and rlpost has no icepop or seq-mask-tis (they zero tokens or samples out of "
        "range)",
        _is_correction,
        "write recipe.algo.off_policy_correction=tis recipe.algo.tis_clip_high=<a bound> (the "
        "nearest to unbounded weights: a high one), or for icepop "
        "recipe.algo.off_policy_correction=decoupled_ppo recipe.algo.behaviour_weight_cap="
        "<truncated_importance_sampling_ratio> (drops tokens above it)",
        example=True,
    ),
    *(
        PeerRow(
            f"loss_fn.truncated_importance_sampling_{name}",
            key,
            "NeMo-RL's tis bounds the weights to [_ratio_min (0 unless set), _ratio] as "
            "rlpost's tis does to [tis_clip_low, tis_clip_high]; rlpost has no icepop or "
            "seq-mask-tis (they zero tokens or samples out of range)",
            lambda value, line: _is_correction(True, line),
            "write recipe.algo.off_policy_correction=tis recipe.algo.tis_clip_low="
            "<_ratio_min> recipe.algo.tis_clip_high=<_ratio>, or for icepop "
            "recipe.algo.off_policy_correction=decoupled_ppo recipe.algo.behaviour_weight_cap="
            "<_ratio> (drops tokens above it)",
            example=example,
        )
        for name, key, example in (
            ("type", "recipe.algo.off_policy_correction", "tis"),
            ("ratio", "recipe.algo.tis_clip_high", 5.0),
            ("ratio_min", "recipe.algo.tis_clip_low", 0.5),
        )
    ),
    PeerRow(
        "loss_fn.sequence_level_importance_ratios",
        "recipe.algo.advantage_estimator",
        "rlpost's sequence-level ratios are gspo's, an estimator with its own loss",
        switch("recipe.algo.advantage_estimator", "gspo"),
    ),
    # the schedule, evaluation, checkpoints
    PeerRow(
        "grpo.max_num_steps", "recipe.rollout.num_rollout", "one step is one rollout", example=5
    ),
    PeerRow(
        "grpo.max_num_epochs",
        "recipe.rollout.num_rollout",
        "rlpost counts rollouts, not passes over the data",
        lambda value, line: None,
        "write recipe.rollout.num_rollout=<epochs x the prompts in the data / "
        "recipe.rollout.batch_size>",
    ),
    PeerRow("grpo.seed", "run.seed", "", example=42),
    PeerRow(
        "grpo.val_period",
        "recipe.eval.interval",
        "in rollouts; null for never",
        every("recipe.eval.interval"),
        example=5,
    ),
    PeerRow(
        "grpo.val_at_start",
        "recipe.eval.skip_before_train",
        "the opposite sense",
        lambda value, line: (("recipe.eval.skip_before_train", not value),),
        example=False,
    ),
    PeerRow(
        "grpo.val_num_generations_per_prompt", "recipe.eval.n_samples_per_prompt", "", example=1
    ),
    PeerRow(
        "checkpointing.enabled",
        "recipe.save.interval",
        "rlpost saves every recipe.save.interval rollouts; null for never",
        lambda value, line: () if value else (("recipe.save.interval", None),),
        example=False,
    ),
    PeerRow(
        "checkpointing.checkpoint_dir",
        "run.dir",
        "checkpoints go under <run.dir>/ckpt",
        example="/tmp/rlpost-nemo-run",
    ),
    PeerRow(
        "checkpointing.save_period",
        "recipe.save.interval",
        "in rollouts",
        every("recipe.save.interval"),
        example=10,
    ),
    PeerRow(
        "checkpointing.keep_top_k",
        "recipe.save.keep_last",
        "NeMo-RL keeps the best k by checkpointing.metric_name, rlpost the latest k",
        example=3,
    ),
    PeerRow("checkpointing.metric_name", None, "rlpost keeps the latest checkpoints, not the best"),
    # data, logging, the cluster
    PeerRow(
        "data.dataset_name",
        "recipe.data.prompt_data",
        "a jsonl file, one prompt a line; rlpost names no dataset of the Hub",
        lambda value, line: None,
        "write the dataset's prompts to jsonl and write recipe.data.prompt_data=/path/train.jsonl; "
        "recipe.data.input_key names the prompt's field",
    ),
    PeerRow(
        "data.prompt_file",
        None,
        "rlpost applies the tokenizer's chat template (recipe.data.apply_chat_template); a "
        "prompt template is part of the data's prompts",
    ),
    PeerRow("data.shuffle", "recipe.data.shuffle", "", example=True),
    PeerRow("logger.wandb_enabled", "tracking.wandb.enabled", "", example=False),
    PeerRow("logger.tensorboard_enabled", "tracking.tensorboard", "", example=True),
    PeerRow(
        "logger.wandb.project",
        "tracking.wandb.project",
        "wandb's project",
        lambda value, line: (("tracking.wandb.enabled", True), ("tracking.wandb.project", value)),
        example="grpo-dev",
    ),
    PeerRow(
        "logger.wandb.name",
        "tracking.wandb.group",
        "rlpost names a run by its directory (run.dir); a wandb group gathers runs",
        lambda value, line: (("tracking.wandb.enabled", True), ("tracking.wandb.group", value)),
        example="grpo-dev-logger",
    ),
    PeerRow("logger.log_dir", None, "rlpost writes its logs and metrics.jsonl under run.dir"),
    PeerRow(
        "cluster.gpus_per_node",
        "hardware.gpus_per_node",
        "a hardware profile says it (hardware=h100x8: one node of 8); this overrides the "
        "chosen profile's count",
        example=2,
    ),
    PeerRow(
        "cluster.num_nodes",
        "hardware.num_nodes",
        "a hardware profile says it (hardware=h100x16: two nodes of 8); this overrides the "
        "chosen profile's count",
        example=1,
    ),
)

BY_KEY: dict[str, PeerRow] = {row.name: row for row in TABLE}
