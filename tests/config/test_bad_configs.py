"""A corpus of bad configurations: each names the right key, where it was set, and why.

Most cases run in-process through `compose_run_config` (the launcher's own path); a handful
run `launch.py` as a subprocess to hold the user-facing contract: exit status 2, the
message on stderr, no traceback. Planning-side cases live in test_bad_plans.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from rlpost.config.loader import compose_run_config
from rlpost.errors import Issue, UserError

REPO = Path(__file__).resolve().parents[2]
HOOK_FIXTURES = REPO / "tests" / "hooks_fixtures"
CMD = "command line"
QWEN = ["model=qwen3-4b", "recipe=grpo_dapo", "hardware=h100x8"]
GLM9 = ["model=glm4-9b", "recipe=grpo_dapo", "hardware=h100x8"]


@dataclass(frozen=True)
class Case:
    name: str
    overrides: tuple[str, ...]
    key: str
    where: str  # "command line", or the base name of the file that set the key
    fragment: str  # part of the message


@pytest.fixture(scope="module")
def user_conf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user config dir with broken files, and a checkpoint folder whose config.json disagrees."""
    root = tmp_path_factory.mktemp("user_conf")
    (root / "recipe").mkdir()
    (root / "model").mkdir()
    (root / "recipe" / "typo_recipe.yaml").write_text(
        "defaults:\n  - grpo_dapo\n  - _self_\n\nname: typo_recipe\nrollout:\n  temprature: 0.9\n"
    )
    (root / "recipe" / "cold_recipe.yaml").write_text(
        "defaults:\n  - grpo_dapo\n  - _self_\n\nname: cold_recipe\nrollout:\n  temperature: -0.5\n"
    )
    base = (REPO / "conf" / "model" / "qwen3-4b.yaml").read_text()
    (root / "model" / "deep_typo.yaml").write_text(
        base + "moe:\n  num_experts: 8\n  top_kk: 2\n  expert_ffn_hidden_size: 64\n"
    )
    (root / "model" / "no_hidden.yaml").write_text(
        "\n".join(ln for ln in base.splitlines() if not ln.startswith("hidden_size:")) + "\n"
    )
    (root / "model" / "no_ref.yaml").write_text(
        "\n".join(ln for ln in base.splitlines() if not ln.startswith("ref_load:")) + "\n"
    )
    (root / "model" / "bad_ref.yaml").write_text(
        base.replace("ref_load: /root/Qwen3-4B_torch_dist", "ref_load: ${.hf_chekpoint}")
    )
    ckpt = root / "ckpt"
    ckpt.mkdir()
    hf = {
        "architectures": ["Qwen3ForCausalLM"],
        "num_hidden_layers": 36,
        "hidden_size": 2560,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "vocab_size": 151936,
    }
    (ckpt / "config.json").write_text(json.dumps(hf))
    return root


CASES = [
    # unknown keys, at several depths and from several places
    Case(
        "cli_unknown_key",
        ("recipe.rollout.temprature=0.8",),
        "recipe.rollout.temprature",
        CMD,
        "Did you mean 'temperature'?",
    ),
    Case(
        "cli_unknown_top_level",
        ("+trainr.backend=torch",),
        "trainr.backend",
        CMD,
        "Did you mean 'trainer'?",
    ),
    Case(
        "cli_misplaced_key",
        ("recipe.max_tokens_per_gpu=4096",),
        "recipe.max_tokens_per_gpu",
        CMD,
        "recipe.train.max_tokens_per_gpu",
    ),
    Case(
        "yaml_unknown_key",
        ("recipe=typo_recipe",),
        "recipe.rollout.temprature",
        "typo_recipe.yaml",
        "Did you mean 'temperature'?",
    ),
    Case(
        "yaml_unknown_key_depth3",
        ("model=deep_typo",),
        "model.moe.top_kk",
        "deep_typo.yaml",
        "Did you mean 'top_k'?",
    ),
    Case(
        "yaml_missing_key",
        ("model=no_hidden",),
        "model.hidden_size",
        "no_hidden.yaml",
        "required key is missing",
    ),
    # unknown group choices
    Case("unknown_model", ("model=glm4-9",), "model", CMD, "Did you mean 'glm4-9b'?"),
    Case(
        "unknown_recipe",
        ("recipe=grpo_dapo_asynk",),
        "recipe",
        CMD,
        "Did you mean 'grpo_dapo_async'?",
    ),
    Case("unknown_hardware", ("hardware=h100x32",), "hardware", CMD, "no config 'h100x32'"),
    # types and ranges
    Case(
        "int_type",
        (*QWEN, "recipe.rollout.n_samples_per_prompt=eight"),
        "recipe.rollout.n_samples_per_prompt",
        CMD,
        "valid integer",
    ),
    Case("bool_type", (*QWEN, "layout.colocate=maybe"), "layout.colocate", CMD, "valid boolean"),
    Case(
        "literal_choice",
        (*QWEN, "engine.backend=sglangg"),
        "engine.backend",
        CMD,
        "Did you mean 'sglang'?",
    ),
    Case(
        "range",
        (*QWEN, "recipe.rollout.top_p=1.5"),
        "recipe.rollout.top_p",
        CMD,
        "less than or equal to 1",
    ),
    Case(
        "section_as_scalar", (*QWEN, "recipe.optim=fast"), "recipe.optim", CMD, "valid dictionary"
    ),
    Case("list_type", (*QWEN, "recipe.rollout.stop=abc"), "recipe.rollout.stop", CMD, "valid list"),
    # cross-field rules
    Case(
        "temperature_zero",
        (*QWEN, "recipe.rollout.temperature=0"),
        "recipe.rollout.temperature",
        CMD,
        "must be > 0",
    ),
    Case(
        "temperature_negative_yaml",
        ("model=qwen3-4b", "recipe=cold_recipe"),
        "recipe.rollout.temperature",
        "cold_recipe.yaml",
        "must be > 0",
    ),
    Case(
        "batch_not_divisible",
        (*QWEN, "recipe.train.global_batch_size=100"),
        "recipe.train.global_batch_size",
        CMD,
        "is not a multiple of train.global_batch_size=100",
    ),
    Case(
        "over_sampling_below_batch",
        (*QWEN, "recipe.rollout.over_sampling_batch_size=16"),
        "recipe.rollout.over_sampling_batch_size",
        CMD,
        "below batch_size=32",
    ),
    Case(
        "dynamic_batch_without_cap",
        (*QWEN, "recipe.train.max_tokens_per_gpu=null"),
        "recipe.train.max_tokens_per_gpu",
        CMD,
        "max_tokens_per_gpu, which is not set",
    ),
    Case(
        "sequence_parallel_tp1",
        (*GLM9, "layout.train.tp=1"),
        "layout.train.sequence_parallel",
        "glm4-9b_h100x8.yaml",
        "tp=1",
    ),
    Case(
        "kl_loss_without_ref",
        (*QWEN, "model.ref_load=null", "recipe.algo.kl_loss_coef=0.01"),
        "model.ref_load",
        CMD,
        "needs a frozen reference model",
    ),
    Case(
        "kl_metric_without_ref_unset",
        ("model=no_ref", "recipe=grpo_dapo", "recipe.algo.kl_metric_interval=5"),
        "model.ref_load",
        "default",
        "kl_metric_interval needs a frozen reference model",
    ),
    Case(
        "recompute_method_without_full",
        (
            *QWEN,
            "layout.train.recompute.granularity=selective",
            "layout.train.recompute.method=block",
        ),
        "layout.train.recompute.method",
        CMD,
        "which layers full recompute covers",
    ),
    Case(
        "kl_metric_interval_where_kl_weighs",
        (*QWEN, "recipe.algo.kl_loss_coef=0.01", "recipe.algo.kl_metric_interval=5"),
        "recipe.algo.kl_metric_interval",
        CMD,
        "it is measured every rollout",
    ),
    Case(
        "kl_coef_without_kl_loss",
        (*QWEN, "recipe.algo.use_kl_loss=false", "recipe.algo.kl_loss_coef=0.1"),
        "recipe.algo.kl_loss_coef",
        CMD,
        "has no effect",
    ),
    Case(
        "context_overflow",
        (*QWEN, "recipe.rollout.max_response_len=50000"),
        "recipe.rollout.max_response_len",
        CMD,
        "beyond model.max_position_embeddings=40960",
    ),
    Case(
        "context_overflow_prompts_unbounded",
        (*QWEN, "recipe.rollout.max_response_len=50000"),
        "recipe.rollout.max_response_len",
        CMD,
        "(the response alone: recipe.data.max_prompt_len is unset, and prompts add to it)",
    ),
    Case(
        "context_overflow_with_the_prompt",
        (*QWEN, "recipe.rollout.max_response_len=40000", "recipe.data.max_prompt_len=1024"),
        "recipe.rollout.max_response_len",
        CMD,
        "prompt + response can reach 41024 tokens (max_prompt_len 1024 + response)",
    ),
    Case(
        "eval_context_overflow",
        (*QWEN, "recipe.eval.max_response_len=60000"),
        "recipe.eval.max_response_len",
        CMD,
        "beyond model.max_position_embeddings",
    ),
    Case(
        "eval_context_overflow_with_the_eval_prompt",
        (*QWEN, "recipe.eval.max_prompt_len=2048", "recipe.eval.max_response_len=40000"),
        "recipe.eval.max_response_len",
        CMD,
        "prompt + response can reach 42048 tokens (eval.max_prompt_len 2048 + response)",
    ),
    Case(
        "eval_max_prompt_len_without_sets",
        (
            *QWEN,
            "recipe.eval.datasets=[]",
            "recipe.eval.interval=null",
            "recipe.eval.max_prompt_len=1024",
        ),
        "recipe.eval.max_prompt_len",
        CMD,
        "has no effect: it bounds the prompts of the evaluation sets, and none is named",
    ),
    Case(
        "buffer_filter_without_partial",
        (*QWEN, "recipe.rollout.buffer_filter=rlpost.filters.pop_first"),
        "recipe.rollout.buffer_filter",
        CMD,
        "partial_rollout is off",
    ),
    Case(
        "eval_interval_without_datasets",
        (*QWEN, "recipe.eval.datasets=[]"),
        "recipe.eval.datasets",
        CMD,
        "no datasets are named",
    ),
    Case(
        "query_groups_not_dividing",
        (*QWEN, "model.num_query_groups=5"),
        "model.num_query_groups",
        CMD,
        "not a multiple of num_query_groups=5",
    ),
    Case(
        "moe_top_k_above_experts",
        ("model=glm4.7-flash", "hardware=h100x8", "model.moe.top_k=100"),
        "model.moe.top_k",
        CMD,
        "exceeds num_experts=64",
    ),
    Case(
        "colocated_with_rollout_gpus",
        (*QWEN, "layout.rollout.num_gpus=4"),
        "layout.rollout.num_gpus",
        CMD,
        "colocate: true shares the train GPUs",
    ),
    Case(
        "eval_temperature_negative",
        (*QWEN, "recipe.eval.temperature=-0.5"),
        "recipe.eval.temperature",
        CMD,
        "is negative",
    ),
    Case(
        "eval_datasets_never_evaluated",
        (*QWEN, "recipe.eval.interval=null", "recipe.eval.skip_before_train=true"),
        "recipe.eval.interval",
        CMD,
        "never evaluated",
    ),
    Case(
        "behaviour_cap_drops_on_policy_tokens",
        (
            *QWEN,
            "recipe.algo.off_policy_correction=decoupled_ppo",
            "recipe.algo.behaviour_weight_cap=0.9",
        ),
        "recipe.algo.behaviour_weight_cap",
        CMD,
        "nearly all of the tokens would be dropped",
    ),
    Case(
        "empty_stop_string",
        (*QWEN, 'recipe.rollout.stop=[""]'),
        "recipe.rollout.stop",
        CMD,
        "holds an empty string",
    ),
    Case(
        "deepep_without_flex_dispatcher",
        (
            "model=glm4.7-flash",
            "recipe=grpo_dapo",
            "hardware=h100x8",
            "layout.train.moe_enable_deepep=true",
        ),
        "layout.train.moe_token_dispatcher_type",
        "glm4.7-flash_h100x8.yaml",
        "backend of the flex token dispatcher",
    ),
    # hooks
    Case(
        "hook_not_dotted",
        (*QWEN, "recipe.rollout.reward.custom_function=score"),
        "recipe.rollout.reward.custom_function",
        CMD,
        "is not a dotted path",
    ),
    Case(
        "hook_module_typo",
        (
            *QWEN,
            "recipe.rollout.partial_rollout=true",
            "recipe.rollout.buffer_filter=rlpost.filterz.pop_first",
        ),
        "recipe.rollout.buffer_filter",
        CMD,
        "Did you mean 'rlpost.filters'?",
    ),
    Case(
        "hook_attribute_typo",
        (*QWEN, "recipe.rollout.dynamic_sampling_filter=rlpost.filters.check_reward_nonzero_stdev"),
        "recipe.rollout.dynamic_sampling_filter",
        CMD,
        "Did you mean 'rlpost.filters.check_reward_nonzero_std'?",
    ),
    Case(
        "hook_wrong_signature",
        (*QWEN, "recipe.rollout.dynamic_sampling_filter=rlpost.filters.pop_first"),
        "recipe.rollout.dynamic_sampling_filter",
        CMD,
        "expected def fn(samples)",
    ),
    Case(
        "reward_function_of_neither_shape",
        (*QWEN, "recipe.rollout.reward.custom_function=rlpost_test_hooks.verl_and_sample"),
        "recipe.rollout.reward.custom_function",
        CMD,
        "requires 4 positional parameters (sample, data_source, solution_str, ground_truth); "
        "expected [async] def fn(sample), or verl's [async] def fn(data_source, solution_str, "
        "ground_truth, extra_info=None)",
    ),
    Case(
        "eval_reward_function_of_neither_shape",
        (
            *QWEN,
            "recipe.eval.interval=10",
            "recipe.eval.datasets=[{name: a, path: /d/a.jsonl,"
            " custom_reward_function: rlpost_test_hooks.two_args}]",
        ),
        "recipe.eval.datasets.0.custom_reward_function",
        CMD,
        "or verl's [async] def fn(data_source, solution_str, ground_truth, extra_info=None)",
    ),
    Case(
        "hook_import_fails",
        (*QWEN, "recipe.rollout.reward.custom_function=rlpost_broken_hooks.reward"),
        "recipe.rollout.reward.custom_function",
        CMD,
        "which is not installed",
    ),
    Case(
        "generate_function_not_async",
        (*QWEN, "recipe.rollout.generate_function=rlpost.filters.check_reward_nonzero_std"),
        "recipe.rollout.generate_function",
        CMD,
        "expected async def fn(sample, ctx)",
    ),
    Case(
        "max_turns_without_a_generate_function",
        (*QWEN, "recipe.rollout.max_turns=4"),
        "recipe.rollout.max_turns",
        CMD,
        "the default generate function takes one turn",
    ),
    Case(
        "generate_settings_checked_by_the_hook",
        (
            *QWEN,
            "recipe.rollout.generate_function=rlpost.envs.http_tool.generate",
            "+recipe.rollout.generate_settings.url=search.internal:8000",
        ),
        "recipe.rollout.generate_settings.url",
        CMD,
        "is not an http(s) URL",
    ),
    Case(
        "fully_async_staleness_below_the_push_interval",
        (
            *QWEN,
            "recipe.loop.mode=fully_async",
            "recipe.loop.max_staleness=1",
            "recipe.loop.update_weights_interval=3",
        ),
        "recipe.loop.max_staleness",
        CMD,
        "max_staleness=1 is below 2: with the weights pushed every 3 steps",
    ),
    Case(
        "fully_async_default_staleness_below_the_push_interval",
        (*QWEN, "recipe.loop.mode=fully_async", "recipe.loop.update_weights_interval=6"),
        "recipe.loop.update_weights_interval",
        CMD,
        "max_staleness (unset: 4) is below 5: with the weights pushed every 6 steps",
    ),
    Case(
        "fully_async_buffer_smaller_than_a_draw",
        (
            "model=qwen3-4b",
            "recipe=grpo_dapo_dynamic_sampling",
            "hardware=h100x8",
            "recipe.loop.mode=fully_async",
            "recipe.loop.max_buffered_groups=48",
        ),
        "recipe.loop.max_buffered_groups",
        CMD,
        "a single draw puts more groups ahead of the trainer than the 48 the bound",
    ),
    Case(
        "generate_settings_the_calculator_never_reads",
        (
            *QWEN,
            "recipe.rollout.generate_function=rlpost.envs.calculator.generate",
            "recipe.rollout.max_turns=2",
            "+recipe.rollout.generate_settings.timeout_s=5",
        ),
        "recipe.rollout.generate_settings.timeout_s",
        CMD,
        "rlpost.envs.calculator.generate reads no settings",
    ),
    Case(
        "source_settings_without_a_source",
        (*QWEN, "recipe.data.source_settings={level: 2}"),
        "recipe.data.source_settings",
        CMD,
        "the jsonl source reads no settings",
    ),
    Case(
        "data_source_lacks_methods",
        (*QWEN, "recipe.data.source=rlpost_test_hooks.CALL_THREADS"),
        "recipe.data.source",
        CMD,
        "expected a class with get_samples, add_samples, state_dict, load_state_dict",
    ),
    Case(
        "data_source_settings_checked_by_the_class",
        (
            *QWEN,
            "recipe.data.source=rlpost_test_hooks.FeedbackSource",
            "+recipe.data.source_settings.max_repeats=-1",
        ),
        "recipe.data.source_settings.max_repeats",
        CMD,
        "must be an integer >= 0",
    ),
    Case(
        "reward_model_settings_check_that_returns_none_when_content",
        (
            *QWEN,
            "recipe.rollout.reward.type=model",
            "recipe.rollout.reward.model=rlpost_test_hooks.ModelWhoseCheckReturnsNothing",
            "+recipe.rollout.reward.model_settings.scale=2",
        ),
        "recipe.rollout.reward.model_settings",
        CMD,
        "ModelWhoseCheckReturnsNothing.check_settings returned NoneType None; it returns a "
        "list of (setting name, problem, fix) tuples of strings, [] when the settings are fine",
    ),
    Case(
        "reward_model_settings_check_that_returns_plain_messages",
        (
            *QWEN,
            "recipe.rollout.reward.type=model",
            "recipe.rollout.reward.model=rlpost_test_hooks.ModelWhoseCheckReturnsMessages",
            "+recipe.rollout.reward.model_settings.scale=-1",
        ),
        "recipe.rollout.reward.model_settings",
        CMD,
        "returned ['scale -1 must be positive'], whose entry 'scale -1 must be positive' is no "
        "such tuple",
    ),
    Case(
        "reward_model_call_not_async",
        (
            *QWEN,
            "recipe.rollout.reward.type=model",
            "recipe.rollout.reward.model=rlpost_test_hooks.PlainCallModel",
        ),
        "recipe.rollout.reward.model",
        CMD,
        "lacks an async def __call__",
    ),
    Case(
        "reward_model_with_a_reward_function",
        (
            *QWEN,
            "recipe.rollout.reward.type=model",
            "recipe.rollout.reward.model=rlpost_test_hooks.BoxedAnswerModel",
            "recipe.rollout.reward.custom_function=rlpost_test_hooks.length_reward",
        ),
        "recipe.rollout.reward.custom_function",
        CMD,
        "scores every sample with reward.model",
    ),
    Case(
        "reward_model_settings_without_a_model",
        (*QWEN, "recipe.rollout.reward.model_placement=actor"),
        "recipe.rollout.reward.model_placement",
        CMD,
        "uses no reward model class",
    ),
    Case(
        "model_save_has_no_effect",
        (*QWEN, "model.save=/root/ckpt"),
        "model.save",
        CMD,
        "rlpost writes checkpoints under <run.dir>/ckpt",
    ),
    # SGLang pass-through
    Case(
        "sglang_unknown_option",
        (*QWEN, "layout.rollout.sglang.mem_fractoin_static=0.5"),
        "layout.rollout.sglang.mem_fractoin_static",
        CMD,
        "Did you mean 'mem_fraction_static'?",
    ),
    Case(
        "sglang_wrong_type",
        (*QWEN, "layout.rollout.sglang.enable_dp_attention=sometimes"),
        "layout.rollout.sglang.enable_dp_attention",
        CMD,
        "takes true or false",
    ),
    Case(
        "sglang_plan_owned",
        (*QWEN, "layout.rollout.sglang.tp_size=4"),
        "layout.rollout.sglang.tp_size",
        CMD,
        "set by rlpost for each engine",
    ),
    # interpolations
    Case(
        "bad_interpolation_cli",
        (*QWEN, "model.ref_load=${model.hf_checkpiont}"),
        "model.ref_load",
        CMD,
        "Interpolation key 'model.hf_checkpiont' not found",
    ),
    Case(
        "bad_interpolation_yaml",
        ("model=bad_ref",),
        "model.ref_load",
        "bad_ref.yaml",
        "cannot resolve ${.hf_chekpoint}",
    ),
    Case(
        "eval_sampled_n_times_at_a_greedy_temperature",
        (*QWEN, "recipe.eval.temperature=1e-7", "recipe.eval.n_samples_per_prompt=4"),
        "recipe.eval.n_samples_per_prompt",
        CMD,
        "greedy decoding (the engines' below 1e-06)",
    ),
    Case(
        "eval_sampled_n_times_at_top_k_1",
        (*QWEN, "recipe.eval.top_k=1"),
        "recipe.eval.n_samples_per_prompt",
        "grpo_dapo.yaml",
        "n_samples_per_prompt=16 with top_k=1: greedy decoding",
    ),
    Case(
        "restarts_with_one_checkpoint_at_the_end",
        (*QWEN, "run.max_restarts=2", "recipe.save.interval=3000"),
        "recipe.save.interval",
        CMD,
        "is 3000, of 3000 rollouts: no checkpoint is written before the end",
    ),
    Case(
        "engines_without_their_tokenizer",
        (*QWEN, "++layout.rollout.sglang.skip_tokenizer_init=true"),
        "layout.rollout.sglang.skip_tokenizer_init",
        CMD,
        "rewards grade each response's text",
    ),
    Case(
        "engine_sampling_defaults",
        (*QWEN, "++layout.rollout.sglang.sampling_defaults=openai"),
        "layout.rollout.sglang.sampling_defaults",
        CMD,
        "engine defaults never apply",
    ),
    Case(
        "eval_reward_type_beside_the_sets_function",
        (
            *QWEN,
            "recipe.eval.interval=10",
            "recipe.eval.datasets=[{name: a, path: /d/a.jsonl, reward_type: gpqa,"
            " custom_reward_function: rlpost_test_hooks.length_reward}]",
        ),
        "recipe.eval.datasets.0.reward_type",
        CMD,
        "scores the set's every sample before any reward type",
    ),
    Case(
        "eval_reward_type_beside_the_evaluations_function",
        (
            *QWEN,
            "recipe.eval.interval=10",
            "recipe.eval.datasets=[{name: a, path: /d/a.jsonl}, {name: b, path: /d/b.jsonl,"
            " reward_type: gpqa}]",
            "recipe.eval.custom_reward_function=rlpost_test_hooks.length_reward",
        ),
        "recipe.eval.datasets.1.reward_type",
        CMD,
        "eval.custom_reward_function=rlpost_test_hooks.length_reward scores the set's",
    ),
    Case(
        "eval_set_without_labels_graded_by_trainings_type",
        (
            *QWEN,
            "recipe.eval.interval=10",
            "recipe.eval.datasets=[{name: a, path: /d/a.jsonl, label_key: false}]",
        ),
        "recipe.eval.datasets.0.label_key",
        CMD,
        "label_key=false: rollout.reward.type=deepscaler grades the set's every response "
        "against the line's label, and the set reads no label from its lines",
    ),
    Case(
        "eval_set_without_labels_graded_by_its_own_type",
        (
            *QWEN,
            "recipe.eval.interval=10",
            "recipe.eval.datasets=[{name: a, path: /d/a.jsonl, reward_type: random},"
            " {name: b, path: /d/b.jsonl, label_key: false, reward_type: gpqa}]",
            "recipe.rollout.reward.custom_function=rlpost_test_hooks.length_reward",
        ),
        "recipe.eval.datasets.1.label_key",
        CMD,
        "eval.datasets.1.reward_type=gpqa grades the set's every response",
    ),
    Case(
        "eval_set_graded_by_its_own_type_and_no_label_key_anywhere",
        (
            *QWEN,
            "recipe.data.label_key=null",
            "recipe.rollout.reward.custom_function=rlpost_test_hooks.length_reward",
            "recipe.eval.interval=10",
            "recipe.eval.datasets=[{name: a, path: /d/a.jsonl, reward_type: math}]",
        ),
        "recipe.eval.datasets.0.label_key",
        "default",
        "neither the set's label_key nor data.label_key is set",
    ),
    Case(
        "eval_reward_function_without_sets",
        (
            *QWEN,
            "recipe.eval.interval=null",
            "recipe.eval.datasets=[]",
            "recipe.eval.custom_reward_function=rlpost_test_hooks.length_reward",
        ),
        "recipe.eval.custom_reward_function",
        CMD,
        "it scores the evaluation sets, and none is named",
    ),
    Case(
        "eval_reward_function_of_no_set",
        (
            *QWEN,
            "recipe.eval.interval=10",
            "recipe.eval.datasets=[{name: a, path: /d/a.jsonl,"
            " custom_reward_function: rlpost_test_hooks.length_reward}]",
            "recipe.eval.custom_reward_function=rlpost_test_hooks.quarter_reward",
        ),
        "recipe.eval.custom_reward_function",
        CMD,
        "every one of eval.datasets names its own custom_reward_function",
    ),
    Case(
        "unknown_resolver",
        (*QWEN, "recipe.data.prompt_data=${nope:x}"),
        "recipe.data.prompt_data",
        CMD,
        "Unsupported interpolation type nope",
    ),
]


def find_issue(error: UserError, key: str) -> Issue:
    for issue in error.issues:
        if issue.key == key:
            return issue
    raise AssertionError(f"no issue at {key}; got:\n{error.render()}")


def check_where(issue: Issue, where: str) -> None:
    shown = str(issue.location)
    if where in (CMD, "default"):
        assert shown.startswith(where), shown
    else:
        assert issue.location is not None and issue.location.file is not None, shown
        assert Path(issue.location.file).name == where, shown
        assert issue.location.line, shown


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_config(case: Case, user_conf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HOOK_FIXTURES))
    with pytest.raises(UserError) as caught:
        compose_run_config(list(case.overrides), search_path=[user_conf])
    issue = find_issue(caught.value, case.key)
    assert case.fragment in issue.message, issue.render()
    assert issue.fix, issue.render()
    check_where(issue, case.where)


def test_fully_async_pushes_of_the_evaluation_count_toward_the_staleness_bound() -> None:
    """An evaluation pushes the weights too: with one every 5 rollouts, weights pushed every 6
    rollouts stay within the default bound of 4 (the run never waits past it)."""
    cfg, _ = compose_run_config(
        [
            *QWEN,
            "recipe.loop.mode=fully_async",
            "recipe.loop.update_weights_interval=6",
            "recipe.eval.interval=5",
        ]
    )
    assert cfg.recipe.loop.update_weights_interval == 6


def test_an_evaluation_set_scored_without_a_label_may_read_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """label_key: false (slime's eval config's label_key: null) where the set's scorer reads
    no label: its own or the evaluation's custom function, the random type, training's
    custom function; the lines then need no label field."""
    monkeypatch.syspath_prepend(str(HOOK_FIXTURES))
    unlabelled = "path: /d/a.jsonl, label_key: false"
    for overrides in (
        [f"recipe.eval.datasets=[{{name: a, {unlabelled},"
         " custom_reward_function: rlpost_test_hooks.length_reward}]"],
        [f"recipe.eval.datasets=[{{name: a, {unlabelled}}}]",
         "recipe.eval.custom_reward_function=rlpost_test_hooks.length_reward"],
        [f"recipe.eval.datasets=[{{name: a, {unlabelled}, reward_type: random}}]"],
        [f"recipe.eval.datasets=[{{name: a, {unlabelled}}}]",
         "recipe.rollout.reward.custom_function=rlpost_test_hooks.length_reward"],
    ):  # fmt: skip
        cfg, _ = compose_run_config([*QWEN, "recipe.eval.interval=10", *overrides])
        assert cfg.recipe.eval.datasets[0].label_key is False
        assert cfg.recipe.eval_label_grader(0) is None


def test_reward_functions_of_verl_s_shape_validate_for_training_and_evaluation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """verl's compute_score(data_source, solution_str, ground_truth, extra_info=None), with
    or without extra_info, plain or async, wherever a reward function is named."""
    monkeypatch.syspath_prepend(str(HOOK_FIXTURES))
    run, _ = compose_run_config(
        [
            *QWEN,
            "recipe.rollout.reward.custom_function=rlpost_test_hooks.verl_exact_match",
            "recipe.eval.interval=10",
            "recipe.eval.custom_reward_function=rlpost_test_hooks.verl_scored_dict",
            "recipe.eval.datasets=[{name: a, path: /d/a.jsonl,"
            " custom_reward_function: rlpost_test_hooks.async_verl_score}, "
            "{name: b, path: /d/b.jsonl}]",
        ]
    )
    assert run.recipe.rollout.reward.custom_function == "rlpost_test_hooks.verl_exact_match"
    assert run.recipe.eval.reward_function(0) == (
        "eval.datasets.0.custom_reward_function",
        "rlpost_test_hooks.async_verl_score",
    )


def test_evaluation_prompts_are_bounded_by_their_own_max_prompt_len() -> None:
    """data.max_prompt_len leaves out training prompts only: evaluation sets are bounded by
    eval.max_prompt_len, so a training bound that leaves no room for the evaluation's
    response does not refuse it (its tokenized prompts are checked as the inputs load)."""
    overrides = [*QWEN, "recipe.data.max_prompt_len=1024", "recipe.eval.max_response_len=40000"]
    cfg, _ = compose_run_config(overrides)
    assert cfg.recipe.eval_requests() == [("eval.max_response_len", 40000)]
    with pytest.raises(UserError) as caught:
        compose_run_config([*overrides, "recipe.eval.max_prompt_len=1024"])
    assert "(eval.max_prompt_len 1024 + response)" in caught.value.issues[0].message


@pytest.mark.parametrize("gbs", [300, 100], ids=["more_than_a_rollout", "not_a_divisor"])
def test_the_rollout_batch_size_a_batch_refusal_names_validates(gbs: int) -> None:
    bad = [*GLM9, f"recipe.train.global_batch_size={gbs}"]
    with pytest.raises(UserError) as caught:
        compose_run_config(bad)
    fix = find_issue(caught.value, "recipe.train.global_batch_size").fix or ""
    named = re.search(r"rollout\.batch_size to (\d+) prompts", fix)
    assert named, fix
    compose_run_config([*bad, f"recipe.rollout.batch_size={named[1]}"])


def test_a_custom_reward_function_grades_in_place_of_deepscaler_with_thinking_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The custom function scores every rollout sample (none names an rm_type), so the
    recipe's reward.type=deepscaler never grades a response of the thinking-off template."""
    monkeypatch.syspath_prepend(str(HOOK_FIXTURES))
    run, _ = compose_run_config(
        [
            *GLM9,
            "recipe.data.apply_chat_template_kwargs={enable_thinking: false}",
            "recipe.rollout.reward.custom_function=rlpost_test_hooks.length_reward",
        ]
    )
    assert run.recipe.rollout.reward.type == "deepscaler"


def test_hf_config_mismatch_names_both_files(user_conf: Path) -> None:
    ckpt = user_conf / "ckpt"
    with pytest.raises(UserError) as caught:
        compose_run_config([*QWEN, f"model.hf_checkpoint={ckpt}"])
    issue = find_issue(caught.value, "model.num_query_groups")
    assert "conf/model/qwen3-4b.yaml" in issue.message
    assert str(ckpt / "config.json") in issue.message and "num_key_value_heads=4" in issue.message
    check_where(issue, "qwen3-4b.yaml")
    assert [i.key for i in caught.value.issues] == ["model.num_query_groups"]


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(UserError) as caught:
        compose_run_config(
            [
                *QWEN,
                "recipe.rollout.temperature=0",
                "layout.rollout.sglang.tp_size=2",
                "trainer.backend=jax",
                "recipe.rollout.generate_function=rlpost.nothing.here",
            ]
        )
    keys = {i.key for i in caught.value.issues}
    assert keys == {
        "recipe.rollout.temperature",
        "layout.rollout.sglang.tp_size",
        "trainer.backend",
        "recipe.rollout.generate_function",
    }


def test_every_request_the_context_cannot_hold_is_named_at_once() -> None:
    """A recipe written for a longer context (grpo_dapo's 8k training and 16k evaluation
    responses) on a model with less: both lengths are refused together, each at its key."""
    with pytest.raises(UserError) as caught:
        compose_run_config([*QWEN, "model.max_position_embeddings=4096"])
    keys = [i.key for i in caught.value.issues]
    assert keys == ["recipe.rollout.max_response_len", "recipe.eval.max_response_len"]
    train, evaluation = caught.value.issues
    assert "can reach 8192 tokens" in train.message and train.value == 8192
    assert "can reach 16384 tokens" in evaluation.message and evaluation.value == 16384
    assert str(evaluation.location).endswith("conf/recipe/grpo_dapo.yaml:56")


def test_every_evaluation_set_a_rule_refuses_is_named_at_once() -> None:
    """Sets copied from one another share their mistakes: each set a rule refuses is named,
    not the first alone."""

    def refused(*names: str) -> list[str]:
        sets = ", ".join(
            f"{{name: {name}, path: /d/{name}.jsonl, label_key: false, reward_type: math}}"
            for name in names
        )
        with pytest.raises(UserError) as caught:
            compose_run_config([*QWEN, f"recipe.eval.datasets=[{sets}]"])
        return [i.key for i in caught.value.issues]

    assert refused("a", "b", "a", "a") == [
        "recipe.eval.datasets.2.name",
        "recipe.eval.datasets.3.name",
    ]
    assert refused("a", "b", "c") == [f"recipe.eval.datasets.{i}.label_key" for i in range(3)]


# --- the launcher as a user runs it ----------------------------------------------------------

LAUNCH_CASES = {
    "reward_function_of_neither_shape": (
        (*QWEN, "recipe.rollout.reward.custom_function=rlpost.filters.pop_first", "mode=plan"),
        [
            "recipe.rollout.reward.custom_function = 'rlpost.filters.pop_first'",
            "requires 3 positional parameters (rollout_id, buffer, num_groups); expected "
            "[async] def fn(sample), or verl's [async] def fn(data_source, solution_str, "
            "ground_truth, extra_info=None)",
        ],
    ),
    "unknown_model": (("model=glm4-9", "mode=plan"), ["command line: model=glm4-9", "'glm4-9b'?"]),
    "unknown_key": (("recipe.rollout.temprature=0.8", "mode=plan"), ["'temperature'?"]),
    "temperature_zero": (
        (*QWEN, "recipe.rollout.temperature=0", "mode=plan"),
        ["recipe.rollout.temperature = 0", "command line: recipe.rollout.temperature=0", "> 0"],
    ),
    "sglang_plan_owned": (
        (*QWEN, "layout.rollout.sglang.tp_size=2", "mode=slime_args"),
        ["layout.rollout.gpus_per_engine"],
    ),
    "eval_reward_function_missing": (
        (
            *QWEN,
            "recipe.eval.interval=10",
            "recipe.eval.datasets=[{{name: a, path: /d/a.jsonl,"
            " custom_reward_function: nope.rewards.score}}, {{name: b, path: /d/b.jsonl}}]",
            "recipe.eval.custom_reward_function=rlpost.filters.pop_frst",
            "mode=plan",
        ),
        [
            "recipe.eval.datasets.0.custom_reward_function = 'nope.rewards.score'",
            "module 'nope.rewards' was not found",
            "recipe.eval.custom_reward_function = 'rlpost.filters.pop_frst'",
            "no attribute 'pop_frst'. Did you mean 'rlpost.filters.pop_first'?",
            "fix: define [async] def fn(sample) named 'pop_frst'",
        ],
    ),
    "user_config_dir": (
        ("--config-dir", "{user_conf}", "model=qwen3-4b", "recipe=typo_recipe", "mode=plan"),
        ["{user_conf}/recipe/typo_recipe.yaml:7", "Did you mean 'temperature'?"],
    ),
}


def launch(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, str(REPO / "launch.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("name", list(LAUNCH_CASES))
def test_launcher_exits_2_without_traceback(name: str, user_conf: Path, tmp_path: Path) -> None:
    args, fragments = LAUNCH_CASES[name]
    result = launch([a.format(user_conf=user_conf) for a in args], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "HYDRA_FULL_ERROR" not in result.stderr
    assert result.stderr.startswith("rlpost: ")
    for fragment in fragments:
        assert fragment.format(user_conf=user_conf) in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == []  # no run directory, no .hydra


def test_a_good_plan_exits_0_and_writes_nothing(tmp_path: Path) -> None:
    result = launch([*GLM9, "mode=plan", "plan.format=json"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["placement"]["train_gpus"] == 4
    assert list(tmp_path.iterdir()) == []
