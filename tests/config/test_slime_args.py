"""mode=slime_args reproduces the seeds' slime argument lists, group by group.

The expected lists are the seeds' bash arrays as written in the seed documents (GLM-Z1-9B,
Qwen3-4B, GLM-4.5 355B, GLM-4.7-Flash examples); where a seed elides part of an array with
"...", only the flags it shows are required.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlpost.errors import UserError
from rlpost.plan import build_plan, render_slime_args, slime_arg_groups
from rlpost.schema import RunConfig

ComposeRun = Callable[..., RunConfig]
GroupsFor = Callable[..., dict[str, list[str]]]


@pytest.fixture
def groups_for(compose_run: ComposeRun) -> GroupsFor:
    """`groups_for(model, hardware, *overrides, recipe=...)`: the planned run's slime arrays."""

    def plan_groups(
        model: str, hardware: str, *extra: str, recipe: str = "grpo_dapo"
    ) -> dict[str, list[str]]:
        cfg = compose_run(f"model={model}", f"recipe={recipe}", f"hardware={hardware}", *extra)
        return slime_arg_groups(cfg, build_plan(cfg))

    return plan_groups


ROLLOUT = """--prompt-data /root/dapo-math-17k/dapo-math-17k.jsonl
--input-key prompt --label-key label --apply-chat-template --rollout-shuffle
--rm-type deepscaler --num-rollout 3000
--rollout-batch-size 32 --n-samples-per-prompt 8 --rollout-max-response-len 8192
--rollout-temperature 1 --global-batch-size 256 --balance-data"""
GRPO = """--advantage-estimator grpo --use-kl-loss --kl-loss-coef 0.00 --kl-loss-type low_var_kl
--entropy-coef 0.00 --eps-clip 0.2 --eps-clip-high 0.28"""
OPTIMIZER = """--optimizer adam --lr 1e-6 --lr-decay-style constant --weight-decay 0.1
--adam-beta1 0.9 --adam-beta2 0.98"""
CPU_ADAM = "--optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d --use-precision-aware-optimizer"
EVAL = """--eval-interval 20 --eval-prompt-data aime /root/aime-2024/aime-2024.jsonl
--n-samples-per-eval-prompt 16 --eval-max-response-len 16384 --eval-top-p 1"""
RECOMPUTE = "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"


def perf(tp: int, sp: bool, pp: int, cp: int, ep: int, tokens: int) -> str:
    return (
        f"--tensor-model-parallel-size {tp} {'--sequence-parallel' if sp else ''} "
        f"--pipeline-model-parallel-size {pp} --context-parallel-size {cp} "
        f"--expert-model-parallel-size {ep} --expert-tensor-parallel-size 1 {RECOMPUTE} "
        f"--use-dynamic-batch-size --max-tokens-per-gpu {tokens}"
    )


SEED_ARRAYS: dict[tuple[str, str], dict[str, str]] = {
    ("glm4-9b", "h100x8"): {
        "CLUSTER_ARGS": "--actor-num-nodes 1 --actor-num-gpus-per-node 4 --rollout-num-gpus 4",
        "PERF_ARGS": perf(2, True, 1, 2, 1, 4608),
        "ROLLOUT_ARGS": ROLLOUT,
        "GRPO_ARGS": GRPO,
        "OPTIMIZER_ARGS": OPTIMIZER,
        "EVAL_ARGS": EVAL,
        "SGLANG_ARGS": "--rollout-num-gpus-per-engine 2",
    },
    ("qwen3-4b", "h100x8"): {
        "CLUSTER_ARGS": "--actor-num-nodes 1 --actor-num-gpus-per-node 8 --colocate",
        "PERF_ARGS": perf(2, True, 1, 1, 1, 9216),
        "ROLLOUT_ARGS": ROLLOUT,
        "GRPO_ARGS": GRPO,
        "OPTIMIZER_ARGS": OPTIMIZER,
        "EVAL_ARGS": EVAL,
        "SGLANG_ARGS": "--rollout-num-gpus-per-engine 2 --sglang-mem-fraction-static 0.7",
    },
    ("glm4.5-355b-a32b", "h100x64"): {
        "PERF_ARGS": perf(8, True, 4, 2, 16, 16384),
        "GRPO_ARGS": GRPO,
        "SGLANG_ARGS": "--rollout-num-gpus-per-engine 32 --sglang-mem-fraction-static 0.7 "
        "--sglang-enable-dp-attention --sglang-dp-size 4",
    },
    ("glm4.7-flash", "h100x8"): {
        "CLUSTER_ARGS": "--actor-num-nodes 1 --actor-num-gpus-per-node 8 --colocate",
        "PERF_ARGS": perf(1, False, 1, 1, 8, 8192),
        "ROLLOUT_ARGS": ROLLOUT,
        "GRPO_ARGS": GRPO,
        "OPTIMIZER_ARGS": f"{OPTIMIZER} {CPU_ADAM}",
        "EVAL_ARGS": EVAL,
        "SGLANG_ARGS": "--rollout-num-gpus-per-engine 8 --sglang-mem-fraction-static 0.7 "
        "--sglang-enable-dp-attention --sglang-dp-size 8 --sglang-enable-dp-lm-head "
        "--sglang-moe-dense-tp-size 1 --sglang-cuda-graph-max-bs 16 "
        "--sglang-max-running-requests 64",
        "MISC_ARGS": "--attention-dropout 0.0 --hidden-dropout 0.0 "
        "--accumulate-allreduce-grads-in-fp32 --attention-softmax-in-fp32 "
        "--attention-backend flash --moe-token-dispatcher-type alltoall",
    },
}

# Arrays the seeds elide with "...": the flags shown must all be there.
SEED_SUBSETS: dict[tuple[str, str], dict[str, str]] = {
    ("glm4.5-355b-a32b", "h100x64"): {
        "OPTIMIZER_ARGS": CPU_ADAM,
        "MISC_ARGS": "--moe-enable-deepep --moe-token-dispatcher-type flex",
        "CLUSTER_ARGS": "--actor-num-nodes 8 --actor-num-gpus-per-node 8 --colocate",
    },
}


def same_token(a: str, b: str) -> bool:
    """Equal as text, or as numbers (the seeds write 0.00 and 1e-6)."""
    if a == b:
        return True
    try:
        return float(a) == float(b)
    except ValueError:
        return False


def assert_tokens_equal(actual: list[str], expected: list[str]) -> None:
    same = len(actual) == len(expected) and all(map(same_token, actual, expected))
    assert same, f"\n  got:      {' '.join(actual)}\n  expected: {' '.join(expected)}"


CASES = [(seed, group) for seed, arrays in SEED_ARRAYS.items() for group in arrays]


@pytest.mark.parametrize(("seed", "group"), CASES, ids=[f"{s[0]}-{g}" for s, g in CASES])
def test_group_matches_seed(seed: tuple[str, str], group: str, groups_for: GroupsFor) -> None:
    actual = groups_for(*seed)[group]
    assert_tokens_equal(actual, SEED_ARRAYS[seed][group].split())


SUBSET_CASES = [(seed, group) for seed, arrays in SEED_SUBSETS.items() for group in arrays]


@pytest.mark.parametrize(("seed", "group"), SUBSET_CASES, ids=[g for _, g in SUBSET_CASES])
def test_group_contains_seed_flags(
    seed: tuple[str, str], group: str, groups_for: GroupsFor
) -> None:
    actual = " ".join(groups_for(*seed)[group])
    for flag in re.findall(r"--\S+(?: [^-\s]\S*)?", SEED_SUBSETS[seed][group]):
        assert flag in actual, f"{flag!r} missing from {group}: {actual}"


def test_checkpoint_paths_come_from_the_run_directory(groups_for: GroupsFor) -> None:
    groups = groups_for("glm4-9b", "h100x8", "run.dir=/root/runs/glm")
    expected = (
        "--hf-checkpoint /root/GLM-Z1-9B-0414 --ref-load /root/GLM-Z1-9B-0414_torch_dist "
        "--load /root/runs/glm/slime/ --save /root/runs/glm/slime/ --save-interval 20"
    )
    assert_tokens_equal(groups["CKPT_ARGS"], expected.split())
    # a policy that starts from a torch_dist checkpoint starts there in slime too
    groups = groups_for("glm4-9b", "h100x8", "model.load=/root/glm_sft_torch_dist")
    assert "--load /root/glm_sft_torch_dist --save ./slime/" in " ".join(groups["CKPT_ARGS"])


def test_dynamic_sampling_maps_to_slime_filters(groups_for: GroupsFor) -> None:
    rollout = " ".join(
        groups_for("qwen3-4b", "h100x8", recipe="grpo_dapo_dynamic_sampling")["ROLLOUT_ARGS"]
    )
    assert "--over-sampling-batch-size 64" in rollout
    assert (
        "--dynamic-sampling-filter-path "
        "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std" in rollout
    )
    assert "--partial-rollout" in rollout
    # pop_first is what slime's buffer does unasked (the module once naming it is gone)
    assert "--buffer-filter-path" not in rollout


def test_every_format_of_the_export(compose_run: ComposeRun) -> None:
    """json: the groups' tokens with the pinned slime; script: a launch script that bash
    parses, with the environment Megatron needs for TP/CP on Hopper."""
    import json

    cfg = compose_run("model=glm4-9b", "recipe=grpo_dapo", "hardware=h100x8")
    plan = build_plan(cfg)
    data = json.loads(render_slime_args(cfg, plan, "json"))
    assert data["entry"] == "train.py" and "624b824a" in data["slime"]
    assert data["args"] == slime_arg_groups(cfg, plan)
    script = render_slime_args(cfg, plan, "script")
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in script
    assert '"CUDA_DEVICE_MAX_CONNECTIONS": "1"' in script  # in the job's runtime env too
    assert "-- python3 train.py" in script and "ray start --head" in script
    import subprocess

    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_mla_models_give_megatron_their_kv_channels(groups_for: GroupsFor) -> None:
    """Megatron derives kv_channels as hidden / heads unless told, and 2048 / 20 does not
    divide: GLM-4.7-Flash's export names the V head size."""
    model = groups_for("glm4.7-flash", "h100x8")["MODEL_ARGS"]
    assert model[model.index("--kv-channels") + 1] == "256"


def test_decoupled_alternative_of_the_qwen_seed(groups_for: GroupsFor) -> None:
    # Qwen3-4B seed, "Decoupled Training and Inference": 2 train GPUs + 6 rollout GPUs
    groups = groups_for(
        "qwen3-4b",
        "h100x8",
        "layout.colocate=false",
        "layout.train.num_gpus=2",
        "++layout.rollout.num_gpus=6",
    )
    assert_tokens_equal(
        groups["CLUSTER_ARGS"],
        ["--actor-num-nodes", "1", "--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "6"],
    )


def test_model_args_describe_the_architecture(groups_for: GroupsFor) -> None:
    model = " ".join(groups_for("glm4.5-355b-a32b", "h100x64")["MODEL_ARGS"])
    for flag in (
        "--num-layers 92",
        "--hidden-size 5120",
        "--num-attention-heads 96",
        "--num-query-groups 8",
        "--num-experts 160",
        "--moe-router-topk 8",
        "--moe-layer-freq [0]*3+[1]*89",
        "--rotary-percent 0.5",
        "--untie-embeddings-and-output-weights",
    ):
        assert flag in model, flag


def test_rendered_script_splits_back_into_the_groups(compose_run: ComposeRun) -> None:
    cfg = compose_run("model=glm4.7-flash", "recipe=grpo_dapo", "hardware=h100x8")
    plan = build_plan(cfg)
    text = render_slime_args(cfg, plan)
    arrays = dict(re.findall(r"^(\w+_ARGS)=\(\n(.*?)\n\)", text, flags=re.M | re.S))
    parsed = {name: shlex.split(body) for name, body in arrays.items()}
    assert parsed == slime_arg_groups(cfg, plan)
    assert "python3 train.py" in text


def test_async_recipe_uses_the_async_entry_point(compose_run: ComposeRun) -> None:
    cfg = compose_run("model=glm4-9b", "recipe=grpo_dapo_async", "hardware=h100x8")
    assert "python3 train_async.py" in render_slime_args(cfg, build_plan(cfg))


def test_mtp_training_flags_follow_the_seed(groups_for: GroupsFor) -> None:
    # GLM-4.7-Flash seed, "MTP Training": MODEL_ARGS+=(--mtp-num-layers 1), then SPEC_ARGS
    groups = groups_for("glm4.7-flash", "h100x8", "recipe.train.mtp_training=true")
    assert groups["MODEL_ARGS"][-2:] == ["--mtp-num-layers", "1"]
    assert_tokens_equal(
        groups["SPEC_ARGS"], ["--enable-mtp-training", "--mtp-loss-scaling-factor", "0.2"]
    )
    plain = groups_for("glm4.7-flash", "h100x8")
    assert "SPEC_ARGS" not in plain and "--mtp-num-layers" not in plain["MODEL_ARGS"]


def test_the_async_layout_runs_seed_001s_alternative(compose_run: ComposeRun) -> None:
    """Seed 001: 2 GPUs train, 6 generate, and train_async.py overlaps the two."""
    cfg = compose_run(
        "model=qwen3-4b", "recipe=grpo_dapo_async", "hardware=h100x8",
        "layout=qwen3-4b_h100x8_async",
    )  # fmt: skip
    groups = slime_arg_groups(cfg, build_plan(cfg))
    assert groups["CLUSTER_ARGS"] == [
        "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "6"
    ]  # fmt: skip
    assert "python3 train_async.py" in render_slime_args(cfg, build_plan(cfg))


def test_the_colocated_layout_refuses_async_naming_the_one_that_runs(
    compose_run: ComposeRun,
) -> None:
    for recipe in ("grpo_dapo_async", "grpo_dapo_fully_async"):
        with pytest.raises(UserError) as refused:
            build_plan(compose_run("model=qwen3-4b", f"recipe={recipe}", "hardware=h100x8"))
        assert "layout=qwen3-4b_h100x8_async" in refused.value.render()


def test_fully_async_is_refused_by_the_export_with_the_reason(compose_run: ComposeRun) -> None:
    cfg = compose_run(
        "model=qwen3-4b", "recipe=grpo_dapo_fully_async", "hardware=h100x8",
        "layout=qwen3-4b_h100x8_async",
    )  # fmt: skip
    plan = build_plan(cfg)  # it plans and runs in rlpost
    with pytest.raises(UserError) as refused:
        render_slime_args(cfg, plan)
    keys = {issue.key for issue in refused.value.issues}
    assert keys == {"recipe.loop.mode", "recipe.algo.off_policy_correction"}


def test_extension_points_slime_calls_otherwise_are_refused_by_the_export(
    compose_run: ComposeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "hooks_fixtures"))
    cfg = compose_run(
        "model=qwen3-tiny", "recipe=grpo_tiny_calculator", "hardware=cpu",
        "recipe.rollout.reward.type=model",
        "recipe.rollout.reward.model=rlpost_test_hooks.BoxedAnswerModel",
        "recipe.data.source=rlpost_test_hooks.FeedbackSource",
    )  # fmt: skip
    with pytest.raises(UserError) as refused:
        render_slime_args(cfg, build_plan(cfg))
    keys = {issue.key for issue in refused.value.issues}
    assert keys == {
        "recipe.rollout.generate_function",
        "recipe.rollout.reward.model",
        "recipe.data.source",
    }


def test_tool_keys_are_exported_where_they_differ_from_slimes(groups_for: GroupsFor) -> None:
    """slime reads a row's "tools" field unless told another (--tool-key, --eval-tool-key)."""
    default = groups_for("qwen3-4b", "h100x8")
    assert "--tool-key" not in default["ROLLOUT_ARGS"]
    assert "--eval-tool-key" not in default["EVAL_ARGS"]
    aime = "{name: aime, path: /root/aime-2024/aime-2024.jsonl, tool_key: functions}"
    groups = groups_for(
        "qwen3-4b", "h100x8", "recipe.data.tool_key=fns", f"recipe.eval.datasets=[{aime}]"
    )
    assert "--tool-key fns" in " ".join(groups["ROLLOUT_ARGS"])
    assert "--eval-tool-key functions" in " ".join(groups["EVAL_ARGS"])


def test_eval_key_flags_are_exported_only_where_they_change_slimes_keys(
    groups_for: GroupsFor,
) -> None:
    """slime takes an unset --eval-input-key, --eval-label-key, --eval-tool-key from
    --input-key, --label-key, --tool-key (its eval_config.py, pick_from_args): sets that read
    training's fields, or slime's default "tools", get no flag, and an --eval-config file names
    each set's own keys, so beside one the flags change nothing either."""
    same = (
        "recipe.eval.datasets=[{name: aime, path: /root/aime-2024/aime-2024.jsonl, "
        "input_key: prompt, label_key: label, tool_key: tools}]"
    )
    args = " ".join(groups_for("qwen3-4b", "h100x8", same)["EVAL_ARGS"])
    assert "-key" not in args
    sets = (
        "{name: a, path: /a.jsonl, input_key: q, reward_type: math}, "
        "{name: b, path: /b.jsonl, input_key: q}"
    )
    in_file = groups_for("qwen3-4b", "h100x8", f"recipe.eval.datasets=[{sets}]")["EVAL_ARGS"]
    assert "--eval-config" in in_file and "--eval-input-key" not in in_file
    flags = groups_for("qwen3-4b", "h100x8", "recipe.eval.datasets=[{name: a, path: /a.jsonl, "
                       "input_key: question, label_key: answer}]")  # fmt: skip
    assert "--eval-input-key question --eval-label-key answer" in " ".join(flags["EVAL_ARGS"])


def test_tis_clips_are_exported_only_where_they_differ_from_slimes(groups_for: GroupsFor) -> None:
    """slime's --tis-clip and --tis-clip-low default to 2.0 and 0, rlpost's tis_clip_high and
    tis_clip_low too: an export with them writes --use-tis alone, as slime's kimi-k2 script."""
    tis = "recipe.algo.off_policy_correction=tis"
    default = " ".join(groups_for("qwen3-4b", "h100x8", tis)["GRPO_ARGS"])
    assert "--use-tis" in default and "--tis-clip" not in default
    own = groups_for("qwen3-4b", "h100x8", tis, "recipe.algo.tis_clip_low=0.5")["GRPO_ARGS"]
    assert "--tis-clip-low 0.5" in " ".join(own) and "--tis-clip" not in own


def test_reading_no_tools_is_refused_by_the_export(compose_run: ComposeRun) -> None:
    cfg = compose_run(
        "model=qwen3-4b", "recipe=grpo_dapo", "hardware=h100x8", "recipe.data.tool_key=null"
    )
    with pytest.raises(UserError) as refused:
        render_slime_args(cfg, build_plan(cfg))
    (issue,) = refused.value.issues
    assert (issue.key, issue.value) == ("recipe.data.tool_key", None)
    assert "whenever the row has one" in issue.message
    assert issue.fix == "rename the column in the data, or export with recipe.data.tool_key: tools"


def test_prompts_written_as_json_text_are_refused_by_the_export(
    compose_run: ComposeRun, tmp_path: Path
) -> None:
    """rlpost decodes a prompt string that holds a JSON message list; slime would template
    the string as the user's text. Message lists stored as lists, and strings that hold
    other JSON, export as they are."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}]
    rows = [
        {"prompt": "What is 2+2?", "label": "4"},
        {"prompt": messages, "label": "2"},
        {"prompt": "[1, 2, 3] summed?", "label": "6"},
        {"prompt": "[1, 2, 3]", "label": "6"},
    ]
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps(row) + "\n" for row in rows))
    as_text = tmp_path / "as_text.jsonl"
    plain_row = {"question": "What is 2+2?", "label": "4"}
    text_row = {"question": json.dumps(messages), "label": "2"}
    as_text.write_text("".join(json.dumps(row) + "\n" for row in [plain_row, text_row]))
    as_column = tmp_path / "as_column.parquet"  # pandas' to_parquet of json.dumps'd messages
    pq.write_table(pa.Table.from_pylist([plain_row, plain_row, text_row]), as_column)
    base = ("model=qwen3-4b", "recipe=grpo_dapo", "hardware=h100x8")
    aime = f"{{name: aime, path: {as_column}, input_key: question}}"
    cfg = compose_run(*base, f"recipe.data.prompt_data={plain}")
    assert "--prompt-data" in render_slime_args(cfg, build_plan(cfg))

    cfg = compose_run(
        *base,
        f"recipe.data.prompt_data={as_text}",
        "recipe.data.input_key=question",
        f"recipe.eval.datasets=[{aime}]",
    )
    with pytest.raises(UserError) as refused:
        render_slime_args(cfg, build_plan(cfg))
    training, aime_set = refused.value.issues
    assert (training.key, training.value) == ("recipe.data.prompt_data", str(as_text))
    assert (aime_set.key, aime_set.value) == ("recipe.eval.datasets.0.path", str(as_column))
    assert aime_set.message.startswith("row 3's 'question' (and maybe more) is a string")
    assert training.message.startswith(
        "line 2's 'question' (and maybe more) is a string holding a JSON message list"
    )
    assert "slime would apply the chat template to the string" in training.message
    assert training.fix == (
        "store the prompts as message lists (JSON arrays, not strings), then export"
    )
    # a file this machine does not have is the launch's to check
    cfg = compose_run(*base, f"recipe.data.prompt_data={tmp_path / 'elsewhere.jsonl'}")
    assert "--prompt-data" in render_slime_args(cfg, build_plan(cfg))


def test_cpu_adam_without_the_precision_aware_optimizer_is_refused_by_the_export(
    compose_run: ComposeRun,
) -> None:
    """rlpost's trainer runs the pair; Megatron-LM's validate_args stops slime on it."""
    cfg = compose_run(
        "model=glm4.7-flash", "recipe=grpo_dapo", "hardware=h100x8",
        "recipe.optim.precision_aware_optimizer=false",
    )  # fmt: skip
    plan = build_plan(cfg)
    assert cfg.recipe.optim.cpu_offload  # the shipped layout's CPU Adam
    with pytest.raises(UserError) as refused:
        render_slime_args(cfg, plan)
    [issue] = refused.value.issues
    assert issue.key == "recipe.optim.precision_aware_optimizer"
    assert "arguments.py:1190" in issue.message and "precision_aware_optimizer: true" in issue.fix


def test_remote_rewards_and_concurrency_are_spelled_as_slime_reads_them(
    groups_for: GroupsFor,
) -> None:
    groups = groups_for(
        "qwen3-4b", "h100x8",
        "recipe.rollout.reward.type=remote",
        "recipe.rollout.reward.remote_url=http://rm:8000/score",
        "recipe.rollout.max_concurrency=1000",
    )  # fmt: skip
    rollout, sglang = " ".join(groups["ROLLOUT_ARGS"]), " ".join(groups["SGLANG_ARGS"])
    assert "--rm-type remote_rm --rm-url http://rm:8000/score" in rollout
    # slime allows --sglang-server-concurrency requests per engine: 1000 over 4 engines
    assert "--sglang-server-concurrency 250" in sglang
