"""`rlpost import slime`: slime launch scripts become configs that plan to the same values, and
export -> import -> export gives back the same arguments for every shipped combination."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from rlpost.config.loader import compose_run_config
from rlpost.errors import UserError
from rlpost.interop.slime_flags import split_flags
from rlpost.interop.slime_import import Imported, import_slime
from rlpost.interop.slime_model import SLIME_MODEL_SCRIPTS
from rlpost.plan import build_plan, plan_config, render_slime_args, slime_arg_groups
from rlpost.plan.slime_args import (
    SGLANG_VERSION,
    SLIME_COMMIT,
    SLIME_SGLANG_NAMES,
    SLIME_SGLANG_TABLE,
    check_exportable,
    slime_sglang_flag,
    slime_sglang_flags,
)
from rlpost.schema import RunConfig

CONF = Path(__file__).resolve().parents[2] / "conf"
SLIME_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slime"
SLIME_NAMES = {ours: slime for slime, ours in SLIME_MODEL_SCRIPTS.items()}
OWN_FN, WIDE_FN = "rlpost_test_hooks.length_reward", "rlpost_test_hooks.quarter_reward"
SEEDS = [
    ("glm4-9b", "h100x8"),
    ("qwen3-4b", "h100x8"),
    ("glm4.5-355b-a32b", "h100x64"),
    ("glm4.7-flash", "h100x8"),
]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def imported_config(script: Path, out: Path) -> tuple[RunConfig, object]:
    imported = import_slime(script)
    imported.write(out)
    cfg, _ = compose_run_config(
        [*imported.overrides(), *imported.extra_overrides()], config_dir=out
    )
    return plan_config(cfg)


def seed_shaped(export: str, model: str) -> str:
    """An export rewritten the way slime's run scripts are: the model's flags sourced from
    scripts/models/, the command behind `ray job submit` with continuations."""
    model_array = re.compile(r"^MODEL_ARGS=\(\n(?:   .*\n)*?\)\n", re.M)
    source = 'SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"\n'
    source += f'source "${{SCRIPT_DIR}}/models/{SLIME_NAMES[model]}.sh"\n'
    text = model_array.sub(lambda m: source, export, count=1)
    return text.replace(
        "\npython3 ",
        '\nray job submit --address="http://127.0.0.1:8265" \\\n'
        '   --runtime-env-json="${RUNTIME_ENV_JSON}" \\\n   -- python3 ',
    )


@pytest.mark.parametrize(("model", "hardware"), SEEDS)
def test_the_seed_scripts_import_to_the_shipped_plans(
    model: str, hardware: str, tmp_path: Path
) -> None:
    shipped, _ = compose_run_config([f"model={model}", "recipe=grpo_dapo", f"hardware={hardware}"])
    plan = build_plan(shipped)
    script = tmp_path / f"run-{SLIME_NAMES[model]}.sh"
    script.write_text(seed_shaped(render_slime_args(shipped, plan), model))
    cfg, imported_plan = imported_config(script, tmp_path / "out")
    assert cfg.model.name == model and cfg.hardware.name == hardware
    ours, theirs = imported_plan.to_dict(), plan.to_dict()  # type: ignore[attr-defined]
    for section in ("placement", "parallel", "engine", "batch", "memory", "runtime", "work"):
        assert ours[section] == theirs[section], section
    assert cfg.recipe.model_dump(exclude={"name", "description"}) == shipped.recipe.model_dump(
        exclude={"name", "description"}
    )


def exportable(composed: Any) -> RunConfig | None:
    try:
        if isinstance(composed, UserError):
            return None
        cfg = composed[0]
        check_exportable(cfg)
        slime_arg_groups(cfg, build_plan(cfg))  # plans, and slime can place it
    except UserError:
        return None
    return cfg


COMBINATIONS = list(
    itertools.product(options("model"), options("recipe"), [h for h in options("hardware")])
)


def assembled(imported: Imported, base: RunConfig) -> RunConfig:
    """What composing the written files gives, assembled without Hydra (plain YAML, no
    defaults lists: the seed tests above compose them through Hydra)."""
    data = base.model_dump()
    data["recipe"] = {"name": imported.name, **imported.section("recipe")}
    data["layout"] = {"name": imported.name, **imported.section("layout")}
    if imported.model_file is not None:
        data["model"] = imported.model_file
    if imported.hardware_file is not None:
        data["hardware"] = imported.hardware_file
    for key, value in imported.values.items():
        if key.startswith(("run.", "tracking.")):
            node = data
            *parents, last = key.split(".")
            for part in parents:
                node = node[part]
            node[last] = value
    return RunConfig.model_validate(data)


def test_export_import_export_is_identical_for_every_shipped_combination(
    tmp_path: Path, combination: Callable[[str, str, str], Any]
) -> None:
    checked = 0
    for i, (model, recipe, hardware) in enumerate(COMBINATIONS):
        cfg = exportable(combination(model, recipe, hardware))
        if cfg is None:
            continue
        plan = build_plan(cfg)
        first = slime_arg_groups(cfg, plan)
        script = tmp_path / f"run-{i}.sh"
        script.write_text(render_slime_args(cfg, plan))
        again_cfg = assembled(import_slime(script), cfg)
        again = slime_arg_groups(again_cfg, build_plan(again_cfg))
        assert again == first, f"{model} x {recipe} x {hardware}"
        checked += 1
    assert checked >= 40


def test_script_shapes_variables_arrays_and_what_is_not_imported(tmp_path: Path) -> None:
    script = tmp_path / "run-custom.sh"
    script.write_text(
        """#!/bin/bash
# a hand-written slime script
set -ex
export CUDA_DEVICE_MAX_CONNECTIONS=1
SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
source "${SCRIPT_DIR}/models/qwen3-4B.sh"
DATA=/data/math.jsonl
LR=2e-6
ROLLOUT_ARGS=(
   --prompt-data ${DATA}     # the prompts
   --input-key prompt --label-key label
   --rm-type math
   --num-rollout 10 --rollout-batch-size 8 --n-samples-per-prompt 4
   --rollout-max-response-len 1024
   --global-batch-size 32
)
ROLLOUT_ARGS+=( --rollout-temperature 0.8 )
OPT=(--lr $LR --lr 3e-6 --weight-decay 0.0 --made-up-flag 3 --use-fault-tolerance)
ray job submit --address="http://127.0.0.1:8265" \\
   -- python3 train_async.py \\
   --actor-num-nodes 1 --actor-num-gpus-per-node 4 --rollout-num-gpus 4 \\
   ${MODEL_ARGS[@]} --hf-checkpoint /models/Qwen3-4B \\
   ${ROLLOUT_ARGS[@]} "${OPT[@]}" \\
   --tensor-model-parallel-size 2 --sequence-parallel \\
   --use-dynamic-batch-size --max-tokens-per-gpu 4096 --rollout-num-gpus-per-engine 2 \
   --sglang-cuda-graph-max-bs 16 --sglang-mem-fraction-static 0.8 --sglang-made-up 1 \
   --sglang-router-ip 10.0.0.1
"""
    )
    imported = import_slime(script)
    values = imported.values
    assert values["recipe.data.prompt_data"] == "/data/math.jsonl"
    assert values["recipe.rollout.temperature"] == 0.8
    assert values["recipe.optim.lr"] == 3e-6  # the later value counts, as in argparse
    assert values["recipe.loop.mode"] == "async"
    assert (values["layout.train.num_gpus"], values["layout.rollout.num_gpus"]) == (4, 4)
    assert imported.model == "qwen3-4b-run_custom"  # qwen3-4b with the script's checkpoint
    assert imported.model_file is not None
    assert imported.model_file["hf_checkpoint"] == "/models/Qwen3-4B"
    unmapped = {u.flag: u for u in imported.unmapped}
    assert unmapped["--lr"].reason.startswith("given twice")
    assert "not a slime or Megatron flag" in unmapped["--made-up-flag"].reason
    assert values["engine.fault_tolerance"] is True
    assert "has no such flag: slime drops it" in unmapped["--sglang-made-up"].reason
    assert "router itself" in unmapped["--sglang-router-ip"].reason  # slime's own flag
    # the old spelling slime's scripts use is an alias in slime's SGLang: the same option
    assert values["layout.rollout.sglang"] == {
        "cuda_graph_max_bs_decode": 16,
        "mem_fraction_static": 0.8,
    }
    assert "ray job submit" not in " ".join(imported.skipped)  # the train command is read
    cfg, plan = imported_config(script, tmp_path / "out")
    assert not plan.placement.colocate and plan.parallel.tp == 2  # type: ignore[attr-defined]
    assert cfg.recipe.loop.mode == "async"


SLIME_FLAGS = Path(__file__).resolve().parents[1] / "fixtures" / "slime_flags.txt"


def slime_flags() -> list[str]:
    """Every flag slime's argparse defines at the pinned commit (argparse's --no- spellings of
    its BooleanOptionalAction flags too)."""
    flags = []
    for line in SLIME_FLAGS.read_text().splitlines():
        if line.startswith("--"):
            name = line.split()[0]
            flags.append(name)
            if "BooleanOptionalAction" in line:
                flags.append("--no-" + name.removeprefix("--"))
    return flags


def test_every_flag_slime_defines_is_imported_or_says_why_not() -> None:
    """No slime flag meets the import's last resort ('not a slime or Megatron flag rlpost
    reads'): each sets a key, is read with others, is held at rlpost's value, belongs to the
    model or the cluster, or is listed with the reason and the nearest key."""
    from rlpost.interop.slime_flags import (
        CLUSTER_FLAGS,
        FIXED_SETTINGS,
        NOT_IMPORTED,
        READ_TOGETHER,
        RULES,
        TOGETHER_FLAGS,
    )
    from rlpost.interop.slime_model import model_flag_names

    handled = {*RULES, *TOGETHER_FLAGS, *CLUSTER_FLAGS, *FIXED_SETTINGS, *NOT_IMPORTED}
    handled |= model_flag_names() | set(slime_sglang_flags())
    assert sorted(set(slime_flags()) - handled) == []
    # and the README's table lists each flag read with others
    assert {f for f in TOGETHER_FLAGS | CLUSTER_FLAGS if not f.startswith("--no-")} <= set(
        READ_TOGETHER
    )


def test_the_flags_not_imported_are_slimes() -> None:
    """A reason given for a flag slime does not have would never be shown."""
    from rlpost.interop.slime_flags import NOT_IMPORTED

    seed_overview = {"--async-buffer-size"}  # train_async.py's, in the seeds' overview
    known = set(slime_flags()) | set(slime_sglang_flags()) | seed_overview
    assert sorted(set(NOT_IMPORTED) - known) == []


def write_script(tmp_path: Path, flags: str, cluster: str = "--colocate") -> Path:
    script = tmp_path / "run.sh"
    script.write_text(
        "source scripts/models/qwen3-4B.sh\n"
        "python3 train.py ${MODEL_ARGS[@]} --actor-num-nodes 1 --actor-num-gpus-per-node 8 "
        f"{cluster} --hf-checkpoint /models/Qwen3-4B --prompt-data /data/math.jsonl "
        "--label-key label "
        "--num-rollout 10 --rollout-batch-size 8 --n-samples-per-prompt 8 "
        "--global-batch-size 64 "
        f"--rollout-max-response-len 1024 {MEGATRON_AS_RLPOST} {flags}\n"
    )
    return script


MEGATRON_AS_RLPOST = (
    "--attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32 "
    "--attention-softmax-in-fp32 --attention-backend flash"
)
"""What slime's scripts always pass to Megatron-LM, and rlpost always runs."""


def test_a_fixed_setting_the_script_leaves_to_megatron_is_listed(tmp_path: Path) -> None:
    """Without --attention-dropout 0.0 (or --attention-backend flash, ...) slime runs
    Megatron-LM's default (dropout 0.1, the auto backend), where rlpost always runs its fixed
    value: the import lists each one the script leaves out, as slime's moonlight script leaves
    out --attention-backend flash."""
    script = write_script(tmp_path, "")
    script.write_text(script.read_text().replace("--attention-dropout 0.0 ", ""))
    imported = import_slime(script)
    (dropout,) = imported.unmapped
    assert (dropout.flag, dropout.values, dropout.nearest) == ("--attention-dropout", (), "(fixed)")
    assert "slime runs with Megatron-LM's dropout of 0.1" in dropout.reason
    assert "rlpost always runs with --attention-dropout 0.0" in dropout.reason
    moonlight = import_slime(
        SLIME_FIXTURES / "scripts" / "run-moonlight-16B-A3B.sh", SLIME_FIXTURES,
        env={"BASE_DIR": "/root"},
    )  # fmt: skip
    assert "--attention-backend" in {u.flag for u in moonlight.unmapped}


def test_engine_and_trainer_flags_import_to_their_keys(tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "--use-fault-tolerance --rollout-health-check-interval 10 "
        "--update-weight-transport disk --update-weight-disk-dir /shared/w "
        "--distributed-timeout-minutes 30 --train-backend megatron --deterministic-mode "
        "--save-interval 5 --save-hf /hf/{rollout_id} "
        "--rollout-max-context-len 4096 --offload --recompute-loss-function",
    )
    imported = import_slime(script)
    values = imported.values
    assert values["engine.fault_tolerance"] is True
    assert values["engine.health_check_interval_s"] == 10.0
    assert values["engine.health_check_first_wait_s"] == 0.0  # slime's default, not rlpost's
    assert "engine.health_check_timeout_s" not in values  # 30 s in both
    assert values["engine.weight_sync"] == "disk"
    assert values["trainer.collective_timeout_s"] == 1800.0
    assert values["trainer.backend"] == "megatron"
    assert values["run.deterministic"] is True
    assert values["recipe.save.save_hf_interval"] == 5
    assert values["recipe.data.max_prompt_len"] == 4095  # slime: context - 1
    assert "engine.offload" not in values  # colocated runs offload both, in slime and rlpost
    unmapped = {u.flag: u for u in imported.unmapped}
    assert set(unmapped) == {"--update-weight-disk-dir"}
    assert unmapped["--update-weight-disk-dir"].nearest == "run.dir"
    cfg, plan = imported_config(script, tmp_path / "out")
    assert cfg.engine.fault_tolerance and cfg.engine.health_check_first_wait_s == 0.0
    assert plan.runtime.weight_sync == "disk"  # type: ignore[attr-defined]
    assert cfg.run.deterministic and cfg.recipe.save.save_hf_interval == 5


@pytest.mark.parametrize(
    ("cluster", "flags", "nearest"),
    [
        ("--colocate", "--no-offload-train", "engine.offload"),
        ("--colocate", "--offload-train --no-offload-rollout", "engine.offload"),
        ("--rollout-num-gpus 8", "--offload", "layout.colocate"),
        ("--rollout-num-gpus 8", "--offload-rollout", "layout.colocate"),
    ],
)
def test_offload_other_than_rlpost_does_is_not_imported(
    cluster: str, flags: str, nearest: str, tmp_path: Path
) -> None:
    """rlpost offloads a colocated GPU run's trainer and engines, always, and a decoupled
    run's never."""
    imported = import_slime(write_script(tmp_path, flags, cluster))
    assert "engine.offload" not in imported.values
    given = {flag for flag, _ in split_flags(flags.split())}
    assert {u.flag: u.nearest for u in imported.unmapped} == dict.fromkeys(given, nearest)


def test_settings_slime_ignores_are_not_imported(tmp_path: Path) -> None:
    """Health checks without fault tolerance, and --save-hf without --save-interval, do
    nothing in slime."""
    script = write_script(tmp_path, "--rollout-health-check-timeout 5 --save-hf /hf")
    imported = import_slime(script)
    assert not any(key.startswith("engine.") for key in imported.values)
    reasons = {u.flag: u.reason for u in imported.unmapped}
    assert "only with --use-fault-tolerance" in reasons["--rollout-health-check-timeout"]
    assert "--save-interval is unset" in reasons["--save-hf"]


def test_runtime_settings_export_and_import_back(tmp_path: Path) -> None:
    base = ["model=qwen3-4b", "recipe=grpo_dapo", "hardware=h100x8", "run.dir=/runs/a"]
    cfg, _ = compose_run_config(
        [*base, "engine.fault_tolerance=true", "engine.health_check_timeout_s=45",
         "engine.weight_bucket_mb=1024", "trainer.collective_timeout_s=1200",
         "run.deterministic=true", "recipe.save.save_hf_interval=20"]
    )  # fmt: skip
    plan = build_plan(cfg)
    groups = slime_arg_groups(cfg, plan)
    assert groups["RUNTIME_ARGS"] == [
        "--use-fault-tolerance", "--rollout-health-check-timeout", "45",
        "--rollout-health-check-first-wait", "300", "--update-weight-buffer-size", "1073741824",
        "--distributed-timeout-minutes", "20",
    ]  # fmt: skip
    assert "--deterministic-mode" in groups["MISC_ARGS"]
    assert groups["CKPT_ARGS"][-2:] == ["--save-hf", "/runs/a/slime/hf/rollout_{rollout_id}"]
    script = tmp_path / "run-qwen3-4B.sh"
    script.write_text(seed_shaped(render_slime_args(cfg, plan), "qwen3-4b"))
    again, again_plan = imported_config(script, tmp_path / "out")
    assert slime_arg_groups(again, again_plan) == groups  # type: ignore[arg-type]
    assert again.engine == cfg.engine and again.trainer == cfg.trainer  # type: ignore[attr-defined]
    assert again.run.deterministic and again.recipe.save.save_hf_interval == 20  # type: ignore[attr-defined]

    disk, _ = compose_run_config([*base, "engine.weight_sync=disk"])
    assert slime_arg_groups(disk, build_plan(disk))["RUNTIME_ARGS"] == [
        "--update-weight-transport", "disk", "--update-weight-disk-dir", "/runs/a/slime/weights/"
    ]  # fmt: skip


def test_the_evaluation_prompt_bound_exports_and_imports_back(tmp_path: Path) -> None:
    """slime's --eval-max-prompt-len leaves long prompts out of every evaluation set, as
    recipe.eval.max_prompt_len does."""
    base = ["model=qwen3-4b", "recipe=grpo_dapo", "hardware=h100x8", "run.dir=/runs/a"]
    cfg, _ = compose_run_config([*base, "recipe.eval.max_prompt_len=1536"])
    plan = build_plan(cfg)
    flags = slime_arg_groups(cfg, plan)["EVAL_ARGS"]
    assert flags[flags.index("--eval-max-prompt-len") + 1] == "1536"
    script = tmp_path / "run-qwen3-4B.sh"
    script.write_text(seed_shaped(render_slime_args(cfg, plan), "qwen3-4b"))
    again, _ = imported_config(script, tmp_path / "out")
    assert again.recipe.eval.max_prompt_len == 1536  # type: ignore[attr-defined]


def test_slimes_boxed_reward_types_export_and_import_back(tmp_path: Path) -> None:
    """--rm-type boxed_f1 is rlpost's type of that name (the last boxed answer graded by F1),
    and an evaluation set's boxed_gpqa goes out as its eval config's rm_type."""
    from rlpost.plan.slime_args import eval_config_file

    base = ["model=qwen3-4b", "recipe=grpo_dapo", "hardware=h100x8", "run.dir=/runs/a"]
    cfg, _ = compose_run_config([*base, "recipe.rollout.reward.type=boxed_f1"])
    plan = build_plan(cfg)
    flags = slime_arg_groups(cfg, plan)["ROLLOUT_ARGS"]
    assert flags[flags.index("--rm-type") + 1] == "boxed_f1"
    script = tmp_path / "run-qwen3-4B.sh"
    script.write_text(seed_shaped(render_slime_args(cfg, plan), "qwen3-4b"))
    again, _ = imported_config(script, tmp_path / "out")
    assert again.recipe.rollout.reward.type == "boxed_f1"  # type: ignore[attr-defined]
    graded, _ = compose_run_config(
        [
            *base,
            "recipe.eval.interval=10",
            "recipe.eval.datasets=[{name: gpqa, path: /d/gpqa.jsonl, reward_type: boxed_gpqa}]",
        ]
    )
    config = eval_config_file(graded)
    assert config is not None and "rm_type: boxed_gpqa" in config[1]


def test_slimes_random_reward_type_imports_and_exports_back(tmp_path: Path) -> None:
    """--rm-type random (a coin flip per sample) is rlpost's type of that name."""
    script = write_script(tmp_path, "--rm-type random")
    cfg, plan = imported_config(script, tmp_path / "out")
    assert cfg.recipe.rollout.reward.type == "random"  # type: ignore[attr-defined]
    flags = slime_arg_groups(cfg, plan)["ROLLOUT_ARGS"]  # type: ignore[arg-type]
    assert flags[flags.index("--rm-type") + 1] == "random"


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("recipe.save.save_hf_interval=10", "recipe.save.save_hf_interval"),
        ("trainer.backend=torch", "trainer.backend"),
        ("recipe.eval.interval=null", "recipe.eval.interval"),
        ("recipe.data.label_key=reward_model.ground_truth", "recipe.data.label_key"),
        ("recipe.eval.datasets.0.input_key=extra.question", "recipe.data.label_key"),
    ],
)
def test_what_slime_cannot_run_is_not_exported(override: str, key: str) -> None:
    cfg, _ = compose_run_config(["model=qwen3-4b", "recipe=grpo_dapo", "hardware=h100x8", override])
    with pytest.raises(UserError) as refused:
        check_exportable(cfg)
    assert [issue.key for issue in refused.value.issues] == [key]


def test_an_eval_sets_reward_type_beside_a_custom_function_is_not_exported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """rlpost grades such a set by its reward_type; slime's --custom-rm-path would score it."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "hooks_fixtures"))
    base = ["model=qwen3-4b", "recipe=grpo_dapo", "hardware=h100x8", "recipe.eval.interval=10"]
    custom = "recipe.rollout.reward.custom_function=rlpost_test_hooks.length_reward"
    graded = "recipe.eval.datasets=[{name: a, path: /d/a.jsonl, reward_type: math}]"
    cfg, _ = compose_run_config([*base, custom, graded])
    with pytest.raises(UserError) as refused:
        check_exportable(cfg)
    (issue,) = refused.value.issues
    assert issue.key == "recipe.rollout.reward.custom_function"
    assert "before any rm_type" in issue.message
    as_training, _ = compose_run_config([*base, custom, graded.replace(", reward_type: math", "")])
    check_exportable(as_training)


def test_model_flags_that_differ_draw_a_model(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text(
        "source scripts/models/glm4-9B.sh\nMODEL_ARGS+=( --rotary-base 500000 )\n"
        "python3 train.py ${MODEL_ARGS[@]} --colocate --rollout-batch-size 8 "
        "--global-batch-size 8\n"
    )
    imported = import_slime(script)
    assert imported.model == "glm4-9b-run"  # drawn on glm4-9b, with the script's value
    assert imported.model_file is not None and imported.model_file["rotary_base"] == 500000


def test_model_flags_written_out_draw_a_model_named_by_its_checkpoint_folder(
    tmp_path: Path,
) -> None:
    """MODEL_ARGS written out (an exported script's: no model script sourced) draw a model
    named by --hf-checkpoint's folder, as the first import named it by its sourced script;
    without a checkpoint, by the script."""
    flags = (
        "--swiglu --num-layers 3 --hidden-size 256 --ffn-hidden-size 688 "
        "--num-attention-heads 4 --group-query-attention --num-query-groups 2 "
        "--kv-channels 64 --vocab-size 320 --normalization RMSNorm --qk-layernorm"
    )
    script = tmp_path / "run.sh"
    train = "python3 train.py --colocate --rollout-batch-size 8 --global-batch-size 8"
    script.write_text(f"{train} {flags} --hf-checkpoint '/root/My Qwen3-32B'\n")
    assert import_slime(script).model == "my-qwen3-32b"
    script.write_text(f"{train} {flags}\n")
    assert import_slime(script).model == "run-model"


def test_the_tool_key_imports_and_exports_back(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text(
        "source scripts/models/glm4-9B.sh\npython3 train.py ${MODEL_ARGS[@]} --colocate "
        "--rollout-batch-size 8 --global-batch-size 8 --tool-key mytools "
        "--eval-interval 5 --eval-prompt-data aime /data/aime.jsonl --eval-tool-key evaltools\n"
    )
    values = import_slime(script).values
    assert values["recipe.data.tool_key"] == "mytools"
    assert values["recipe.eval.datasets"][0]["tool_key"] == "evaltools"
    cfg, _ = compose_run_config(
        ["model=qwen3-4b", "recipe=grpo_dapo", "hardware=h100x8", "recipe.data.tool_key=mytools",
         "recipe.eval.datasets.0.tool_key=evaltools"]
    )  # fmt: skip
    plan = build_plan(cfg)
    rollout = slime_arg_groups(cfg, plan)["ROLLOUT_ARGS"]
    assert rollout[rollout.index("--tool-key") + 1] == "mytools"
    exported = tmp_path / "run-exported.sh"
    exported.write_text(render_slime_args(cfg, plan))
    again = assembled(import_slime(exported), cfg)
    assert again.recipe.data.tool_key == "mytools"
    assert again.recipe.eval.datasets[0].tool_key == "evaltools"
    assert slime_arg_groups(again, build_plan(again)) == slime_arg_groups(cfg, plan)


def test_parquet_paths_and_row_slices_import_and_export_as_written(tmp_path: Path) -> None:
    """slime's reader takes a .jsonl or .parquet path with an optional `@[start:end]` row
    slice, for training and for every evaluation set: the import carries each path as it is,
    and the export writes it back (quoted for bash) so that slime, and the import, read the
    same path again."""
    script = write_script(
        tmp_path,
        "--eval-interval 5 --eval-prompt-data gsm8k /data/test.parquet@[-100:] "
        "aime /data/aime.jsonl@[:30]",
    )
    text = script.read_text().replace("/data/math.jsonl", "/data/train.parquet@[0:1000]")
    script.write_text(text)
    cfg, plan = imported_config(script, tmp_path / "out")
    assert cfg.recipe.data.prompt_data == "/data/train.parquet@[0:1000]"
    paths = [d.path for d in cfg.recipe.eval.datasets]
    assert paths == ["/data/test.parquet@[-100:]", "/data/aime.jsonl@[:30]"]
    groups = slime_arg_groups(cfg, plan)
    rollout, evaluation = groups["ROLLOUT_ARGS"], groups["EVAL_ARGS"]
    assert rollout[rollout.index("--prompt-data") + 1] == "/data/train.parquet@[0:1000]"
    assert evaluation[evaluation.index("--eval-prompt-data") + 1 :][:4] == [
        "gsm8k", "/data/test.parquet@[-100:]", "aime", "/data/aime.jsonl@[:30]"
    ]  # fmt: skip
    exported = tmp_path / "run-exported.sh"
    exported.write_text(render_slime_args(cfg, plan))
    assert "'/data/train.parquet@[0:1000]'" in exported.read_text()  # no glob for bash
    again = assembled(import_slime(exported), cfg)
    assert again.recipe.data.prompt_data == cfg.recipe.data.prompt_data
    assert [d.path for d in again.recipe.eval.datasets] == paths


def test_evaluation_sets_of_their_own_export_as_slimes_eval_config(tmp_path: Path) -> None:
    """Sets with their own keys, sample counts, response lengths or reward types: slime reads
    those per set only from an --eval-config file. The export writes the file (a heredoc in
    the table and script formats, `files` in json) into the checkpoint folder --save names;
    the exported script, run up to train.py, writes it, and importing the script reads it
    back to the same sets and the same export."""
    sets = (
        "recipe.eval.datasets=[{name: aime, path: /data/aime.jsonl, reward_type: deepscaler, "
        "n_samples_per_prompt: 16}, {name: gpqa, path: /data/gpqa.jsonl, reward_type: gpqa, "
        "label_key: answer, max_response_len: 2048}, {name: web, path: /data/web.jsonl, "
        "reward_type: f1, input_key: question}]"
    )
    run_dir = tmp_path / "run"
    cfg, _ = compose_run_config(
        ["model=qwen3-4b", "recipe=grpo_dapo", "hardware=h100x8", sets, f"run.dir={run_dir}"]
    )
    plan = build_plan(cfg)
    tokens = slime_arg_groups(cfg, plan)["EVAL_ARGS"]
    path = str(run_dir / "slime" / "eval_config.yaml")
    assert tokens[tokens.index("--eval-config") + 1] == path
    assert "--eval-prompt-data" not in tokens  # slime reads the sets from the file alone
    data = json.loads(render_slime_args(cfg, plan, "json"))
    import yaml

    assert yaml.safe_load(data["files"][path]) == {
        "eval": {
            "datasets": [
                {"name": "aime", "path": "/data/aime.jsonl", "rm_type": "deepscaler",
                 "n_samples_per_eval_prompt": 16},
                {"name": "gpqa", "path": "/data/gpqa.jsonl", "rm_type": "gpqa",
                 "label_key": "answer", "max_response_len": 2048},
                {"name": "web", "path": "/data/web.jsonl", "rm_type": "f1",
                 "input_key": "question"},
            ]
        }
    }  # fmt: skip
    exported = tmp_path / "run-exported.sh"
    exported.write_text(render_slime_args(cfg, plan))
    up_to_train = exported.read_text().replace("python3 train.py", "true")
    import subprocess

    subprocess.run(["bash", "-c", up_to_train], check=True)
    assert (run_dir / "slime" / "eval_config.yaml").read_text() == data["files"][path]
    imported = import_slime(exported)
    assert not [note for note in imported.unmapped if note.flag.startswith("--eval-config")]
    again = assembled(imported, cfg)
    assert again.recipe.eval.datasets == cfg.recipe.eval.datasets
    assert slime_arg_groups(again, build_plan(again)) == slime_arg_groups(cfg, plan)
    script = render_slime_args(cfg, plan, "script")
    assert f"cat > {path} <<'RLPOST_EVAL_CONFIG'" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_a_script_without_a_train_command_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "setup.sh"
    script.write_text("pip install slime\nray start --head\n")
    with pytest.raises(UserError, match=r"runs neither train\.py nor train_async\.py"):
        import_slime(script)


def test_the_readme_table_is_the_generated_one() -> None:
    from rlpost.interop.slime_flags import flag_table

    readme = (CONF.parent / "README.md").read_text()
    assert flag_table() in readme


def test_the_launch_script_export_imports_too(tmp_path: Path) -> None:
    shipped, _ = compose_run_config(["model=qwen3-4b", "recipe=grpo_dapo_async", "hardware=h100x8",
                                     "layout=qwen3-4b_h100x8_async"])  # fmt: skip
    plan = build_plan(shipped)
    script = tmp_path / "run-qwen3-4B-async.sh"
    script.write_text(render_slime_args(shipped, plan, "script"))
    cfg, again = imported_config(script, tmp_path / "out")
    assert cfg.recipe.loop.mode == "async"
    assert slime_arg_groups(cfg, again) == slime_arg_groups(shipped, plan)  # type: ignore[arg-type]


def test_a_launch_script_export_imports_to_no_override_that_changes_nothing(
    tmp_path: Path,
) -> None:
    """An export imported back names only its files on the launch line: --use-tensorboard and
    --save ./slime/ are rlpost's defaults (tracking.tensorboard: true, run.dir: null), and the
    environment the export writes into every job (PYTHONPATH, CUDA_DEVICE_MAX_CONNECTIONS)
    comes back out of the next export, so none of it is listed as dropped."""
    shipped, _ = compose_run_config(["model=qwen3-4b", "recipe=grpo_dapo", "hardware=h100x8"])
    script = tmp_path / "run-qwen3-4B.sh"
    script.write_text(render_slime_args(shipped, build_plan(shipped), "script"))
    imported = import_slime(script)
    assert imported.extra_overrides() == []
    assert imported.environment == []
    seeded = write_script(tmp_path, "--use-tensorboard --seed 7 --save /ckpt/slime/")
    assert import_slime(seeded).extra_overrides() == ["run.seed=7", "run.dir=/ckpt"]


def test_a_script_without_use_tensorboard_logs_no_tensorboard(tmp_path: Path) -> None:
    """slime writes TensorBoard logs only with --use-tensorboard (its parser's default is
    off), so a script without it imports as tracking.tensorboard: false, rlpost's default
    being on, and its export gives no --use-tensorboard back."""
    imported = import_slime(write_script(tmp_path, ""))
    assert imported.values["tracking.tensorboard"] is False
    assert imported.extra_overrides() == ["tracking.tensorboard=false"]
    cfg, plan = imported_config(write_script(tmp_path, ""), tmp_path / "out")
    groups = slime_arg_groups(cfg, plan)  # type: ignore[arg-type]
    assert "--use-tensorboard" not in [t for tokens in groups.values() for t in tokens]


@pytest.mark.parametrize(("flags", "mode"), [("", "online"), ("--wandb-mode offline", "offline")])
def test_wandb_without_a_mode_logs_online_as_in_slime(
    tmp_path: Path, flags: str, mode: str
) -> None:
    """slime's --wandb-mode defaults to None, which leaves wandb its own mode (online), where
    rlpost's default is offline: slime's train_infer_mismatch_helper example gives
    --use-wandb alone, and its export wrote --wandb-mode offline back."""
    script = write_script(tmp_path, f"--use-wandb --wandb-project p {flags}")
    assert import_slime(script).values["tracking.wandb.mode"] == mode
    cfg, plan = imported_config(script, tmp_path / "out")
    tokens = " ".join(slime_arg_groups(cfg, plan)["TRACKING_ARGS"])  # type: ignore[arg-type]
    assert f"--wandb-mode {mode}" in tokens


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (f"--custom-rm-path {OWN_FN}", "slime hands it to --custom-rm-path's function"),
        ("--rm-type math", "slime posts to it only for --rm-type remote_rm"),
    ],
)
def test_a_reward_url_slime_posts_nothing_to_is_listed_not_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: str, said: str
) -> None:
    """slime's on_policy_distillation example gives --rm-url beside --custom-rm-path, for its
    function to read from args: slime runs it, so the import lists the URL rather than import
    one that rlpost refuses as read by nothing; with --rm-type remote_rm it is imported."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "hooks_fixtures"))
    url = "--rm-url http://teacher:13141/generate"
    script = write_script(tmp_path, f"{flags} {url}")
    imported = import_slime(script)
    (listed,) = imported.unmapped
    assert listed.flag == "--rm-url" and said in listed.reason
    assert "recipe.rollout.reward.remote_url" not in imported.values
    imported_config(script, tmp_path / "out")  # plans
    remote = import_slime(write_script(tmp_path, f"--rm-type remote_rm {url}"))
    assert remote.values["recipe.rollout.reward.remote_url"] == "http://teacher:13141/generate"


def test_a_job_environment_rlpost_has_no_key_for_is_said_to_be_dropped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """slime's scripts give the job NCCL_NVLS_ENABLE in --runtime-env-json; rlpost has no key
    for a job's environment, so the import lists it as not imported, and why."""
    from rlpost.cli.main import main

    script = write_script(tmp_path, "")
    runtime = json.dumps({"env_vars": {"PYTHONPATH": "/root/Megatron-LM/",
                                       "NCCL_NVLS_ENABLE": "1"}})  # fmt: skip
    text = script.read_text().replace(
        "python3 train.py",
        f"ray job submit --address=http://127.0.0.1:8265 --runtime-env-json='{runtime}' "
        "-- python3 train.py",
    )
    script.write_text(text)
    assert [name for name, _, _ in import_slime(script).environment] == ["NCCL_NVLS_ENABLE"]
    main(["import", "slime", str(script), "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert "1 variable(s) of the job's environment not imported" in out
    assert "rlpost has no config key for environment variables" in out
    assert "NCCL_NVLS_ENABLE=1" in out and "PYTHONPATH" not in out


SLIME_GROUPS = (
    "CLUSTER_ARGS", "CKPT_ARGS", "ROLLOUT_ARGS", "EVAL_ARGS", "GRPO_ARGS", "SPEC_ARGS",
    "TRACKING_ARGS",
)  # fmt: skip
"""The groups of slime's own flags (MODEL, PERF, OPTIMIZER and MISC hold Megatron's, and
--sglang-* pass SGLang's options through)."""


def test_exports_use_only_flags_slime_defines(combination: Callable[[str, str, str], Any]) -> None:
    """slime parses with parse_known_args, so a flag it lacks would be dropped silently:
    every exported flag of slime's own groups is one of its recorded argument names."""
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "slime_flags.txt"
    known = {line.split()[0] for line in fixture.read_text().splitlines() if line.startswith("--")}
    unknown: set[str] = set()
    for model, recipe, hardware in COMBINATIONS:
        cfg = exportable(combination(model, recipe, hardware))
        if cfg is None:
            continue
        groups = slime_arg_groups(cfg, build_plan(cfg))
        for name in SLIME_GROUPS:
            unknown |= {t for t in groups.get(name, []) if t.startswith("--")} - known
    assert not unknown


def test_exports_pass_sglang_only_flags_slimes_sglang_takes(
    combination: Callable[[str, str, str], Any],
) -> None:
    """slime adds each flag of its pinned SGLang as --sglang-<flag> (and a few of its own):
    every exported --sglang-* flag is one of those, switches come bare, and each value reads
    as the recorded type."""
    table = json.loads(SLIME_SGLANG_TABLE.read_text())
    assert table["sglang_version"] == SGLANG_VERSION  # generated from the pinned SGLang
    options = table["options"]
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "slime_flags.txt"
    slime_own = {
        line.split()[0] for line in fixture.read_text().splitlines() if line.startswith("--sglang")
    }
    seen = set()
    for model, recipe, hardware in COMBINATIONS:
        cfg = exportable(combination(model, recipe, hardware))
        if cfg is None:
            continue
        flags = split_flags(slime_arg_groups(cfg, build_plan(cfg)).get("SGLANG_ARGS", []))
        for flag, values in flags:
            if flag in slime_own or not flag.startswith("--sglang-"):
                continue
            assert flag in slime_sglang_flags(), f"{model}/{recipe}/{hardware}: {flag}"
            entry = options[slime_sglang_flags()[flag]]
            assert (values == []) == entry["switch"], (flag, values)
            for value in values:
                assert reads_as(value, entry["type"]), (flag, value, entry["type"])
            seen.add(flag)
    assert {"--sglang-mem-fraction-static", "--sglang-cuda-graph-max-bs"} <= seen


def reads_as(token: str, kinds: list[str]) -> bool:
    """The token parses as one of the recorded kinds (argparse's type= for it)."""
    for kind in kinds:
        item = kind.removeprefix("list[").removesuffix("]")
        try:
            {"int": int, "float": float}.get(item, str)(token)
            return True
        except ValueError:
            continue
    return False


def test_the_old_spellings_the_export_uses_are_aliases_in_slimes_sglang() -> None:
    for name in SLIME_SGLANG_NAMES:
        assert slime_sglang_flags()[slime_sglang_flag(name)] == name


def test_an_sglang_option_slimes_sglang_lacks_is_refused_by_the_export(
    compose_run: Callable[..., RunConfig],
) -> None:
    cfg = compose_run(
        "model=qwen3-4b", "recipe=grpo_dapo", "hardware=h100x8",
        "++layout.rollout.sglang.enable_dense_mlp_attn_tp=true",
    )  # fmt: skip
    plan = build_plan(cfg)  # rlpost's own engines (SGLang 0.5.23) take it
    with pytest.raises(UserError) as refused:
        slime_arg_groups(cfg, plan)
    (issue,) = refused.value.issues
    assert issue.key == "layout.rollout.sglang.enable_dense_mlp_attn_tp"
    assert f"sglang {SGLANG_VERSION}, which slime {SLIME_COMMIT} runs, has no" in issue.message


def test_mtp_layers_without_training_them_are_not_imported(tmp_path: Path) -> None:
    """--mtp-num-layers is a model flag: rlpost builds MTP layers only with
    --enable-mtp-training, and passes their weights to the engines otherwise."""
    imported = import_slime(write_script(tmp_path, "--mtp-num-layers 1"))
    [note] = imported.unmapped
    assert (note.flag, note.nearest) == ("--mtp-num-layers", "recipe.train.mtp_training")
    assert "only to train them" in note.reason


def test_an_eval_config_file_imports_its_sets_and_defaults(tmp_path: Path) -> None:
    """slime's multi-task evaluation (examples/eval_multi_task): per-set reward types and
    sample counts, defaults for every set; what rlpost lacks (ifbench, a set's own
    temperature) is listed."""
    config = tmp_path / "multi_task.yaml"
    config.write_text(
        "eval:\n"
        "  defaults:\n    max_response_len: 16384\n    top_p: 0.7\n    min_eval_samples: 4\n"
        "  datasets:\n"
        "    - {name: aime, path: /data/aime.jsonl, rm_type: deepscaler,"
        " n_samples_per_eval_prompt: 16}\n"
        "    - {name: gpqa, path: /data/gpqa.jsonl, rm_type: gpqa, n_samples_per_eval_prompt: 2,"
        " temperature: 0.6}\n"
    )
    script = write_script(tmp_path, f"--eval-interval 20 --eval-config {config}")
    imported = import_slime(script)
    values = imported.values
    assert values["recipe.eval.datasets"] == [
        {"name": "aime", "path": "/data/aime.jsonl", "reward_type": "deepscaler",
         "n_samples_per_prompt": 16},
        {"name": "gpqa", "path": "/data/gpqa.jsonl", "reward_type": "gpqa",
         "n_samples_per_prompt": 2},
    ]  # fmt: skip
    assert (values["recipe.eval.max_response_len"], values["recipe.eval.top_p"]) == (16384, 0.7)
    assert sorted(u.flag for u in imported.unmapped) == [
        "--eval-config defaults.min_eval_samples",
        "--eval-config gpqa.temperature",
    ]
    cfg, _ = imported_config(script, tmp_path / "out")
    assert [d.reward_type for d in cfg.recipe.eval.datasets] == ["deepscaler", "gpqa"]  # type: ignore[attr-defined]
    missing = import_slime(write_script(tmp_path, "--eval-interval 20 --eval-config /nowhere.yaml"))
    [note] = missing.unmapped
    assert note.flag == "--eval-config" and "cannot be read here" in note.reason


def test_an_eval_sets_rm_type_beside_a_custom_reward_function_is_not_imported(
    tmp_path: Path,
) -> None:
    """slime's --custom-rm-path scores every sample before any rm_type, an eval config set's
    included; rlpost grades a set by its own reward_type, so importing the rm_type would
    change the set's scores: it is listed, and the set is scored by the function."""
    config = tmp_path / "eval.yaml"
    config.write_text(
        "eval:\n  datasets:\n    - {name: aime, path: /data/aime.jsonl, rm_type: math}\n"
    )
    custom = "--custom-rm-path rlpost_test_hooks.length_reward --rm-type deepscaler"
    script = write_script(tmp_path, f"{custom} --eval-interval 20 --eval-config {config}")
    imported = import_slime(script)
    assert imported.values["recipe.eval.datasets"] == [{"name": "aime", "path": "/data/aime.jsonl"}]
    [note] = imported.unmapped
    assert (note.flag, note.values) == ("--eval-config aime.rm_type", ("math",))
    assert "before any rm_type" in note.reason
    plain = import_slime(write_script(tmp_path, f"--eval-interval 20 --eval-config {config}"))
    assert plain.values["recipe.eval.datasets"][0]["reward_type"] == "math"
    assert not plain.unmapped


def test_eval_config_reward_functions_import_and_export_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """slime's eval config: a set's custom_rm_path scores it, the defaults' every other set,
    before any rm_type (the set's rm_type beside one is listed, not imported); rlpost's
    custom_reward_function keys, and the export writes them back into the file."""
    from rlpost.plan.slime_args import eval_config_file

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "hooks_fixtures"))
    config = tmp_path / "eval.yaml"
    config.write_text(
        "eval:\n"
        "  defaults: {custom_rm_path: rlpost_test_hooks.quarter_reward}\n"
        "  datasets:\n"
        "    - {name: ifeval, path: /data/ifeval.jsonl,"
        " custom_rm_path: rlpost_test_hooks.length_reward, rm_type: ifbench}\n"
        "    - {name: aime, path: /data/aime.jsonl, rm_type: math}\n"
    )
    script = write_script(tmp_path, f"--eval-interval 20 --eval-config {config}")
    imported = import_slime(script)
    assert imported.values["recipe.eval.custom_reward_function"] == WIDE_FN
    assert imported.values["recipe.eval.datasets"] == [
        {"name": "ifeval", "path": "/data/ifeval.jsonl", "custom_reward_function": OWN_FN},
        {"name": "aime", "path": "/data/aime.jsonl"},
    ]
    notes = {u.flag: u for u in imported.unmapped}
    assert sorted(notes) == ["--eval-config aime.rm_type", "--eval-config ifeval.rm_type"]
    assert (
        f"the set's custom_rm_path ({OWN_FN}) before any rm_type"
        in notes["--eval-config ifeval.rm_type"].reason
    )
    assert f"the defaults' custom_rm_path ({WIDE_FN})" in notes["--eval-config aime.rm_type"].reason
    cfg, _ = imported_config(script, tmp_path / "out")
    exported = eval_config_file(cfg)  # type: ignore[arg-type]
    assert exported is not None
    assert yaml.safe_load(exported[1]) == {
        "eval": {
            "defaults": {"custom_rm_path": WIDE_FN},
            "datasets": [
                {"name": "ifeval", "path": "/data/ifeval.jsonl", "custom_rm_path": OWN_FN},
                {"name": "aime", "path": "/data/aime.jsonl"},
            ],
        }
    }


def test_an_eval_config_set_without_labels_imports_and_exports_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """slime reads no label for a set whose label_key is null in its eval config (its own, or
    the defaults' for every set without one), where --label-key names training's: rlpost's
    label_key: false, which the export writes back as null."""
    from rlpost.plan.slime_args import eval_config_file

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "hooks_fixtures"))
    config = tmp_path / "eval.yaml"
    config.write_text(
        "eval:\n"
        "  defaults: {label_key: null}\n"
        "  datasets:\n"
        "    - {name: chat, path: /data/chat.jsonl,"
        " custom_rm_path: rlpost_test_hooks.length_reward}\n"
        "    - {name: aime, path: /data/aime.jsonl, label_key: answer, rm_type: math}\n"
        "    - {name: coin, path: /data/coin.jsonl, label_key: null, rm_type: random}\n"
    )
    script = write_script(tmp_path, f"--eval-interval 20 --eval-config {config}")
    imported = import_slime(script)
    assert not imported.unmapped
    assert [d.get("label_key") for d in imported.values["recipe.eval.datasets"]] == [
        False, "answer", False
    ]  # fmt: skip
    cfg, _ = imported_config(script, tmp_path / "out")
    assert cfg.recipe.data.label_key == "label"  # type: ignore[attr-defined]
    exported = eval_config_file(cfg)  # type: ignore[arg-type]
    assert exported is not None
    sets = yaml.safe_load(exported[1])["eval"]["datasets"]
    assert [(d["name"], d["label_key"]) for d in sets] == [
        ("chat", None), ("aime", "answer"), ("coin", None)
    ]  # fmt: skip
    # scored by training's function, sets alike but for reading no label: slime has no flag
    # for that (--eval-label-key null is no value), so the file says it
    overrides = [
        "model=qwen3-4b", "recipe=grpo_dapo", "hardware=h100x8",
        f"recipe.rollout.reward.custom_function={OWN_FN}",
        "recipe.eval.datasets=[{name: a, path: /data/a.jsonl, label_key: false},"
        " {name: b, path: /data/b.jsonl, label_key: false}]",
    ]  # fmt: skip
    alike, _ = compose_run_config(overrides)
    tokens = slime_arg_groups(alike, build_plan(alike))["EVAL_ARGS"]
    assert "--eval-config" in tokens and "--eval-label-key" not in tokens
    exported = eval_config_file(alike)
    assert exported is not None
    assert [d["label_key"] for d in yaml.safe_load(exported[1])["eval"]["datasets"]] == [None] * 2


def test_the_eval_key_flags_reach_eval_config_sets_that_name_no_key(tmp_path: Path) -> None:
    """slime takes an --eval-config set's input, label and tool keys from the set, else the
    file's defaults, else --eval-input-key, --eval-label-key, --eval-tool-key, else training's
    keys (its eval_config.py): a set the file leaves to the flags reads the flags' keys, and
    the export writes every set's keys into the file, which imports back to the same sets."""
    from rlpost.plan.slime_args import eval_config_file

    config = tmp_path / "eval.yaml"
    config.write_text(
        "eval:\n"
        "  defaults: {tool_key: calls}\n"
        "  datasets:\n"
        "    - {name: own, path: /data/own.jsonl, input_key: question, label_key: answer}\n"
        "    - {name: bare, path: /data/bare.jsonl}\n"
    )
    keys = "--eval-input-key prompt --eval-label-key solution --eval-tool-key functions"
    script = write_script(tmp_path, f"--eval-interval 20 {keys} --eval-config {config}")
    imported = import_slime(script)
    assert not imported.unmapped
    own = {"input_key": "question", "label_key": "answer", "tool_key": "calls"}
    bare = {"input_key": "prompt", "label_key": "solution", "tool_key": "calls"}
    assert imported.values["recipe.eval.datasets"] == [
        {"name": "own", "path": "/data/own.jsonl", **own},
        {"name": "bare", "path": "/data/bare.jsonl", **bare},
    ]
    cfg, plan = imported_config(script, tmp_path / "out")
    exported = eval_config_file(cfg)  # type: ignore[arg-type]
    assert exported is not None
    written = yaml.safe_load(exported[1])["eval"]["datasets"]
    assert written == imported.values["recipe.eval.datasets"]
    config.write_text(exported[1])
    tokens = slime_arg_groups(cfg, plan)["EVAL_ARGS"]  # type: ignore[arg-type]
    flags = " ".join(t for t in tokens if t != "--eval-config" and not t.endswith(".yaml"))
    again = import_slime(write_script(tmp_path, f"{flags} --eval-config {config}"))
    assert again.values["recipe.eval.datasets"] == imported.values["recipe.eval.datasets"]


def test_eval_prompt_data_beside_an_eval_config_is_listed_as_not_imported(
    tmp_path: Path,
) -> None:
    """slime reads the evaluation sets from --eval-config when it is given and ignores
    --eval-prompt-data; so does the import, which lists the flag with the reason."""
    config = tmp_path / "eval.yaml"
    config.write_text("eval:\n  datasets:\n    - {name: aime, path: /data/aime.jsonl}\n")
    pairs = "--eval-prompt-data gsm8k /data/gsm8k.jsonl"
    imported = import_slime(
        write_script(tmp_path, f"--eval-interval 20 {pairs} --eval-config {config}")
    )
    assert imported.values["recipe.eval.datasets"] == [{"name": "aime", "path": "/data/aime.jsonl"}]
    [note] = imported.unmapped
    assert (note.flag, note.values, note.nearest) == (
        "--eval-prompt-data", ("gsm8k", "/data/gsm8k.jsonl"), "recipe.eval.datasets"
    )  # fmt: skip
    assert note.reason == "slime reads the sets from the --eval-config file and ignores this flag"


def test_evaluation_sets_without_an_eval_interval_are_not_imported(tmp_path: Path) -> None:
    """slime's train.py evaluates, before training too, only with --eval-interval; rlpost
    evaluates a recipe's sets once before training even without recipe.eval.interval. A
    script's sets without the interval (run-qwen3-235B-A22B.sh comments it out) are listed,
    not imported: the run evaluates nothing, as slime's, and it exports."""
    config = tmp_path / "eval.yaml"
    config.write_text("eval:\n  datasets:\n    - {name: aime, path: /data/aime.jsonl}\n")
    for given, flag in (
        ("--eval-prompt-data aime /data/aime.jsonl", "--eval-prompt-data"),
        (f"--eval-config {config}", "--eval-config"),
    ):
        imported = import_slime(write_script(tmp_path, f"{given} --n-samples-per-eval-prompt 4"))
        assert "recipe.eval.datasets" not in imported.values
        [note] = [note for note in imported.unmapped if note.flag == flag]
        assert note.values == tuple(given.split()[1:]) and note.nearest == "recipe.eval.interval"
        assert (
            note.reason
            == "slime evaluates only with --eval-interval, which the script leaves unset"
        )
        cfg, plan = imported_config(tmp_path / "run.sh", tmp_path / "out")
        assert cfg.recipe.eval.datasets == [] and "--eval-prompt-data" not in render_slime_args(
            cfg, plan
        )
    with_interval = import_slime(
        write_script(tmp_path, "--eval-interval 5 --eval-prompt-data a /a")
    )
    assert with_interval.values["recipe.eval.datasets"] == [{"name": "a", "path": "/a"}]


def test_an_eval_config_set_without_tools_imports_and_exports_back(tmp_path: Path) -> None:
    """slime reads no tools for a set whose tool_key is null in its eval config (its own, or
    the defaults' for every set without one): its Dataset reads tools only under a key, and
    a null in the file is a value, so neither --eval-tool-key nor --tool-key fills it in.
    rlpost's tool_key: false, which the export writes back as null."""
    from rlpost.plan.slime_args import eval_config_file

    config = tmp_path / "eval.yaml"
    config.write_text(
        "eval:\n"
        "  datasets:\n"
        "    - {name: plain, path: /data/plain.jsonl, tool_key: null}\n"
        "    - {name: agent, path: /data/agent.jsonl}\n"
    )
    flags = "--tool-key calls --eval-tool-key functions"
    script = write_script(tmp_path, f"--eval-interval 20 {flags} --eval-config {config}")
    imported = import_slime(script)
    assert not imported.unmapped
    sets = imported.values["recipe.eval.datasets"]
    assert [d.get("tool_key") for d in sets] == [False, "functions"]
    cfg, _ = imported_config(script, tmp_path / "out")
    assert [d.tool_key for d in cfg.recipe.eval.datasets] == [False, "functions"]  # type: ignore[attr-defined]
    exported = eval_config_file(cfg)  # type: ignore[arg-type]
    assert exported is not None
    written = yaml.safe_load(exported[1])["eval"]["datasets"]
    assert [(d["name"], d["tool_key"]) for d in written] == [
        ("plain", None), ("agent", "functions")
    ]  # fmt: skip
    # sets alike but for reading no tools: slime has no flag for that, so the file says it
    overrides = [
        "model=qwen3-4b", "recipe=grpo_dapo", "hardware=h100x8",
        "recipe.eval.datasets=[{name: a, path: /data/a.jsonl, tool_key: false},"
        " {name: b, path: /data/b.jsonl, tool_key: false}]",
    ]  # fmt: skip
    alike, _ = compose_run_config(overrides)
    tokens = slime_arg_groups(alike, build_plan(alike))["EVAL_ARGS"]
    assert "--eval-config" in tokens and "--eval-tool-key" not in tokens
    exported = eval_config_file(alike)
    assert exported is not None
    config.write_text(exported[1])
    again = import_slime(write_script(tmp_path, f"--eval-interval 20 --eval-config {config}"))
    assert [d["tool_key"] for d in again.values["recipe.eval.datasets"]] == [False] * 2
    defaults = "eval:\n  defaults: {tool_key: null}\n  datasets:\n    - {name: a, path: /a}\n"
    config.write_text(defaults)
    script = write_script(tmp_path, f"--eval-interval 20 {flags} --eval-config {config}")
    assert import_slime(script).values["recipe.eval.datasets"][0]["tool_key"] is False


@pytest.mark.parametrize("flag", ["", "--eval-top-k 5 "])
def test_a_refused_eval_config_default_is_named_with_the_flag_it_overrules(
    tmp_path: Path, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """slime takes an --eval-config default over the flag for the same setting (a set's own
    value, else the defaults, else the flag), and so does the import: the refusal of the
    value imported names the file's default that set it, and the flag beside it, overruled."""
    from rlpost.cli.main import main

    config = tmp_path / "eval.yaml"
    config.write_text(
        "eval:\n  defaults: {top_k: 0}\n  datasets:\n    - {name: aime, path: /data/aime.jsonl}\n"
    )
    script = write_script(tmp_path, f"--eval-interval 20 {flag}--eval-config {config}")
    default = f"--eval-config {config} defaults.top_k"
    with pytest.raises(SystemExit) as exited:
        main(["import", "slime", str(script), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "Traceback" not in err
    assert f"{default} = '0'   ({script})" in err
    assert "imported as recipe.eval.top_k: top_k=0 keeps no token" in err
    assert f"fix: change {default} (in rlpost's terms" in err
    overruled = "--eval-top-k 5 in the script sets it too: slime takes the --eval-config file's"
    assert (overruled in err) == bool(flag)
    assert "recipe/" not in err
    imported = import_slime(script)
    assert imported.values["recipe.eval.top_k"] == 0
    origin = imported.origin("recipe.eval.top_k")
    assert origin is not None and (origin.source, origin.value) == (default, "0")


@pytest.mark.parametrize(
    ("defaults", "entry", "given"),
    [
        ("", ", input_key: null", "the set's input_key is null"),
        ("  defaults: {input_key: null}\n", "", "the file's defaults.input_key is null"),
    ],
)
def test_an_eval_config_sets_null_input_key_is_refused_as_slime_reads_no_prompt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], defaults: str, entry: str, given: str
) -> None:
    """A null in slime's eval config is a value: slime gives the set's Dataset prompt_key None
    (neither --eval-input-key nor --input-key fills it in) and reads data.get(None) as every
    prompt, so its evaluation stops; the import refuses it rather than read training's key."""
    from rlpost.cli.main import main

    config = tmp_path / "eval.yaml"
    config.write_text(
        f"eval:\n{defaults}  datasets:\n    - {{name: aime, path: /data/aime.jsonl{entry}}}\n"
    )
    script = write_script(
        tmp_path, f"--input-key prompt --eval-input-key question --eval-interval 20 "
        f"--eval-config {config}"
    )  # fmt: skip
    with pytest.raises(UserError) as refused:
        import_slime(script)
    (issue,) = refused.value.issues
    assert issue.key == f"--eval-config {config} datasets.aime.input_key"
    assert given in issue.message and "data.get(None)" in issue.message
    assert "input_key: prompt" in issue.fix
    with pytest.raises(SystemExit) as exited:
        main(["import", "slime", str(script), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "Traceback" not in err and given in err


def test_eval_custom_rm_path_on_the_command_line_is_not_imported(tmp_path: Path) -> None:
    """slime's eval config falls back to args.eval_custom_rm_path, which no flag of slime's
    sets: its parser drops --eval-custom-rm-path, so slime scores evaluation without it."""
    imported = import_slime(write_script(tmp_path, "--eval-custom-rm-path my_pkg.rm.score"))
    [note] = imported.unmapped
    assert (note.flag, note.values) == ("--eval-custom-rm-path", ("my_pkg.rm.score",))
    assert note.nearest == "recipe.eval.custom_reward_function"
    assert "slime defines no such flag: its parser drops it" in note.reason
    assert "recipe.eval.custom_reward_function" not in imported.values


def test_a_script_that_trains_no_rollout_imports_as_an_evaluation(tmp_path: Path) -> None:
    """slime's --num-rollout 0: train.py evaluates the weights --load names once. The import
    launches mode=eval on them (model.load) in a directory of its own."""
    script = write_script(
        tmp_path,
        "--num-rollout 0 --eval-interval 1 --eval-prompt-data aime /data/aime.jsonl "
        "--load /ckpt/qwen3-4b-step40 --save /ckpt/qwen3-4b-step40",
    )
    imported = import_slime(script)
    assert "mode=eval" in imported.extra_overrides()
    assert "run.dir" not in imported.values
    # (the helper's script says --num-rollout 10 first: the later value counts, as in slime)
    note = [u for u in imported.unmapped if u.flag == "--num-rollout"][-1]
    assert note.nearest == "mode" and "evaluates the loaded weights once" in note.reason
    cfg, _ = imported_config(script, tmp_path / "out")
    assert cfg.mode == "eval" and cfg.model.load == "/ckpt/qwen3-4b-step40"  # type: ignore[attr-defined]
