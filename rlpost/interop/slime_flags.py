"""slime's flags and the rlpost keys they set: the table the import reads and the README prints.

Every flag of a slime script's train command is mapped to the config key it sets (`FLAGS`),
read together with others (`READ_TOGETHER`: the cluster, checkpoint, evaluation flags), held
at the value rlpost always runs with (`FIXED_SETTINGS`), or listed as not imported with the
reason and the nearest rlpost key (`NOT_IMPORTED`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from rlpost.plan.slime_args import SLIME_HOOKS, SLIME_REWARD_TYPES

Values = list[str]


@dataclass(frozen=True)
class FlagRule:
    """One slime flag and the rlpost key it sets; `read` turns its values into the value."""

    flag: str
    key: str
    read: Callable[[Values], Any]
    note: str = ""


def _on(values: Values) -> bool:
    return True


def _off(values: Values) -> bool:
    return False


def one(values: Values) -> Any:
    return yaml.safe_load(values[0]) if values else None


def _text(values: Values) -> str:
    return values[0]


def many(values: Values) -> list[Any]:
    return [yaml.safe_load(v) for v in values]


def _texts(values: Values) -> list[str]:
    return list(values)


_HOOKS_BACK = {slime: ours for ours, slime in SLIME_HOOKS.items()} | {
    # older slime scripts name the buffer filter slime applies by default
    "slime.rollout.filter_hub.buffer_filters.pop_first": "rlpost.filters.pop_first",
}
REWARDS_FROM_SLIME = {slime: ours for ours, slime in SLIME_REWARD_TYPES.items()}


def hook_path(path: str) -> str:
    """rlpost's hook for a slime hook path (its own where rlpost has none of that name)."""
    return _HOOKS_BACK.get(path, path)


def _hook(values: Values) -> str:
    return hook_path(values[0])


_TRANSPORTS = {"disk": "disk", "nccl": "auto"}


def _transport(values: Values) -> str:
    if values[0] not in _TRANSPORTS:
        raise ValueError(f"slime's transports are {' and '.join(_TRANSPORTS)}")
    return _TRANSPORTS[values[0]]


def _mib(values: Values) -> int:
    size = int(values[0])
    if size <= 0:
        raise ValueError("a bucket holds at least one byte")
    return -(-size // 2**20)


FLAGS: tuple[FlagRule, ...] = (
    # data and rollout
    FlagRule("--prompt-data", "recipe.data.prompt_data", _text),
    FlagRule("--input-key", "recipe.data.input_key", _text),
    FlagRule("--label-key", "recipe.data.label_key", _text),
    FlagRule("--metadata-key", "recipe.data.metadata_key", _text),
    FlagRule("--tool-key", "recipe.data.tool_key", _text),
    FlagRule("--apply-chat-template", "recipe.data.apply_chat_template", _on),
    FlagRule(
        "--apply-chat-template-kwargs",
        "recipe.data.apply_chat_template_kwargs",
        lambda v: json.loads(v[0]),
    ),
    FlagRule("--rollout-shuffle", "recipe.data.shuffle", _on),
    FlagRule("--rollout-seed", "recipe.data.seed", one),
    FlagRule("--rollout-max-prompt-len", "recipe.data.max_prompt_len", one),
    FlagRule("--eval-max-prompt-len", "recipe.eval.max_prompt_len", one),
    FlagRule(
        "--rm-type", "recipe.rollout.reward.type", lambda v: REWARDS_FROM_SLIME.get(v[0], v[0])
    ),
    FlagRule("--custom-rm-path", "recipe.rollout.reward.custom_function", _hook),
    FlagRule("--rm-url", "recipe.rollout.reward.remote_url", _text),
    FlagRule("--group-rm", "recipe.rollout.reward.group", _on),
    FlagRule("--num-rollout", "recipe.rollout.num_rollout", one),
    FlagRule("--rollout-batch-size", "recipe.rollout.batch_size", one),
    FlagRule("--n-samples-per-prompt", "recipe.rollout.n_samples_per_prompt", one),
    FlagRule("--rollout-max-response-len", "recipe.rollout.max_response_len", one),
    FlagRule("--rollout-temperature", "recipe.rollout.temperature", lambda v: float(v[0])),
    FlagRule("--rollout-top-p", "recipe.rollout.top_p", lambda v: float(v[0])),
    FlagRule("--rollout-top-k", "recipe.rollout.top_k", one),
    FlagRule("--rollout-stop", "recipe.rollout.stop", _texts),
    FlagRule("--rollout-stop-token-ids", "recipe.rollout.stop_token_ids", many),
    FlagRule("--rollout-skip-special-tokens", "recipe.rollout.skip_special_tokens", _on),
    FlagRule("--over-sampling-batch-size", "recipe.rollout.over_sampling_batch_size", one),
    FlagRule(
        "--dynamic-sampling-filter-path",
        "recipe.rollout.dynamic_sampling_filter",
        _hook,
        "slime draws until the batch fills; rlpost stops the run past "
        "`recipe.rollout.max_draws_per_rollout` draws (32; null: no limit)",
    ),
    FlagRule("--partial-rollout", "recipe.rollout.partial_rollout", _on),
    FlagRule(
        "--mask-offpolicy-in-partial-rollout",
        "recipe.rollout.mask_offpolicy_in_partial_rollout",
        _on,
    ),
    FlagRule("--buffer-filter-path", "recipe.rollout.buffer_filter", _hook),
    FlagRule("--update-weights-interval", "recipe.loop.update_weights_interval", one),
    FlagRule("--global-batch-size", "recipe.train.global_batch_size", one),
    FlagRule("--balance-data", "recipe.train.balance_data", _on),
    FlagRule("--micro-batch-size", "recipe.train.micro_batch_size", one),
    FlagRule("--use-dynamic-batch-size", "recipe.train.use_dynamic_batch_size", _on),
    FlagRule("--max-tokens-per-gpu", "recipe.train.max_tokens_per_gpu", one),
    FlagRule("--enable-mtp-training", "recipe.train.mtp_training", _on),
    FlagRule("--mtp-loss-scaling-factor", "recipe.train.mtp_loss_scaling_factor", one),
    # evaluation (--eval-prompt-data and the per-dataset keys are read together)
    FlagRule("--eval-interval", "recipe.eval.interval", one),
    FlagRule("--n-samples-per-eval-prompt", "recipe.eval.n_samples_per_prompt", one),
    FlagRule("--eval-max-response-len", "recipe.eval.max_response_len", one),
    FlagRule("--eval-temperature", "recipe.eval.temperature", lambda v: float(v[0])),
    FlagRule("--eval-top-p", "recipe.eval.top_p", lambda v: float(v[0])),
    FlagRule("--eval-top-k", "recipe.eval.top_k", one),
    FlagRule("--skip-eval-before-train", "recipe.eval.skip_before_train", _on),
    # the algorithm
    FlagRule("--advantage-estimator", "recipe.algo.advantage_estimator", _text),
    FlagRule("--use-kl-loss", "recipe.algo.use_kl_loss", _on),
    FlagRule("--kl-loss-coef", "recipe.algo.kl_loss_coef", lambda v: float(v[0])),
    FlagRule("--kl-loss-type", "recipe.algo.kl_loss_type", _text),
    FlagRule("--kl-coef", "recipe.algo.kl_coef", lambda v: float(v[0])),
    FlagRule("--entropy-coef", "recipe.algo.entropy_coef", lambda v: float(v[0])),
    FlagRule("--eps-clip", "recipe.algo.eps_clip", lambda v: float(v[0])),
    FlagRule("--eps-clip-high", "recipe.algo.eps_clip_high", lambda v: float(v[0])),
    FlagRule("--eps-clip-c", "recipe.algo.eps_clip_c", lambda v: float(v[0])),
    FlagRule("--normalize-advantages", "recipe.algo.normalize_advantages", _on),
    FlagRule("--disable-grpo-std-normalization", "recipe.algo.grpo_std_normalization", _off),
    FlagRule("--gamma", "recipe.algo.gamma", lambda v: float(v[0])),
    FlagRule("--use-tis", "recipe.algo.off_policy_correction", lambda v: "tis", "the value is tis"),
    FlagRule("--tis-clip", "recipe.algo.tis_clip_high", lambda v: float(v[0])),
    FlagRule("--tis-clip-low", "recipe.algo.tis_clip_low", lambda v: float(v[0])),
    FlagRule(
        "--calculate-per-token-loss",
        "recipe.algo.loss_reduction",
        lambda v: "token_mean",
        "the value is token_mean",
    ),
    # the optimizer
    FlagRule("--optimizer", "recipe.optim.optimizer", _text),
    FlagRule("--lr", "recipe.optim.lr", lambda v: float(v[0])),
    FlagRule("--lr-decay-style", "recipe.optim.lr_decay_style", _text),
    FlagRule("--min-lr", "recipe.optim.min_lr", lambda v: float(v[0])),
    FlagRule("--lr-warmup-iters", "recipe.optim.lr_warmup_steps", one),
    FlagRule("--lr-decay-iters", "recipe.optim.lr_decay_steps", one),
    FlagRule("--weight-decay", "recipe.optim.weight_decay", lambda v: float(v[0])),
    FlagRule("--adam-beta1", "recipe.optim.adam_beta1", lambda v: float(v[0])),
    FlagRule("--adam-beta2", "recipe.optim.adam_beta2", lambda v: float(v[0])),
    FlagRule("--adam-eps", "recipe.optim.adam_eps", lambda v: float(v[0])),
    FlagRule("--clip-grad", "recipe.optim.clip_grad", lambda v: float(v[0])),
    FlagRule("--optimizer-cpu-offload", "recipe.optim.cpu_offload", _on),
    FlagRule("--overlap-cpu-optimizer-d2h-h2d", "recipe.optim.overlap_cpu_optimizer_d2h_h2d", _on),
    FlagRule("--use-precision-aware-optimizer", "recipe.optim.precision_aware_optimizer", _on),
    # checkpoints
    FlagRule("--hf-checkpoint", "model.hf_checkpoint", _text),
    FlagRule("--ref-load", "model.ref_load", _text),
    FlagRule("--save-interval", "recipe.save.interval", one),
    FlagRule("--no-save-optim", "recipe.save.save_optimizer", _off),
    # training layout
    FlagRule("--tensor-model-parallel-size", "layout.train.tp", one),
    FlagRule("--sequence-parallel", "layout.train.sequence_parallel", _on),
    FlagRule("--pipeline-model-parallel-size", "layout.train.pp", one),
    FlagRule("--context-parallel-size", "layout.train.cp", one),
    FlagRule("--expert-model-parallel-size", "layout.train.ep", one),
    FlagRule("--expert-tensor-parallel-size", "layout.train.etp", one),
    FlagRule(
        "--decoder-first-pipeline-num-layers",
        "layout.train.num_layers_in_first_pipeline_stage",
        one,
    ),
    FlagRule(
        "--decoder-last-pipeline-num-layers", "layout.train.num_layers_in_last_pipeline_stage", one
    ),
    FlagRule("--recompute-granularity", "layout.train.recompute.granularity", _text),
    FlagRule(
        "--recompute-activations",
        "layout.train.recompute.granularity",
        lambda v: "selective",
        "the value is selective, as Megatron-LM sets it",
    ),
    FlagRule("--recompute-method", "layout.train.recompute.method", _text),
    FlagRule("--recompute-num-layers", "layout.train.recompute.num_layers", one),
    FlagRule("--moe-token-dispatcher-type", "layout.train.moe_token_dispatcher_type", _text),
    FlagRule("--moe-enable-deepep", "layout.train.moe_enable_deepep", _on),
    FlagRule("--rollout-num-gpus-per-engine", "layout.rollout.gpus_per_engine", one),
    # run and tracking
    FlagRule("--seed", "run.seed", one),
    FlagRule(
        "--deterministic-mode",
        "run.deterministic",
        _on,
        "rlpost's also seeds every request and turns on SGLang's deterministic inference",
    ),
    FlagRule("--use-wandb", "tracking.wandb.enabled", _on),
    FlagRule("--wandb-mode", "tracking.wandb.mode", _text),
    FlagRule("--wandb-project", "tracking.wandb.project", _text),
    FlagRule("--wandb-group", "tracking.wandb.group", _text),
    FlagRule("--wandb-run-id", "tracking.wandb.run_id", _text),
    FlagRule("--use-tensorboard", "tracking.tensorboard", _on),
    # engines, weight updates and the trainer
    FlagRule("--use-fault-tolerance", "engine.fault_tolerance", _on),
    FlagRule(
        "--update-weight-transport",
        "engine.weight_sync",
        _transport,
        "disk: disk; nccl: auto (CUDA IPC colocated, NCCL decoupled, as slime picks)",
    ),
    FlagRule(
        "--update-weight-buffer-size",
        "engine.weight_bucket_mb",
        _mib,
        "bytes / 2^20, rounded up",
    ),
    FlagRule(
        "--distributed-timeout-minutes",
        "trainer.collective_timeout_s",
        lambda v: 60.0 * float(v[0]),
        "minutes x 60",
    ),
    FlagRule("--train-backend", "trainer.backend", _text, "megatron, slime's one trainer"),
)
RULES = {rule.flag: rule for rule in FLAGS}

# Flags read together with others (see the functions that read them), for the README table.
# slime's --eval-*-key flags hold for every set whose key neither it nor, in an --eval-config
# file, the defaults name
EVAL_KEY_SETS = "every dataset without its own (an --eval-config set's, else its defaults')"
READ_TOGETHER: dict[str, tuple[str, str]] = {
    "--actor-num-nodes": ("layout.train.num_gpus", "x --actor-num-gpus-per-node"),
    "--actor-num-gpus-per-node": ("layout.train.num_gpus", "x --actor-num-nodes"),
    "--rollout-num-gpus": ("layout.rollout.num_gpus", "decoupled (colocate: false)"),
    "--colocate": ("layout.colocate", "true"),
    "--num-gpus-per-node": ("hardware.gpus_per_node", "the hardware profile is picked by GPUs"),
    "--load": ("run.dir", "--load = --save = <run.dir>/slime/ is the run's own; else model.load"),
    "--save": ("run.dir", "<run.dir>/slime/"),
    "--eval-prompt-data": ("recipe.eval.datasets", "NAME PATH pairs"),
    "--eval-input-key": ("recipe.eval.datasets[].input_key", EVAL_KEY_SETS),
    "--eval-label-key": ("recipe.eval.datasets[].label_key", EVAL_KEY_SETS),
    "--eval-tool-key": ("recipe.eval.datasets[].tool_key", EVAL_KEY_SETS),
    "--eval-config": (
        "recipe.eval.datasets",
        "the file's sets (keys, rm_type, custom_rm_path, sample counts, response lengths) and "
        "its defaults, "
        "read when the file is on this machine",
    ),
    "--sglang-*": ("layout.rollout.sglang.*", "SGLang's own option names"),
    "--sglang-server-concurrency": (
        "recipe.rollout.max_concurrency",
        "x the number of engines",
    ),
    "--num-steps-per-rollout": (
        "recipe.train.global_batch_size",
        "rollout batch x samples per prompt / steps, as slime computes it",
    ),
    "--rollout-function-path": (
        "recipe.loop.mode",
        "fully_async for slime's fully-async rollout under train_async.py",
    ),
    "MODEL_ARGS": ("model", "a shipped model, or one drawn from the flags on its family"),
    "train_async.py": ("recipe.loop.mode", "async"),
    "--offload": (
        "engine.offload",
        "colocated runs offload the trainer and the engines, decoupled runs neither: "
        "= --offload-train + --offload-rollout",
    ),
    "--offload-train": (
        "engine.offload",
        "with --offload-rollout: rlpost offloads both or neither",
    ),
    "--offload-rollout": (
        "engine.offload",
        "with --offload-train: rlpost offloads both or neither",
    ),
    "--rollout-health-check-interval": (
        "engine.health_check_interval_s",
        "with --use-fault-tolerance, the only time slime checks",
    ),
    "--rollout-health-check-timeout": (
        "engine.health_check_timeout_s",
        "with --use-fault-tolerance, the only time slime checks",
    ),
    "--rollout-health-check-first-wait": (
        "engine.health_check_first_wait_s",
        "with --use-fault-tolerance; 0 when unset, as in slime",
    ),
    "--save-hf": (
        "recipe.save.save_hf_interval",
        "= --save-interval; rlpost writes <run.dir>/hf/rollout_<n>/, not the flag's path",
    ),
    "--rollout-max-context-len": (
        "recipe.data.max_prompt_len",
        "its value - 1 when --rollout-max-prompt-len is unset, as slime derives it",
    ),
}

SLIME_FULLY_ASYNC = "slime.rollout.fully_async_rollout.generate_rollout_fully_async"
"""The rollout function that makes slime's train_async.py fully asynchronous."""

CLUSTER_FLAGS = frozenset(
    {"--actor-num-nodes", "--actor-num-gpus-per-node", "--rollout-num-gpus", "--colocate",
     "--num-gpus-per-node"}
)  # fmt: skip
OFFLOAD_FLAGS = frozenset(
    {"--offload", "--offload-train", "--offload-rollout", "--no-offload-train",
     "--no-offload-rollout"}
)  # fmt: skip
HEALTH_CHECK_FLAGS = {
    "--rollout-health-check-interval": "engine.health_check_interval_s",
    "--rollout-health-check-timeout": "engine.health_check_timeout_s",
    "--rollout-health-check-first-wait": "engine.health_check_first_wait_s",
}
TOGETHER_FLAGS = frozenset(
    {"--load", "--save", "--eval-prompt-data", "--eval-input-key", "--eval-label-key",
     "--eval-tool-key", "--eval-config",
     "--sglang-server-concurrency", "--num-steps-per-rollout", "--rollout-function-path",
     "--save-hf", "--rollout-max-context-len", *OFFLOAD_FLAGS, *HEALTH_CHECK_FLAGS}
)  # fmt: skip
SECRET_FLAGS = frozenset({"--wandb-key"})
"""Flags whose values are never copied (not into YAML, not into what the import prints)."""

# What rlpost always does, as slime's scripts spell it: accepted at exactly these values.
FIXED_SETTINGS = {
    "--loss-type": ["policy_loss"],
    "--attention-dropout": ["0.0"],
    "--hidden-dropout": ["0.0"],
    "--accumulate-allreduce-grads-in-fp32": [],
    "--attention-softmax-in-fp32": [],
    "--attention-backend": ["flash"],
    "--distributed-backend": ["nccl"],  # gloo on CPU, which slime does not run on
    "--update-weight-mode": ["full"],
    # rlpost's log-prob kernel recomputes the logits chunk by chunk in the backward pass
    "--recompute-loss-function": [],
    # rlpost always logs train/rollout_logprob_abs_diff
    "--get-mismatch-metrics": [],
}

FIXED_WHEN_ABSENT = {
    "--attention-dropout": "Megatron-LM's dropout of 0.1 after attention",
    "--hidden-dropout": "Megatron-LM's dropout of 0.1 on the hidden states",
    "--accumulate-allreduce-grads-in-fp32": "gradients accumulated and reduced in bf16",
    "--attention-softmax-in-fp32": "the attention softmax in bf16 where the kernel computes "
    "it unfused",
    "--attention-backend": "Megatron-LM's auto attention backend (TransformerEngine picks "
    "the kernel)",
}
"""The fixed settings whose absence from a script changes what slime runs: Megatron-LM's
defaults (training/arguments.py: dropouts 0.1, the fp32 switches off, backend auto). The
others are slime's defaults, or change no result (--recompute-loss-function, memory;
--get-mismatch-metrics, a log)."""

# Flags rlpost has no key for: (reason, nearest rlpost key)
# what slime's code looks up in its arguments without defining a flag for it: slime's parser
# (Megatron's, told to ignore what it does not know) drops such a flag without a word
READ_NOT_DEFINED = {
    "--eval-custom-rm-path": (
        "slime's eval config falls back to args.eval_custom_rm_path, but slime defines no "
        "such flag: its parser drops it, and slime scores the evaluation sets with "
        "--custom-rm-path or their rm_type as if it were absent (slime's evaluation-wide "
        "function is its --eval-config's defaults.custom_rm_path, which is imported)",
        "recipe.eval.custom_reward_function",
    ),
}

NOT_IMPORTED = {
    "--async-buffer-size": (
        "train_async.py keeps one rollout ahead; rlpost bounds its queue itself",
        "recipe.loop.max_buffered_groups (fully_async)",
    ),
    "--wandb-key": ("credentials come from the environment (WANDB_API_KEY)", "tracking.wandb"),
    "--wandb-team": (
        "the entity comes from the environment (WANDB_ENTITY), as the key does",
        "tracking.wandb.project",
    ),
    "--wandb-host": ("the server comes from the environment (WANDB_BASE_URL)", "tracking.wandb"),
    "--sglang-log-level": ("rlpost's engine logs go to the run directory", "run.dir"),
    "--save-debug-rollout-data": (
        "rlpost writes each rollout's samples as JSON lines in <run.dir>/rollouts/, not "
        "torch files at a path of the script's choosing",
        "run.dump_rollouts",
    ),
    # slime's own --sglang-* flags (not SGLang server options)
    "--sglang-router-ip": ("rlpost starts the run's router itself", "engine.router_policy"),
    "--sglang-router-port": ("rlpost starts the run's router itself", "engine.router_policy"),
    "--sglang-router-request-timeout-secs": (
        "rlpost's router timeout is its own setting (default 3600 s)",
        "engine.request_timeout_s",
    ),
    "--sglang-config": (
        "SGLang options are part of the layout, not a separate file",
        "layout.rollout.sglang",
    ),
    "--sglang-pp-size": (
        "rlpost's engines are tensor parallel only",
        "layout.rollout.gpus_per_engine",
    ),
    "--sglang-pipeline-parallel-size": (
        "rlpost's engines are tensor parallel only",
        "layout.rollout.gpus_per_engine",
    ),
    # cluster and weight updates
    "--release-train": (
        "rlpost keeps its train ranks alive across rollouts and offloads them instead",
        "engine.offload",
    ),
    "--update-weight-disk-dir": (
        "rlpost writes disk weight updates to <run.dir>/weights/",
        "run.dir",
    ),
    "--update-weight-disk-keep-files": (
        "rlpost keeps only the newest disk update, the one a restarted engine catches up from",
        "engine.weight_sync",
    ),
    "--update-weight-delta-encoding": ("rlpost has no delta weight updates", "engine.weight_sync"),
    "--update-weight-delta-checksum": ("rlpost has no delta weight updates", "engine.weight_sync"),
    "--update-weight-local-checkpoint-dir": (
        "rlpost has no delta weight updates or node-local copies of them",
        "engine.weight_sync",
    ),
    "--custom-update-weight-post-write-path": (
        "rlpost calls no hook between writing a disk update and the engines reading it",
        "engine.weight_sync",
    ),
    "--check-weight-update-equal": (
        "slime compares the engines' weights with the trainer's once, after the first update; "
        "rlpost's probe compares a prompt's log-probs after every update instead",
        "engine.weight_probe",
    ),
    "--train-env-vars": (
        "rlpost's train ranks inherit the environment of the cluster they run in: export "
        "them where its Ray cluster starts",
        "-",
    ),
    # the trainer and the model
    "--custom-model-provider-path": (
        "rlpost builds the network from the model YAML (model.family and its fields)",
        "model.family",
    ),
    "--qwen-gdn-backend": ("rlpost has no Qwen linear-attention (GDN) family", "model.family"),
    "--model-name": (
        "rlpost names HF exports' architecture from the model YAML",
        "model.hf_architecture",
    ),
    "--padded-vocab-size": (
        "rlpost pads the vocabulary as Megatron-LM does, from the model YAML",
        "model.make_vocab_size_divisible_by",
    ),
    "--only-train-params-name-list": ("rlpost trains every parameter", "-"),
    "--freeze-params-name-list": ("rlpost trains every parameter", "-"),
    "--freeze-indexer": ("rlpost trains every parameter", "-"),
    "--log-probs-chunk-size": (
        "rlpost's log-prob kernel picks its own chunks and never holds the whole logits",
        "-",
    ),
    "--log-probs-max-tokens-per-gpu": (
        "rlpost's log-prob passes use the training micro-batches",
        "recipe.train.max_tokens_per_gpu",
    ),
    "--balance-by-flops": (
        "rlpost balances micro-batches by tokens",
        "recipe.train.balance_data",
    ),
    "--data-pad-size-multiplier": ("rlpost packs samples without padding them", "-"),
    "--megatron-config-path": ("rlpost has no critic model", "recipe.algo.advantage_estimator"),
    "--custom-megatron-init-path": ("rlpost calls no hook inside its Megatron trainer", "-"),
    "--custom-megatron-before-log-prob-hook-path": (
        "rlpost calls no hook inside its Megatron trainer",
        "-",
    ),
    "--custom-megatron-before-train-step-hook-path": (
        "rlpost calls no hook inside its Megatron trainer",
        "-",
    ),
    "--megatron-deepgemm-forward-layers": (
        "rlpost's trainer has no DeepGEMM forward",
        "layout.rollout.sglang",
    ),
    "--megatron-deepgemm-forward-modules": (
        "rlpost's trainer has no DeepGEMM forward",
        "layout.rollout.sglang",
    ),
    "--megatron-deepgemm-moe-forward-layers": (
        "rlpost's trainer has no DeepGEMM forward",
        "layout.rollout.sglang",
    ),
    "--megatron-deepgemm-moe-forward-modules": (
        "rlpost's trainer has no DeepGEMM forward",
        "layout.rollout.sglang",
    ),
    "--async-save": (
        "rlpost's checkpoint saves are its own (staged, hashed, then renamed), not Megatron's "
        "asynchronous save",
        "recipe.save.interval",
    ),
    # rollout
    "--custom-generate-function-path": (
        "slime calls generate(args, sample, sampling_params); rlpost's generate functions "
        "are async generate(sample, ctx): port the function",
        "recipe.rollout.generate_function",
    ),
    "--rollout-sample-hook-path": (
        "rlpost calls no hook between generation and the reward: do it in the reward function",
        "recipe.rollout.reward.custom_function",
    ),
    "--rollout-data-postprocess-path": (
        "rlpost calls no hook on a rollout's data before training",
        "-",
    ),
    "--custom-convert-samples-to-train-data-path": (
        "rlpost calls no hook between samples and training data",
        "-",
    ),
    "--rollout-sample-filter-path": (
        "rlpost drops samples only by group, through the filters",
        "recipe.rollout.dynamic_sampling_filter",
    ),
    "--rollout-all-samples-process-path": (
        "rlpost calls no hook on the filtered-out samples",
        "recipe.rollout.dynamic_sampling_filter",
    ),
    "--custom-reward-post-process-path": (
        "rlpost normalises rewards by the advantage estimator, with no hook",
        "recipe.algo.advantage_estimator",
    ),
    "--reward-key": (
        "rlpost reads the reward of a dict from a fixed key ('score'; a reward server's "
        "'reward', else 'score'), the others logged: no key to pick",
        "recipe.rollout.reward.custom_function",
    ),
    "--eval-reward-key": (
        "rlpost reads the reward of a dict from a fixed key ('score'; a reward server's "
        "'reward', else 'score'), the others logged: no key to pick",
        "recipe.rollout.reward.custom_function",
    ),
    "--rollout-data-transport": (
        "rlpost hands rollouts to the trainer through Ray's object store",
        "-",
    ),
    "--rollout-external-engine-addrs": (
        "rlpost starts the run's engines itself",
        "layout.rollout.num_gpus",
    ),
    "--prefill-num-servers": (
        "rlpost's engines prefill and decode in one server each",
        "layout.rollout.gpus_per_engine",
    ),
    "--rollout-buffer-url": ("rlpost has no external rollout buffer", "recipe.data.source"),
    "--fetch-trajectory-retry-times": (
        "rlpost has no external rollout buffer",
        "recipe.data.source",
    ),
    "--min-batch-collection-ratio": (
        "rlpost has no external rollout buffer",
        "recipe.data.source",
    ),
    "--rollout-task-type": ("rlpost has no external rollout buffer", "recipe.data.source"),
    "--loss-mask-type": (
        "rlpost masks the loss by the tokens the engines generated, for every chat template",
        "-",
    ),
    "--keep-old-actor": (
        "rlpost keeps no second copy of the policy on the train ranks",
        "recipe.algo.off_policy_correction",
    ),
    "--use-rollout-logprobs": (
        "rlpost's ratio is against the trainer's own log-probs; the engines' log-probs "
        "correct off-policy tokens instead",
        "recipe.algo.off_policy_correction",
    ),
    "--use-rollout-entropy": ("rlpost computes no entropy for loss masks", "-"),
    # data
    "--num-epoch": (
        "rlpost counts a run in rollouts (and slime ignores --num-epoch beside --num-rollout): "
        "epochs x prompts / --rollout-batch-size",
        "recipe.rollout.num_rollout",
    ),
    "--start-rollout-id": (
        "rlpost resumes at the rollout its checkpoint holds",
        "run.resume",
    ),
    "--disable-rollout-global-dataset": (
        "rlpost reads prompts from prompt_data, or from a data source class",
        "recipe.data.source",
    ),
    "--data-source-path": (
        "rlpost's data sources are built as cls(ctx) with their own interface; slime's take "
        "(args): port the class",
        "recipe.data.source",
    ),
    "--multimodal-keys": ("rlpost trains text-only models", "recipe.data.input_key"),
    # evaluation
    "--eval-function-path": (
        "rlpost evaluates with its own generation and the recipe's reward",
        "recipe.eval.datasets",
    ),
    "--eval-max-context-len": (
        "rlpost checks every evaluation prompt and response against the engines' context",
        "recipe.eval.max_response_len",
    ),
    "--eval-min-new-tokens": (
        "rlpost's evaluation sets no minimum response length",
        "recipe.eval.max_response_len",
    ),
    # the algorithm
    "--ref-ckpt-step": (
        "rlpost loads the reference from model.ref_load as it is",
        "model.ref_load",
    ),
    "--ref-update-interval": ("rlpost's reference model is never updated", "model.ref_load"),
    "--use-unbiased-kl": ("rlpost has no unbiased KL estimate", "recipe.algo.kl_loss_type"),
    "--disable-rewards-normalization": (
        "rlpost's group baselines always subtract the group's mean reward",
        "recipe.algo.grpo_std_normalization",
    ),
    "--disable-compute-advantages-and-returns": (
        "rlpost always computes advantages (it trains reinforcement-learning recipes only)",
        "recipe.algo.advantage_estimator",
    ),
    "--custom-advantage-function-path": (
        "rlpost's advantage estimators are its own",
        "recipe.algo.advantage_estimator",
    ),
    "--custom-loss-function-path": (
        "rlpost's loss is the policy-gradient loss of its recipe",
        "recipe.algo",
    ),
    "--custom-pg-loss-reducer-function-path": (
        "rlpost reduces the loss by sample or by token",
        "recipe.algo.loss_reduction",
    ),
    "--custom-tis-function-path": (
        "rlpost's importance weights are its own (tis, decoupled_ppo)",
        "recipe.algo.off_policy_correction",
    ),
    "--num-critic-only-steps": ("rlpost has no critic model", "recipe.algo.advantage_estimator"),
    "--value-clip": ("rlpost has no critic model", "recipe.algo.advantage_estimator"),
    "--lambd": ("rlpost has no critic model (GAE)", "recipe.algo.advantage_estimator"),
    "--use-routing-replay": ("rlpost has no routing replay for MoE models", "-"),
    "--use-rollout-routing-replay": ("rlpost has no routing replay for MoE models", "-"),
    "--use-opsm": (
        "rlpost has no off-policy sequence masking",
        "recipe.algo.off_policy_correction",
    ),
    "--opsm-delta": (
        "rlpost has no off-policy sequence masking",
        "recipe.algo.off_policy_correction",
    ),
    "--use-opd": ("rlpost has no on-policy distillation", "-"),
    "--opd-type": ("rlpost has no on-policy distillation", "-"),
    "--opd-kl-coef": ("rlpost has no on-policy distillation", "-"),
    "--opd-teacher-load": ("rlpost has no on-policy distillation", "-"),
    "--opd-teacher-ckpt-step": ("rlpost has no on-policy distillation", "-"),
    "--reset-optimizer-states": ("rlpost keeps the optimizer's state across rollouts", "-"),
    "--use-stateless-adam": ("rlpost keeps the optimizer's state across rollouts", "-"),
    # logging
    "--wandb-dir": ("rlpost's wandb files go to the run directory", "run.dir"),
    "--disable-wandb-random-suffix": (
        "rlpost names the wandb run after the run directory, with no suffix",
        "tracking.wandb.run_id",
    ),
    "--wandb-always-use-train-step": (
        "rlpost logs every metric at its rollout id",
        "tracking.wandb",
    ),
    "--tb-project-name": ("rlpost's tensorboard files go to the run directory", "run.dir"),
    "--tb-experiment-name": ("rlpost's tensorboard files go to the run directory", "run.dir"),
    "--log-multi-turn": ("rlpost logs turns per sample for multi-turn rollouts", "-"),
    "--log-passrate": ("rlpost logs no pass@k", "recipe.eval.n_samples_per_prompt"),
    "--log-correct-samples": ("rlpost logs no pass@k", "recipe.eval.n_samples_per_prompt"),
    "--log-reward-category": (
        "rlpost's reward functions return a number, with no category",
        "recipe.rollout.reward.custom_function",
    ),
    "--custom-rollout-log-function-path": ("rlpost calls no logging hook", "run.dump_rollouts"),
    "--custom-eval-rollout-log-function-path": (
        "rlpost calls no logging hook",
        "run.dump_rollouts",
    ),
    # debugging, profiling and slime's own CI
    "--debug-rollout-only": ("rlpost has no rollout-only mode", "mode"),
    "--debug-train-only": ("rlpost has no train-only mode", "mode"),
    "--load-debug-rollout-data": ("rlpost does not replay saved rollouts", "run.dump_rollouts"),
    "--load-debug-rollout-data-subsample": (
        "rlpost does not replay saved rollouts",
        "run.dump_rollouts",
    ),
    "--load-forge-rollout-data": ("rlpost does not replay saved rollouts", "run.dump_rollouts"),
    "--save-debug-train-data": (
        "rlpost writes each rollout's samples as the trainer gets them in <run.dir>/rollouts/",
        "run.dump_rollouts",
    ),
    "--dump-details": (
        "rlpost writes each rollout's samples as the trainer gets them in <run.dir>/rollouts/",
        "run.dump_rollouts",
    ),
    "--memory-snapshot-dir": ("rlpost takes no CUDA memory snapshots", "-"),
    "--memory-snapshot-num-steps": ("rlpost takes no CUDA memory snapshots", "-"),
    "--memory-recorder": ("rlpost takes no CUDA memory snapshots", "-"),
    "--record-memory-history": ("rlpost takes no CUDA memory snapshots", "-"),
    "--profile-target": ("rlpost has no profiler switch", "-"),
    "--http-proxy": (
        "rlpost sets no proxy for its requests",
        "-",
    ),
    "--use-distributed-post": ("rlpost's rollout requests go through the run's router", "-"),
    "--custom-config-path": ("rlpost's configuration is its YAML", "-"),
    "--ci-test": ("slime's own CI checks", "-"),
    "--ci-disable-kl-checker": ("slime's own CI checks", "-"),
    "--ci-train-rollout-logprob-abs-diff-threshold": ("slime's own CI checks", "-"),
    "--ci-save-grad-norm": ("slime's own CI checks", "-"),
    "--ci-load-grad-norm": ("slime's own CI checks", "-"),
}


def split_flags(argv: list[str]) -> list[tuple[str, list[str]]]:
    """`--a 1 2 --b` -> [('--a', ['1', '2']), ('--b', [])]; values never start with '--'."""
    flags: list[tuple[str, list[str]]] = []
    for token in argv:
        if token.startswith("--"):
            name, eq, value = token.partition("=")
            flags.append((name, [value] if eq else []))
        elif flags:
            flags[-1][1].append(token)
    return flags


def nearest_key(flag: str) -> str:
    from difflib import get_close_matches

    names = [r.flag for r in FLAGS]
    close = get_close_matches(flag, names, n=1)
    return RULES[close[0]].key if close else "-"


def flag_table() -> str:
    """The README's flag -> key table, in markdown: generated here so it cannot drift."""
    rows = [(r.flag, f"`{r.key}`", r.note) for r in FLAGS]
    rows += [(flag, f"`{key}`", note) for flag, (key, note) in READ_TOGETHER.items()]
    rows += [
        (flag, "(always)", f"rlpost runs with {' '.join([flag, *v])}")
        for flag, v in FIXED_SETTINGS.items()
    ]
    rows += [
        (flag, f"not imported: nearest `{near}`", why) for flag, (why, near) in NOT_IMPORTED.items()
    ]
    lines = ["| slime flag | rlpost key | note |", "| --- | --- | --- |"]
    lines += [f"| `{flag}` | {key} | {note} |" for flag, key, note in rows]
    return "\n".join(lines) + "\n"


ENVIRONMENT = {
    "PYTHONPATH": "rlpost's install provides Megatron-LM and its own modules",
    "PYTHONUNBUFFERED": "rlpost's processes log unbuffered",
    "MASTER_ADDR": "the cluster's address is rlpost's (`rlpost cluster up`)",
    "no_proxy": "the cluster's addresses are rlpost's (`rlpost cluster up`)",
}
"""The job environment a slime script sets, and why rlpost needs it no more."""


def environment_note(name: str) -> str:
    """What becomes of a variable the job's environment sets."""
    return ENVIRONMENT.get(
        name,
        "read from the environment by the library that names it: export it where rlpost's "
        "Ray cluster starts",
    )
