"""The slime `train.py` argument list equivalent to a resolved config (mode=slime_args).

Grouped as slime's run scripts group them, so a recipe can be diffed against a slime script or
run on slime. Values follow the plan (derived sizes included); SGLang options pass through as
`--sglang-<name-with-dashes>`. Flags at slime's or Megatron's defaults are left out, except
those the seeds always spell out.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rlpost.config.sglang_options import load_sglang_options
from rlpost.data.files import UnreadableFile, prompt_rows
from rlpost.data.prompts import holds_json_messages
from rlpost.errors import Issue, UserError
from rlpost.plan.megatron_rules import BY_LINE, MEGATRON_COMMIT
from rlpost.plan.model_args import format_value, model_args
from rlpost.plan.plan import Plan
from rlpost.schema import EvalDataset, RunConfig
from rlpost.schema.prompt_file import split_prompt_path

Flag = tuple[str, ...]
"""One flag and its values, e.g. ('--lr', '1e-6') or ('--colocate',)."""

SLIME_HOOKS = {
    "rlpost.filters.check_reward_nonzero_std": (
        "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"
    ),
}
"""rlpost's built-in hooks and their slime counterparts; user hooks pass through as written."""

SLIME_DEFAULT_HOOKS = {"--buffer-filter-path": "rlpost.filters.pop_first"}
"""rlpost's hooks that do what slime does without the flag: not exported (slime's buffer
takes the oldest groups first when --buffer-filter-path is unset; the module that once
held its pop_first is gone from slime)."""

SLIME_COMMIT = "624b824a"
SGLANG_VERSION = "0.5.15.post1"
PINNED = (
    f"slime at commit {SLIME_COMMIT} (Megatron-LM {MEGATRON_COMMIT} as its docker image pins "
    f"it, sglang {SGLANG_VERSION})"
)
"""The slime the export is written for."""

RUNTIME_ENV = {
    "PYTHONPATH": "/root/Megatron-LM/",
    # Megatron's validate_args refuses TP or CP > 1 on Hopper without it (overlapped
    # communication needs one hardware queue; megatron_rules, line 950); slime's run scripts
    # set it the same way
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",
}
"""The environment every train and rollout process of the exported job gets."""

SLIME_REWARD_TYPES = {"remote": "remote_rm"}
"""rlpost's reward type names that slime spells otherwise (--rm-type)."""

SLIME_SGLANG_NAMES = {
    "cuda_graph_max_bs_decode": "cuda_graph_max_bs",
    "cuda_graph_bs_decode": "cuda_graph_bs",
}
"""Options exported under the older spelling slime's scripts use (--sglang-cuda-graph-max-bs),
which slime's SGLang still takes as an alias (checked against its table by the tests)."""

SLIME_SGLANG_TABLE = Path(__file__).with_name("slime_sglang_options.json")
"""The server options of slime's SGLang (SGLANG_VERSION), generated from its ServerArgs by
tools/gen_sglang_options.py: slime adds each of their flags as --sglang-<flag>."""


@functools.cache
def slime_sglang_flags() -> dict[str, str]:
    """Every --sglang-<flag> slime's SGLang gives it -> the option (ServerArgs field)."""
    return {
        "--sglang-" + spelled.removeprefix("--"): name
        for name, spec in load_sglang_options(SLIME_SGLANG_TABLE).options.items()
        for spelled in spec.flags
    }


def slime_sglang_flag(name: str) -> str:
    """The --sglang-* flag the export spells an SGLang option with."""
    return "--sglang-" + SLIME_SGLANG_NAMES.get(name, name).replace("_", "-")


def check_sglang_for_slime(plan: Plan) -> list[Issue]:
    """The engine's SGLang options that slime's SGLang lacks or would read otherwise: slime
    drops an unknown --sglang-* flag without a word, so the export refuses them."""
    table = load_sglang_options(SLIME_SGLANG_TABLE)
    issues = []
    for name, value in plan.engine.sglang:
        key = f"layout.rollout.sglang.{name}"
        spec = table.options.get(name)
        if spec is None or slime_sglang_flags().get(slime_sglang_flag(name)) != name:
            issues.append(
                Issue(
                    key,
                    f"sglang {SGLANG_VERSION}, which slime {SLIME_COMMIT} runs, has no server "
                    f"option '{name}' (it came with a later SGLang): slime would drop "
                    f"{slime_sglang_flag(name)} without a word",
                    "remove it for the export (rlpost's own engines take it)",
                    value=value,
                )
            )
        elif not spec.accepts(value):
            issues.append(
                Issue(
                    key,
                    f"in sglang {SGLANG_VERSION}, which slime {SLIME_COMMIT} runs, '{name}' "
                    f"takes {spec.expected()}",
                    "set a value both SGLang versions take, or remove it for the export",
                    value=value,
                )
            )
    return issues


def flag(name: str, *values: Any) -> Flag:
    return (name, *(format_value(v) for v in values))


def switch(on: bool, name: str) -> list[Flag]:
    return [(name,)] if on else []


def option(value: Any, name: str, default: Any = None) -> list[Flag]:
    """The flag with its value, unless the value is unset or the default."""
    return [] if value is None or value == default else [flag(name, value)]


def cluster_args(cfg: RunConfig, plan: Plan) -> list[Flag]:
    p = plan.placement
    per_node = min(p.train_gpus, p.gpus_per_node)
    if p.train_gpus % per_node:
        raise UserError(
            [
                Issue(
                    "layout.train.num_gpus",
                    f"slime places train ranks as --actor-num-nodes x --actor-num-gpus-per-node, "
                    f"and {p.train_gpus} train GPUs are not whole nodes of {p.gpus_per_node}",
                    f"use a multiple of {p.gpus_per_node} train GPUs for mode=slime_args",
                    p.train_gpus,
                )
            ]
        )
    flags = [
        flag("--actor-num-nodes", p.train_gpus // per_node),
        flag("--actor-num-gpus-per-node", per_node),
    ]
    flags += [("--colocate",)] if p.colocate else [flag("--rollout-num-gpus", p.rollout_gpus)]
    flags += option(p.gpus_per_node, "--num-gpus-per-node", 8)
    return flags


SLIME_CKPT_DIR = "slime"
"""Under run.dir: where the exported run saves and resumes (slime's --save and --load)."""


def _ckpt_dir(cfg: RunConfig) -> str:
    return f"{(cfg.run.dir or '.').rstrip('/')}/{SLIME_CKPT_DIR}/"


def ckpt_args(cfg: RunConfig, plan: Plan) -> list[Flag]:
    """slime resumes from --load and saves to --save: both are the run directory's slime/
    (./slime/ when run.dir is unset), so the exported run resumes itself as rlpost does. A
    policy that starts from other weights than the HF checkpoint's (model.load) starts from
    that torch_dist checkpoint; slime cannot start a policy from an HF folder."""
    m, save = cfg.model, cfg.recipe.save
    ckpt_dir = _ckpt_dir(cfg)
    load = ckpt_dir
    if m.load is not None and m.load != m.hf_checkpoint:
        if (Path(m.load).expanduser() / "config.json").is_file():  # an HF folder, here
            raise UserError(
                [
                    Issue(
                        "model.load",
                        "slime starts a policy from a torch_dist checkpoint (--load) or from "
                        "the reference (--ref-load), never from an HF folder",
                        "convert it (tools/convert_hf_to_megatron.py) and point model.load "
                        "at the torch_dist folder, or remove model.load",
                        value=m.load,
                    )
                ],
                title="export error",
            )
        load = m.load
    return [
        flag("--hf-checkpoint", m.hf_checkpoint),
        *option(m.ref_load, "--ref-load"),
        flag("--load", load),
        flag("--save", ckpt_dir),
        *option(save.interval, "--save-interval"),
        *switch(not save.save_optimizer, "--no-save-optim"),
        # slime writes an HF folder at every checkpoint save (NOT_IN_SLIME: any other interval)
        *(
            [flag("--save-hf", f"{ckpt_dir}hf/rollout_{{rollout_id}}")]
            if save.save_hf_interval
            else []
        ),
    ]


def _hook(path: str | None, name: str) -> list[Flag]:
    if path is None or SLIME_DEFAULT_HOOKS.get(name) == path:
        return []
    return [flag(name, SLIME_HOOKS.get(path, path))]


def _reward_args(cfg: RunConfig) -> list[Flag]:
    reward = cfg.recipe.rollout.reward
    return [
        flag("--rm-type", SLIME_REWARD_TYPES.get(reward.type, reward.type)),
        *_hook(reward.custom_function, "--custom-rm-path"),
        *option(reward.remote_url, "--rm-url"),
        *switch(reward.group, "--group-rm"),
    ]


def rollout_args(cfg: RunConfig, plan: Plan) -> list[Flag]:
    data, rollout, train = cfg.recipe.data, cfg.recipe.rollout, cfg.recipe.train
    kwargs = data.apply_chat_template_kwargs
    return [
        *option(data.prompt_data, "--prompt-data"),
        flag("--input-key", data.input_key),
        *option(data.label_key, "--label-key"),
        *option(data.metadata_key, "--metadata-key", "metadata"),
        *option(data.tool_key, "--tool-key", "tools"),
        *switch(data.apply_chat_template, "--apply-chat-template"),
        *([flag("--apply-chat-template-kwargs", json.dumps(kwargs))] if kwargs else []),
        *switch(data.shuffle, "--rollout-shuffle"),
        *option(data.seed, "--rollout-seed", 42),
        *_reward_args(cfg),
        flag("--num-rollout", rollout.num_rollout),
        flag("--rollout-batch-size", rollout.batch_size),
        flag("--n-samples-per-prompt", rollout.n_samples_per_prompt),
        *option(data.max_prompt_len, "--rollout-max-prompt-len"),
        flag("--rollout-max-response-len", rollout.max_response_len),
        flag("--rollout-temperature", rollout.temperature),
        *option(rollout.top_p, "--rollout-top-p", 1.0),
        *option(rollout.top_k, "--rollout-top-k", -1),
        *([flag("--rollout-stop", *rollout.stop)] if rollout.stop else []),
        *(
            [flag("--rollout-stop-token-ids", *rollout.stop_token_ids)]
            if rollout.stop_token_ids
            else []
        ),
        *switch(rollout.skip_special_tokens, "--rollout-skip-special-tokens"),
        *option(rollout.over_sampling_batch_size, "--over-sampling-batch-size"),
        *_hook(rollout.dynamic_sampling_filter, "--dynamic-sampling-filter-path"),
        *switch(rollout.partial_rollout, "--partial-rollout"),
        *switch(rollout.mask_offpolicy_in_partial_rollout, "--mask-offpolicy-in-partial-rollout"),
        *_hook(rollout.buffer_filter, "--buffer-filter-path"),
        *_hook(rollout.generate_function, "--custom-generate-function-path"),
        *option(cfg.recipe.loop.update_weights_interval, "--update-weights-interval", 1),
        flag("--global-batch-size", train.global_batch_size),
        *switch(train.balance_data, "--balance-data"),
    ]


EVAL_CONFIG_FILE = "eval_config.yaml"
# rlpost's eval dataset field -> slime's eval config key for it
EVAL_SET_FIELDS = {
    "reward_type": "rm_type",
    "custom_reward_function": "custom_rm_path",
    "input_key": "input_key",
    "label_key": "label_key",
    "tool_key": "tool_key",
    "n_samples_per_prompt": "n_samples_per_eval_prompt",
    "max_response_len": "max_response_len",
}


def eval_config_file(cfg: RunConfig) -> tuple[str, str] | None:
    """(path, YAML) of slime's --eval-config for evaluation sets with keys, sample counts,
    response lengths, reward types or reward functions of their own, or a reward function of
    the evaluation's (slime reads those per set only from that file, the last as its
    defaults; its flags hold for every set), else None. The path is in the checkpoint folder
    the export's --save names; each set lists only what it sets, and slime fills the rest
    from the flags, as rlpost fills it from recipe.eval and recipe.data."""
    ev = cfg.recipe.eval
    if ev.interval is None or not (_datasets_differ(ev.datasets) or ev.custom_reward_function):
        return None
    sets = []
    for dataset in ev.datasets:
        entry: dict[str, Any] = {"name": dataset.name, "path": dataset.path}
        for ours, theirs in EVAL_SET_FIELDS.items():
            value = getattr(dataset, ours)
            if value is False:  # label_key, tool_key: slime reads none where it is null
                entry[theirs] = None
            elif value is not None:
                entry[theirs] = (
                    SLIME_REWARD_TYPES.get(value, value) if ours == "reward_type" else value
                )
        sets.append(entry)
    import yaml

    section: dict[str, Any] = {"datasets": sets}
    if ev.custom_reward_function:  # every set's that names none of its own
        section = {"defaults": {"custom_rm_path": ev.custom_reward_function}, **section}
    text = yaml.safe_dump({"eval": section}, sort_keys=False)
    return f"{_ckpt_dir(cfg)}{EVAL_CONFIG_FILE}", text


def _eval_key(keys: set[str | bool | None], name: str, training: str | None) -> list[Flag]:
    """--eval-*-key when every set reads one field that is not the one slime falls back to:
    slime takes an unset --eval-*-key from --input-key, --label-key, --tool-key, which the
    export writes as training's keys (eval_config.py, pick_from_args), so the flag with
    training's field, or with none, changes nothing (false, reading none, is the file's)."""
    if len(keys) != 1:
        return []
    key = next(iter(keys))
    return [flag(name, key)] if isinstance(key, str) and key != training else []


def eval_args(cfg: RunConfig, plan: Plan) -> list[Flag]:
    ev = cfg.recipe.eval
    if ev.interval is None:
        return []
    config = eval_config_file(cfg)
    datasets = [item for d in ev.datasets for item in (d.name, d.path)]
    data = cfg.recipe.data
    # the file names each set's keys that are not training's; the flags, for every set alike
    sets = [] if config else ev.datasets
    return [
        flag("--eval-interval", ev.interval),
        # slime reads the sets from the file when given one, else from the name/path pairs
        flag("--eval-config", config[0]) if config else flag("--eval-prompt-data", *datasets),
        *_eval_key({d.input_key for d in sets}, "--eval-input-key", data.input_key),
        *_eval_key({d.label_key for d in sets}, "--eval-label-key", data.label_key),
        *_eval_key({d.tool_key for d in sets}, "--eval-tool-key", data.tool_key),
        flag("--n-samples-per-eval-prompt", ev.n_samples_per_prompt),
        *option(ev.max_response_len, "--eval-max-response-len"),
        *option(ev.max_prompt_len, "--eval-max-prompt-len"),
        *option(ev.temperature, "--eval-temperature"),
        *option(ev.top_p, "--eval-top-p"),
        *option(ev.top_k, "--eval-top-k"),
        *switch(ev.skip_before_train, "--skip-eval-before-train"),
    ]


def grpo_args(cfg: RunConfig, plan: Plan) -> list[Flag]:
    a = cfg.recipe.algo
    kl = [flag("--kl-loss-coef", a.kl_loss_coef), flag("--kl-loss-type", a.kl_loss_type)]
    # slime's own defaults (2.0, 0) are left to it
    tis = [
        *option(a.tis_clip_high, "--tis-clip", 2.0),
        *option(a.tis_clip_low, "--tis-clip-low", 0.0),
    ]
    return [
        flag("--advantage-estimator", a.advantage_estimator),
        *switch(a.use_kl_loss, "--use-kl-loss"),
        *(kl if a.use_kl_loss else []),
        *option(a.kl_coef, "--kl-coef", 0.0),
        flag("--entropy-coef", a.entropy_coef),
        flag("--eps-clip", a.eps_clip),
        *option(a.eps_clip_high, "--eps-clip-high"),
        *option(a.eps_clip_c, "--eps-clip-c"),
        *switch(a.normalize_advantages, "--normalize-advantages"),
        *switch(not a.grpo_std_normalization, "--disable-grpo-std-normalization"),
        *option(a.gamma, "--gamma", 1.0),
        *switch(a.off_policy_correction == "tis", "--use-tis"),
        *(tis if a.off_policy_correction == "tis" else []),
        *switch(a.loss_reduction == "token_mean", "--calculate-per-token-loss"),
    ]


def optimizer_args(cfg: RunConfig, plan: Plan) -> list[Flag]:
    o = cfg.recipe.optim
    return [
        flag("--optimizer", o.optimizer),
        flag("--lr", o.lr),
        flag("--lr-decay-style", o.lr_decay_style),
        *option(o.min_lr, "--min-lr", 0.0),
        *option(o.lr_warmup_steps, "--lr-warmup-iters", 0),
        *option(o.lr_decay_steps, "--lr-decay-iters"),
        flag("--weight-decay", o.weight_decay),
        flag("--adam-beta1", o.adam_beta1),
        flag("--adam-beta2", o.adam_beta2),
        *option(o.adam_eps, "--adam-eps", 1e-8),
        *option(o.clip_grad, "--clip-grad", 1.0),
        *switch(o.cpu_offload, "--optimizer-cpu-offload"),
        *switch(o.overlap_cpu_optimizer_d2h_h2d, "--overlap-cpu-optimizer-d2h-h2d"),
        *switch(o.precision_aware_optimizer, "--use-precision-aware-optimizer"),
    ]


def perf_args(cfg: RunConfig, plan: Plan) -> list[Flag]:
    p, train = plan.parallel, cfg.recipe.train
    recompute = [
        flag("--recompute-granularity", p.recompute),
        flag("--recompute-method", p.recompute_method),
        flag("--recompute-num-layers", p.recompute_num_layers),
    ]
    batching = [flag("--micro-batch-size", train.micro_batch_size)]
    if train.use_dynamic_batch_size:
        batching = [
            ("--use-dynamic-batch-size",),
            flag("--max-tokens-per-gpu", train.max_tokens_per_gpu),
        ]
    return [
        flag("--tensor-model-parallel-size", p.tp),
        *switch(p.sequence_parallel, "--sequence-parallel"),
        flag("--pipeline-model-parallel-size", p.pp),
        flag("--context-parallel-size", p.cp),
        flag("--expert-model-parallel-size", p.ep),
        flag("--expert-tensor-parallel-size", p.etp),
        *option(p.num_layers_in_first_pipeline_stage, "--decoder-first-pipeline-num-layers"),
        *option(p.num_layers_in_last_pipeline_stage, "--decoder-last-pipeline-num-layers"),
        *(recompute if p.recompute != "none" else []),
        *batching,
    ]


def _sglang_option(name: str, value: Any) -> list[Flag]:
    dashed = slime_sglang_flag(name)
    if isinstance(value, bool):
        return switch(value, dashed)
    if isinstance(value, list | tuple):
        return [flag(dashed, *value)]
    return [flag(dashed, value)]


def sglang_args(cfg: RunConfig, plan: Plan) -> list[Flag]:
    """Engine size, then the SGLang options in the layout's order. A derived memory fraction
    is spelled out only when colocated: decoupled, SGLang derives the same value itself."""
    skip = set()
    if plan.is_derived("layout.rollout.sglang.mem_fraction_static") and not plan.placement.colocate:
        skip.add("mem_fraction_static")
    flags = [flag("--rollout-num-gpus-per-engine", plan.engine.gpus_per_engine)]
    for name, value in plan.engine.sglang:
        if name not in skip:
            flags += _sglang_option(name, value)
    # slime's rollout client allows --sglang-server-concurrency x (number of engines)
    # requests at once; rlpost's max_concurrency is that total
    total = cfg.recipe.rollout.max_concurrency
    if total is not None:
        per_engine = -(-total // plan.placement.num_engines)
        flags += option(per_engine, "--sglang-server-concurrency", 512)
    return flags


SLIME_HEALTH_CHECKS = (
    ("health_check_interval_s", "--rollout-health-check-interval", 30.0),
    ("health_check_timeout_s", "--rollout-health-check-timeout", 30.0),
    ("health_check_first_wait_s", "--rollout-health-check-first-wait", 0.0),
)
"""The engines' health checks: rlpost's setting, slime's flag and slime's default."""


def runtime_args(cfg: RunConfig, plan: Plan) -> list[Flag]:
    """Fault tolerance, weight updates and the collective timeout, where they differ from
    slime's defaults (weight updates by CUDA IPC colocated and NCCL decoupled, as rlpost's
    auto picks them; buckets of 512 MiB; ten minutes)."""
    e = cfg.engine
    flags: list[Flag] = []
    if e.fault_tolerance:
        flags.append(("--use-fault-tolerance",))
        for name, slime_flag, default in SLIME_HEALTH_CHECKS:
            flags += option(_number(getattr(e, name)), slime_flag, default)
    if e.weight_sync == "disk":  # auto picks what slime picks on GPUs
        ckpt_dir = f"{(cfg.run.dir or '.').rstrip('/')}/{SLIME_CKPT_DIR}/"
        flags.append(flag("--update-weight-transport", "disk"))
        flags.append(flag("--update-weight-disk-dir", f"{ckpt_dir}weights/"))
    flags += option(e.weight_bucket_mb << 20, "--update-weight-buffer-size", 512 << 20)
    minutes = math.ceil(cfg.trainer.collective_timeout_s / 60)  # slime takes whole minutes
    flags += option(minutes, "--distributed-timeout-minutes", 10)
    return flags


def _number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def mtp_model_args(cfg: RunConfig) -> list[Flag]:
    """slime builds (and loads) the MTP layers only when told their count; rlpost builds them
    only to train them, and otherwise passes their weights through to the engines."""
    train = cfg.recipe.train
    return [flag("--mtp-num-layers", cfg.model.mtp_num_layers)] if train.mtp_training else []


def spec_args(cfg: RunConfig, plan: Plan) -> list[Flag]:
    """MTP training (the seeds spell out the scaling factor even at its default)."""
    train = cfg.recipe.train
    if not train.mtp_training:
        return []
    return [
        ("--enable-mtp-training",),
        flag("--mtp-loss-scaling-factor", train.mtp_loss_scaling_factor),
    ]


def tracking_args(cfg: RunConfig, plan: Plan) -> list[Flag]:
    wandb = cfg.tracking.wandb
    wandb_flags = [
        ("--use-wandb",),
        flag("--wandb-mode", wandb.mode),
        flag("--wandb-project", wandb.project),
        *option(wandb.group, "--wandb-group"),
        *option(wandb.run_id, "--wandb-run-id"),
    ]
    return [
        *(wandb_flags if wandb.enabled else []),
        *switch(cfg.tracking.tensorboard, "--use-tensorboard"),
    ]


def misc_args(cfg: RunConfig, plan: Plan) -> list[Flag]:
    """Megatron settings slime's scripts always pass, the MoE dispatcher and the seed."""
    p = plan.parallel
    return [
        ("--attention-dropout", "0.0"),
        ("--hidden-dropout", "0.0"),
        ("--accumulate-allreduce-grads-in-fp32",),
        ("--attention-softmax-in-fp32",),
        ("--attention-backend", "flash"),
        *option(p.moe_token_dispatcher_type, "--moe-token-dispatcher-type"),
        *switch(p.moe_enable_deepep, "--moe-enable-deepep"),
        *option(cfg.run.seed, "--seed", 1234),
        *switch(cfg.run.deterministic, "--deterministic-mode"),
    ]


GROUPS: dict[str, Callable[[RunConfig, Plan], list[Flag]]] = {
    "CLUSTER_ARGS": cluster_args,
    "MODEL_ARGS": lambda cfg, plan: model_args(cfg.model) + mtp_model_args(cfg),
    "CKPT_ARGS": ckpt_args,
    "ROLLOUT_ARGS": rollout_args,
    "EVAL_ARGS": eval_args,
    "GRPO_ARGS": grpo_args,
    "OPTIMIZER_ARGS": optimizer_args,
    "PERF_ARGS": perf_args,
    "SGLANG_ARGS": sglang_args,
    "RUNTIME_ARGS": runtime_args,
    "SPEC_ARGS": spec_args,
    "TRACKING_ARGS": tracking_args,
    "MISC_ARGS": misc_args,
}


# recipe features slime has no counterpart for: (key, value test, why, fix)
NOT_IN_SLIME: tuple[tuple[str, Callable[[RunConfig], bool], str, str], ...] = (
    (
        "recipe.rollout.reward.custom_function",
        lambda cfg: (
            bool(cfg.recipe.rollout.reward.custom_function)
            and any(d.reward_type is not None for d in cfg.recipe.eval.datasets)
        ),
        "slime scores every sample with --custom-rm-path before any rm_type, an evaluation "
        "set's included: the sets that name a reward_type here would be scored by the "
        "function there",
        "export without the custom function, or without the evaluation sets' reward_type",
    ),
    (
        "recipe.loop.mode",
        lambda cfg: cfg.recipe.loop.mode == "fully_async",
        "slime's fully-async rollout (train_async.py with --rollout-function-path "
        "slime.rollout.fully_async_rollout.generate_rollout_fully_async) bounds no policy lag "
        "and regenerates the groups a weight update interrupts: it would train tokens older "
        "than max_staleness, which rlpost's loop never does",
        "export with recipe.loop.mode=async (one rollout ahead), or run fully_async in rlpost",
    ),
    (
        "recipe.algo.off_policy_correction",
        lambda cfg: cfg.recipe.algo.off_policy_correction == "decoupled_ppo",
        "slime corrects off-policy tokens with truncated importance sampling only (--use-tis)",
        "export with recipe.algo.off_policy_correction=tis",
    ),
    (
        "recipe.rollout.generate_function",
        lambda cfg: cfg.recipe.rollout.generate_function is not None,
        "rlpost's generate functions take (sample, ctx) and slime's "
        "--custom-generate-function-path calls generate(args, sample, sampling_params): "
        "slime would call this one wrongly",
        "port the function to slime's signature and pass it to slime yourself, or export "
        "without it",
    ),
    (
        "recipe.rollout.reward.model",
        lambda cfg: cfg.recipe.rollout.reward.type == "model",
        "slime has no reward model classes (--custom-rm-path names a function rm(args, sample))",
        "export with a reward type slime has (math, deepscaler, dapo, f1, remote)",
    ),
    (
        "recipe.eval.interval",
        lambda cfg: (
            cfg.recipe.eval.interval is None
            and bool(cfg.recipe.eval.datasets)
            and not cfg.recipe.eval.skip_before_train
        ),
        "rlpost evaluates once before training, and slime evaluates only with "
        "--eval-interval: the export would evaluate nothing",
        "set recipe.eval.interval (recipe.rollout.num_rollout: before training and after "
        "the last rollout)",
    ),
    (
        "recipe.save.save_hf_interval",
        lambda cfg: cfg.recipe.save.save_hf_interval not in (None, cfg.recipe.save.interval),
        "slime writes an HF folder (--save-hf) at every checkpoint save, and at no other interval",
        "set save_hf_interval to save.interval, or remove it",
    ),
    (
        "trainer.backend",
        lambda cfg: cfg.trainer.backend == "torch",
        f"slime at {SLIME_COMMIT} trains with Megatron-LM only (--train-backend megatron)",
        "export with trainer.backend: megatron (or auto)",
    ),
    (
        "recipe.data.source",
        lambda cfg: cfg.recipe.data.source is not None,
        "rlpost's data sources are built as cls(ctx) with get_samples/add_samples/state_dict; "
        "slime's --data-source-path classes take (args) and another interface",
        "export with recipe.data.prompt_data, or port the class to slime's RolloutDataSource",
    ),
    (
        "recipe.data.label_key",
        lambda cfg: any("." in key for key in _data_keys(cfg)),
        "a dotted input or label key (the data section's or an evaluation set's) reads a "
        "nested field here (reward_model.ground_truth), and slime reads a row's top-level keys "
        "only: it would look for one key of that name",
        "flatten the field into a top-level column and name that column, or export without "
        "the dotted key (a top-level column whose name holds a dot: rename it)",
    ),
    (
        "recipe.data.tool_key",
        lambda cfg: cfg.recipe.data.tool_key is None,
        "slime passes a row's 'tools' field to the chat template whenever the row has one "
        "(--tool-key has no off): rows rlpost renders without tools would get them in slime",
        "rename the column in the data, or export with recipe.data.tool_key: tools",
    ),
)


# settings rlpost's trainer runs and Megatron-LM's validate_args refuses, so slime would stop
# at start-up: (key, value test, why, fix)
MEGATRON_REFUSES: tuple[tuple[str, Callable[[RunConfig], bool], str, str], ...] = (
    (
        "recipe.optim.precision_aware_optimizer",
        lambda cfg: cfg.recipe.optim.cpu_offload and not cfg.recipe.optim.precision_aware_optimizer,
        "recipe.optim.cpu_offload exports as --optimizer-cpu-offload, which Megatron-LM's "
        f"validate_args accepts only with --use-precision-aware-optimizer ({BY_LINE[1190].cite()}:"
        " the hybrid device optimizer reuses that code path); slime would stop at start-up",
        "set recipe.optim.precision_aware_optimizer: true (as the shipped CPU-Adam layouts do), "
        "or recipe.optim.cpu_offload: false",
    ),
)


def _data_keys(cfg: RunConfig) -> list[str]:
    """The row keys the prompt files are read by: the data section's and every set's."""
    data = cfg.recipe.data
    keys = [data.input_key, data.label_key or ""]
    for dataset in cfg.recipe.eval.datasets:
        keys += [dataset.input_key or "", dataset.label_key or ""]
    return keys


def _json_text_prompts(cfg: RunConfig) -> list[Issue]:
    """The prompt files this machine has (training's, each evaluation set's) whose prompt
    field holds message lists as JSON text somewhere: rlpost decodes them, and slime applies
    the chat template to the string as the user's text. The first such row is named."""
    data = cfg.recipe.data
    files: list[tuple[str, str | None, str | None]] = []
    if data.source is None:
        files.append(("recipe.data", data.prompt_data, None))
    for i, d in enumerate(cfg.recipe.eval.datasets):
        files.append((f"recipe.eval.datasets.{i}", d.path, d.input_key))
    issues = []
    for section, path_text, own_key in files:
        if path_text is None:
            continue
        prompt_file = split_prompt_path(path_text)
        if not Path(prompt_file.path).expanduser().is_file():  # the launch checks it there
            continue
        input_key = own_key or data.input_key
        rows = prompt_rows(prompt_file)
        try:
            found = next((n for n, raw in rows if holds_json_messages(raw, input_key)), None)
        except UnreadableFile:  # the preflight says why
            continue
        if found is not None:
            key = f"{section}.{'prompt_data' if section == 'recipe.data' else 'path'}"
            why = (
                f"{prompt_file.unit} {found}'s '{input_key}' (and maybe more) is a string "
                "holding a JSON message list: rlpost reads it as those messages, and slime "
                "would apply the chat template to the string as the user's text"
            )
            fix = "store the prompts as message lists (JSON arrays, not strings), then export"
            issues.append(Issue(key, why, fix, value=path_text))
    return issues


def _datasets_differ(datasets: Sequence[EvalDataset]) -> bool:
    """Evaluation sets whose keys differ, or that set their own sample counts, reward types
    or reward functions."""
    keys = {(d.input_key, d.label_key, d.tool_key) for d in datasets}
    own = any(
        d.n_samples_per_prompt is not None
        or d.max_response_len is not None
        or d.reward_type is not None
        or d.custom_reward_function is not None
        or d.label_key is False  # slime reads no label only where the file says null
        or d.tool_key is False  # nor tools
        for d in datasets
    )
    return len(keys) > 1 or own


def check_exportable(cfg: RunConfig, plan: Plan | None = None) -> None:
    """UserError for a recipe feature slime lacks, or a setting Megatron-LM refuses: never
    exported as something slime ignores or stops on (with the plan, the engines' SGLang
    options too)."""
    issues = [
        Issue(key, why, fix, value=cfg_value(cfg, key))
        for key, applies, why, fix in (*NOT_IN_SLIME, *MEGATRON_REFUSES)
        if applies(cfg)
    ]
    issues += _json_text_prompts(cfg)
    if plan is not None:
        issues += check_sglang_for_slime(plan)
    if issues:
        raise UserError(issues, title="slime export error")


def cfg_value(cfg: RunConfig, key: str) -> object:
    node: object = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def slime_flag_groups(cfg: RunConfig, plan: Plan) -> dict[str, list[Flag]]:
    check_exportable(cfg, plan)
    groups = {name: build(cfg, plan) for name, build in GROUPS.items()}
    return {name: flags for name, flags in groups.items() if flags}


def slime_arg_groups(cfg: RunConfig, plan: Plan) -> dict[str, list[str]]:
    """Group name -> the flat argument tokens, as a shell would split the rendered arrays."""
    return {
        name: [token for f in flags for token in f]
        for name, flags in slime_flag_groups(cfg, plan).items()
    }


def _quote(token: str) -> str:
    safe = token and all(c.isalnum() or c in "-_./:=+,@%" for c in token)
    return token if safe else "'" + token.replace("'", "'\\''") + "'"


def _arrays(groups: dict[str, list[Flag]]) -> list[str]:
    lines = []
    for name, flags in groups.items():
        lines.append(f"{name}=(")
        lines += ["   " + " ".join(_quote(t) for t in f) for f in flags]
        lines.append(")")
    return lines


def _file_writes(config: tuple[str, str] | None) -> list[str]:
    """Shell lines that write the --eval-config file before slime starts, if there is one."""
    if config is None:
        return []
    path, text = config
    end = "RLPOST_EVAL_CONFIG"
    return [
        f"mkdir -p {_quote(str(Path(path).parent))}",
        f"cat > {_quote(path)} <<'{end}'",
        *text.rstrip("\n").split("\n"),
        end,
    ]


def _entry(cfg: RunConfig) -> str:
    return "train_async.py" if cfg.recipe.loop.mode == "async" else "train.py"


def render_slime_args(cfg: RunConfig, plan: Plan, fmt: str = "table") -> str:
    """`table`: bash arrays per group, then the train.py command line that uses them; `json`:
    the groups' argument tokens; `script`: a complete launch script in the shape of slime's
    scripts/run-*.sh (environment, Ray head, `ray job submit` with the runtime env)."""
    groups = slime_flag_groups(cfg, plan)
    config = eval_config_file(cfg)
    if fmt == "json":
        tokens = {name: [t for f in flags for t in f] for name, flags in groups.items()}
        data: dict[str, Any] = {"slime": PINNED, "entry": _entry(cfg), "args": tokens}
        if config is not None:
            data["files"] = {config[0]: config[1]}  # what --eval-config names, to write first
        return json.dumps(data, indent=2) + "\n"
    files = _file_writes(config)
    header = [
        f"# slime arguments for model={plan.model} recipe={plan.recipe} "
        f"hardware={plan.hardware} (layout {plan.layout})",
        f"# written by rlpost from its plan for {PINNED}",
    ]
    uses = " \\\n".join(f"   ${{{name}[@]}}" for name in groups)
    if fmt != "script":
        lines = [*header, *files, *_arrays(groups), f"\npython3 {_entry(cfg)} \\\n{uses}"]
        return "\n".join(lines) + "\n"
    env = "".join(f"export {k}={_quote(v)}\n" for k, v in RUNTIME_ENV.items())
    runtime = json.dumps({"env_vars": RUNTIME_ENV})
    p = plan.placement
    head = (
        'ray start --head --node-ip-address "${MASTER_ADDR}" '
        f"--num-gpus {p.gpus_per_node} --disable-usage-stats"
    )
    workers = ""
    if p.num_nodes > 1:
        workers = (
            f"# {p.num_nodes - 1} more node(s) join with `ray start --address "
            f"${{MASTER_ADDR}}:6379 --num-gpus {p.gpus_per_node}` (or `rlpost cluster up "
            "--hostfile FILE`)\n"
        )
    lines = [
        "#!/bin/bash",
        *header,
        "set -ex",
        env.rstrip("\n"),
        'MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"',
        head,
        *([workers.rstrip("\n")] if workers else []),
        "",
        *files,
        *_arrays(groups),
        "",
        f"RUNTIME_ENV_JSON={_quote(runtime)}",
        "",
        'ray job submit --address="http://127.0.0.1:8265" \\',
        '   --runtime-env-json="${RUNTIME_ENV_JSON}" \\',
        f"   -- python3 {_entry(cfg)} \\",
        uses,
    ]
    return "\n".join(line for line in lines if line is not None) + "\n"
