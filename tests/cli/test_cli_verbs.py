"""Each `rlpost` verb, run in-process through main(argv) (and two through the real command)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlpost.cli.main import build_parser, main, verbs

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "my_configs"
TINY = ("model=qwen3-tiny", "recipe=grpo_tiny_math", "hardware=cpu")
GPU_RUN = ("model=qwen3-4b", "recipe=grpo_dapo", "hardware=h100x8", "model.hf_checkpoint=/no/4b")


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `rlpost ARGV`."""
    try:
        main(argv)
        status = 0
    except SystemExit as exc:
        status = int(exc.code or 0)
    out, err = capsys.readouterr()
    return status, out, err


def rlpost(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "rlpost.cli.main", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_ls_lists_shipped_and_user_configs_with_descriptions(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _ = run_main(["ls", "--config-dir", str(EXAMPLES)], capsys)
    assert status == 0
    lines = out.splitlines()
    assert lines[0] == "model" and {"recipe", "hardware", "layout"} <= set(lines)
    qwen = next(line for line in lines if line.split()[:2] == ["qwen3-8b", "shipped"])
    assert "36 layers" in qwen
    mine = next(line for line in lines if line.split()[:1] == ["my_grpo"])
    assert "examples/my_configs" in mine and "(extends grpo_dapo)" in mine
    layout = next(line for line in lines if line.split()[:1] == ["qwen3-4b_h100x8"])
    assert "Qwen3-4B on one 8 x H100 node" in layout


def test_ls_flags_a_user_file_hidden_by_a_shipped_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "hardware").mkdir()
    (tmp_path / "hardware" / "cpu.yaml").write_text("name: cpu\ndescription: mine\n")
    status, out, _ = run_main(["ls", "hardware", "--config-dir", str(tmp_path)], capsys)
    assert status == 0
    mine = [line for line in out.splitlines() if "mine" in line]
    assert len(mine) == 1 and "never loaded" in mine[0]


def test_ls_rejects_an_unknown_group(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run_main(["ls", "recipes"], capsys)
    assert status == 2 and "Did you mean 'recipe'?" in err and "Traceback" not in err


def test_validate_prints_a_summary_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_main(["validate", *TINY], capsys)
    assert status == 0
    assert out.startswith("rlpost: OK  model=qwen3-tiny recipe=grpo_tiny_math hardware=cpu")
    assert "checked" in out and "train TP1" in out
    # hardware=cpu: the slots are named as such, a GPU profile's as GPUs
    assert "colocated on 2 device slots" in out and "2 engine(s) of 1 device slot(s)" in out
    assert "GiB per device slot" in out and "GPU" not in out.split("  note")[0]
    status, out, _ = run_main(["validate", "--no-local-checks", *GPU_RUN], capsys)
    assert status == 0 and "colocated on 8 GPUs" in out and "GiB per GPU" in out


@pytest.mark.parametrize(
    "argv",
    [["validate", *TINY], ["plan", *TINY, "mode=eval"]],
    ids=["validate", "plan of an evaluation"],
)
def test_a_defect_in_a_verb_is_an_internal_error_with_its_traceback_once(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An exception of rlpost's own (not a refusal) in a verb exits 4 with its traceback once
    and a line naming the verb and calling it a bug, as python launch.py does, where it
    ended in Python's raw traceback and exit status 1; a refusal stays exit 2, no traceback."""
    import rlpost.plan

    def a_defect(*args: object) -> None:
        raise ZeroDivisionError("division by zero in the memory estimate")

    monkeypatch.setattr(rlpost.plan, "plan_config", a_defect)
    status, _, err = run_main(argv, capsys)
    assert status == 4
    assert err.count("Traceback (most recent call last)") == 1, err
    assert err.endswith(
        f"rlpost {argv[0]}: internal error: ZeroDivisionError: division by zero in the memory "
        "estimate\n  rlpost did not expect it: most likely a bug in rlpost, not a problem with "
        "the config or the command line. The traceback above says where: please report it "
        "with the command line.\n"
    ), err
    status, _, err = run_main([*argv, "recipe.optim.lr=-1"], capsys)
    assert status == 2 and "Traceback" not in err and "recipe.optim.lr" in err


def test_validate_says_only_what_it_checked(capsys: pytest.CaptureFixture[str]) -> None:
    def checked_line(*argv: str) -> str:
        status, out, _ = run_main(["validate", *argv], capsys)
        assert status == 0, out
        return next(line for line in out.splitlines() if line.startswith("  checked"))

    here = checked_line(*TINY)  # the tiny model's config.json ships: it is compared
    assert here.endswith("config.json, plan, files and this machine")
    remote = ("model=qwen3-4b", "recipe=grpo_dapo", "hardware=h100x8", "model.hf_checkpoint=/no/4b")
    skipped = checked_line("--no-local-checks", *remote)
    assert "config.json" not in skipped and "files and this machine" not in skipped
    assert "--no-local-checks" in skipped and "packages or GPUs" in skipped
    # a CPU profile's local checks look at no GPU, and say so
    assert checked_line("--no-local-checks", *TINY).endswith(
        "(not this machine's files or packages: --no-local-checks)"
    )
    status, _, err = run_main(["validate", *TINY, "model.hf_checkpoint=/no/such"], capsys)
    assert status == 2 and "include this machine's files and packages; for a config" in err
    plan_only = checked_line(*remote, "mode=plan")
    assert "files and this machine" not in plan_only
    assert "no config.json at model.hf_checkpoint=/no/4b here" in plan_only


@pytest.mark.parametrize("verb", ["ls", "validate"])
def test_a_config_name_that_is_no_config_is_refused(
    verb: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run_main([verb, "--config-name", "confg"], capsys)
    assert status == 2 and out == "" and "Traceback" not in err
    assert "--config-name = 'confg'" in err and "no top-level config 'confg'" in err
    assert "Did you mean 'config'?" in err and "choose one of: config" in err
    assert run_main([verb, "--config-name", "config"], capsys)[0] == 0  # the fix works


def test_validate_reports_every_problem_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["validate", *TINY, "recipe.rollout.temperature=-1", "trainer.backend=jax"]
    status, out, err = run_main(argv, capsys)
    assert status == 2 and out == ""
    assert "rlpost: 2 configuration errors" in err
    assert "recipe.rollout.temperature = -1" in err and "trainer.backend = 'jax'" in err
    assert "Traceback" not in err


def test_a_slime_flag_is_answered_with_its_key_and_a_secret_never_shown(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["validate", *TINY, "--rollout-batch-size", "16", "--wandb-key=s3cr3t", "--use-tis"]
    status, out, err = run_main(argv, capsys)
    assert status == 2 and out == "" and "Traceback" not in err
    assert "rlpost: 3 command-line errors" in err
    assert "fix: write recipe.rollout.batch_size=16" in err
    assert "fix: write recipe.algo.off_policy_correction=tis" in err
    assert "--wandb-key = '***'" in err and "s3cr3t" not in err


def test_a_flag_a_verb_does_not_take_is_answered_with_the_verbs_own_flags(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A verb's refusal of a flag names the verb and lists its flags as its own, where it
    called them Hydra's flags and the verb the launcher (`rlpost kuberay --dry-run` listed
    --image and --pvc as Hydra's)."""
    status, out, err = run_main(["kuberay", "--image", "i", "--scratch", "--dry-run"], capsys)
    assert status == 2 and out == "" and "Traceback" not in err
    assert "--dry-run is not a flag of rlpost kuberay: it takes its own flags" in err
    assert "rlpost kuberay's flags: " in err and "--image" in err
    assert "Hydra" not in err and "launcher" not in err


def test_verl_keys_are_answered_with_rlpost_keys_all_at_once_and_a_secret_never_shown(
    capsys: pytest.CaptureFixture[str],
) -> None:
    verl = [
        "data.train_batch_size=1024",
        "actor_rollout_ref.rollout.n=5",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.ppo_mini_batch_size=256",
        "reward_model.sandbox_fusion.api_key=s3cr3t",
    ]
    status, out, err = run_main(["validate", *TINY, *verl], capsys)
    assert status == 2 and out == "" and "Traceback" not in err
    assert "rlpost: 5 command-line errors" in err
    assert "fix: write recipe.rollout.batch_size=1024" in err
    assert "fix: write recipe.rollout.n_samples_per_prompt=5" in err
    assert "fix: write recipe.algo.advantage_estimator=grpo" in err
    assert "fix: write recipe.train.global_batch_size=1280" in err
    assert "api_key = '***'" in err and "s3cr3t" not in err


def test_validate_refuses_training_settings_given_to_an_evaluation(
    capsys: pytest.CaptureFixture[str],
) -> None:
    evaluation = ["validate", "--no-local-checks", *TINY, "mode=eval", "model.load=/ckpt/s"]
    status, out, err = run_main([*evaluation, "recipe.save.interval=5"], capsys)
    assert status == 2 and out == "" and "Traceback" not in err
    assert "recipe.save.interval = 5   (command line: recipe.save.interval=5)" in err
    assert "mode=eval trains nothing and reads no training settings" in err
    assert "fix: drop the override recipe.save.interval=5 from the command line, or use " in err
    status, out, _ = run_main(evaluation, capsys)  # the recipe's own: kept, and noted
    assert status == 0
    assert "note     mode=eval trains nothing: the training settings the files give in " in out
    status, out, _ = run_main(["validate", *TINY, "recipe.save.interval=5"], capsys)
    assert status == 0 and "mode=eval" not in out


def test_validate_includes_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["validate", "model=glm4.5-355b-a32b", "recipe=grpo_dapo", "hardware=h100x8"]
    status, _, err = run_main(argv, capsys)
    assert status == 2 and "no tensor-parallel size fits" in err


def test_validate_a_missing_file_is_a_user_error(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run_main(["validate", "nowhere/recipe/x.yaml"], capsys)
    assert status == 2 and "no such file" in err


def test_show_gives_each_value_its_source(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "show",
        "--config-dir",
        str(EXAMPLES),
        "model=qwen3-8b",
        "recipe=my_grpo",
        "hardware=a100x4",
        "recipe.optim.weight_decay=0.05",
    ]
    status, out, _ = run_main(argv, capsys)
    assert status == 0
    lines = {
        line.split("#")[0].strip(): line.split("#", 1)[1].strip()
        for line in out.splitlines()
        if "#" in line
    }
    assert lines["max_response_len: 4096"].endswith("examples/my_configs/recipe/my_grpo.yaml:11")
    assert lines["n_samples_per_prompt: 8"].endswith("conf/recipe/grpo_dapo.yaml:16")
    assert lines["weight_decay: 0.05"] == "command line: recipe.optim.weight_decay=0.05"
    assert lines["backend: auto"] == "default"
    shown = yaml.safe_load(out)  # the output is the resolved config, as YAML
    assert shown["recipe"]["optim"]["lr"] == 2e-6 and shown["hardware"]["gpus_per_node"] == 4


def test_show_only_one_section(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_main(["show", *TINY, "--only", "recipe.rollout.reward"], capsys)
    assert status == 0 and out.splitlines()[0] == "reward:"
    assert "type: math" in out and "grpo_tiny_math.yaml:" in out
    status, _, err = run_main(["show", *TINY, "--only", "recipe.rollot"], capsys)
    assert status == 2 and "no section 'recipe.rollot'" in err


def test_show_of_an_evaluation_marks_what_only_training_reads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _ = run_main(["show", *TINY, "mode=eval", "--only", "recipe.eval"], capsys)
    assert status == 0
    lines = [line.split("#", 1) for line in out.splitlines() if "#" in line]
    comments = {value.strip(): comment for value, comment in lines}
    assert comments["interval: 20"].endswith("; unread by mode=eval")  # training's schedule
    assert "unread" not in comments["n_samples_per_prompt: 1"]  # the evaluation's own
    status, out, _ = run_main(["show", *TINY, "--only", "recipe.eval"], capsys)
    assert status == 0 and "unread" not in out  # training reads it all


def test_plan_is_the_launchers_plan_mode(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_main(["plan", *TINY, "plan.format=json"], capsys)
    assert status == 0
    assert yaml.safe_load(out)["run"]["model"] == "qwen3-tiny"
    # a training's command line, mode=train in it, is planned: the verb's mode=plan stands
    # for it, not a second value of the key
    status, out, _ = run_main(["plan", *TINY, "mode=train", "plan.format=json"], capsys)
    assert status == 0 and yaml.safe_load(out)["run"]["model"] == "qwen3-tiny"


def test_plan_of_an_evaluation_is_the_evaluations(capsys: pytest.CaptureFixture[str]) -> None:
    """`rlpost plan mode=eval` shows the evaluation's sets and no training batch, where the
    mode=plan it appends made it the training run's plan."""
    status, out, err = run_main(["plan", *GPU_RUN, "mode=eval"], capsys)
    assert status == 0, err
    assert "Evaluation sets" in out and "Batch arithmetic" not in out
    assert "  aime  " in out and "mode=eval trains nothing" in out
    assert "Train ranks (mode=eval)" in out and "Trainer work per rollout" not in out
    status, out, _ = run_main(["plan", *GPU_RUN], capsys)
    assert status == 0 and "Batch arithmetic" in out and "Evaluation sets" not in out
    assert "Trainer work per rollout" in out and "Train ranks (mode=eval)" not in out


TRAINING_ONLY_WORDS = (
    "shared by training and rollout",
    "trainer: ",
    "trainer residue",
    "trainer rendezvous",
    "offloaded optimizer",
    "reference weights",
    "rollout GPUs",
    "rollout: fits",
    "training, per GPU",
    "time per rollout",
    "the rollout table",
)


@pytest.mark.parametrize(
    "run",
    [TINY, GPU_RUN, (*GPU_RUN, "model.load=/ckpt/4b")],
    ids=["cpu", "h100x8", "h100x8 of a checkpoint"],
)
def test_an_evaluations_plan_speaks_of_no_training(
    run: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    """An evaluation does not train: its plan's header, placement, engines and memory speak
    of the engines and of train ranks that send the weights or do not start, never of
    training and rollout sharing GPUs, a trainer's residue or an optimizer; a training
    plan's wording is as it was."""
    status, out, err = run_main(["plan", *run, "mode=eval"], capsys)
    assert status == 0, err
    assert [w for w in TRAINING_ONLY_WORDS if w in out] == []
    assert "colocated (mode=eval): " in out and "engines: fits" in out
    status, out, err = run_main(["plan", *run], capsys)
    assert status == 0, err
    assert "shared by training and rollout" in out and "trainer residue" in out


def test_plan_of_an_evaluation_prints_as_json_too(capsys: pytest.CaptureFixture[str]) -> None:
    """plan.format=json, which the evaluation's launch itself refuses as unread, is the
    plan verb's to read: the evaluation's plan as JSON, its sets under "evaluation"."""
    status, out, err = run_main(["plan", *GPU_RUN, "mode=eval", "plan.format=json"], capsys)
    assert status == 0, err
    assert [s["name"] for s in json.loads(out)["evaluation"]] == ["aime"]
    status, out, err = run_main(["plan", *GPU_RUN, "mode=eval", "plan.format=script"], capsys)
    assert status == 2 and "plan.format" in err and "'script'" in err and "fix:" in err


def test_plan_of_an_experiment_file_that_sets_mode_eval_is_the_evaluations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An experiment file's `mode: eval` makes `rlpost plan` print the evaluation's plan, as
    mode=eval on the command line does (FILE.yaml and --config-dir/--config-name alike), and
    plan.format=json with it; mode=train after it is training's plan."""
    exp = tmp_path / "my_eval.yaml"
    exp.write_text("defaults:\n  - config\n  - _self_\nmode: eval\n")
    by_name = ["--config-dir", str(tmp_path), "--config-name", "my_eval"]
    for target in ([str(exp)], by_name):
        status, out, err = run_main(["plan", *target], capsys)
        assert status == 0, err
        assert "Evaluation sets" in out and "Batch arithmetic" not in out
    status, out, err = run_main(["plan", str(exp), "plan.format=json"], capsys)
    assert status == 0 and [s["name"] for s in json.loads(out)["evaluation"]] == ["arith"], err
    status, out, err = run_main(["plan", str(exp), "mode=train"], capsys)
    assert status == 0 and "Batch arithmetic" in out and "Evaluation sets" not in out, err


@pytest.mark.parametrize(
    ("verb", "why", "fix"),
    [
        ("plan", "rlpost plan prints one run's plan", "prints each job's plan"),
        ("validate", "rlpost validate checks one run", "checks and plans every job"),
        ("show", "rlpost show prints one run's config", "checks and plans every job"),
    ],
)
def test_a_verb_of_one_run_given_a_sweep_names_the_launch_that_plans_each_job(
    verb: str, why: str, fix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """rlpost plan, validate and show read one run: a sweep is told to plan and check its
    jobs with `launch.py -m mode=plan`, where the fix was `launch.py -m` alone, which runs
    them."""
    status, out, err = run_main([verb, *TINY, "recipe.optim.lr=1e-6,2e-6"], capsys)
    assert status == 2 and out == "" and "Traceback" not in err
    assert f"is a sweep, one run per value, and {why}" in err
    assert f"python launch.py -m mode=plan recipe.optim.lr=1e-6,2e-6 {fix}" in err
    assert "add -m to launch" not in err


def test_new_recipe_writes_only_the_differences(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "new",
        "recipe",
        "short",
        "--from",
        "grpo_dapo",
        "rollout.max_response_len=2048",
        "recipe.optim.lr=1e-6",
        "--config-dir",
        str(tmp_path),
    ]
    status, out, _ = run_main(argv, capsys)
    assert status == 0 and "1 change(s) equal to grpo_dapo's were left out" in out
    # the command it names (in its output and the file's comment) finds the recipe
    show = f"rlpost show --config-dir {tmp_path} recipe=short model=... hardware=..."
    assert f"see it whole: {show}\n" in out
    assert f"# with `{show}`)." in (tmp_path / "recipe" / "short.yaml").read_text()
    filled = show.removeprefix("rlpost ").replace("model=...", "model=qwen3-4b")
    status, out, err = run_main(filled.replace("hardware=...", "hardware=h100x8").split(), capsys)
    assert status == 0 and "max_response_len: 2048" in out, err
    written = yaml.safe_load((tmp_path / "recipe" / "short.yaml").read_text())
    assert written == {
        "defaults": ["grpo_dapo", "_self_"],
        "name": "short",
        "description": "grpo_dapo with rollout.max_response_len=2048",
        "rollout": {"max_response_len": 2048},
    }
    status, out, _ = run_main(
        [
            "validate",
            "--no-local-checks",
            "--config-dir",
            str(tmp_path),
            "recipe=short",
            "model=qwen3-4b",
            "hardware=h100x8",
        ],
        capsys,
    )
    assert status == 0 and "recipe=short" in out


def test_new_recipe_checks_keys_values_and_the_base(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["new", "recipe", "x", "--config-dir", str(tmp_path)]
    status, _, err = run_main([*base, "--from", "grpo_dapo", "rollout.temprature=0.5"], capsys)
    assert status == 2 and "Did you mean 'temperature'?" in err
    status, _, err = run_main([*base, "--from", "grpo_dapo", "train.global_batch_size=100"], capsys)
    assert status == 2 and "(command line: train.global_batch_size=100)" in err
    status, _, err = run_main([*base, "--from", "grpo_dap"], capsys)
    assert status == 2 and "Did you mean 'grpo_dapo'?" in err
    assert not (tmp_path / "recipe").exists()


def test_new_recipe_takes_the_last_of_a_key_given_two_values_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As on the launcher's command line; the file held the last without a word."""
    base = ["new", "recipe", "x", "--config-dir", str(tmp_path), "--from", "grpo_dapo"]
    twice = ["rollout.temperature=0.7", "recipe.rollout.temperature=0.8"]
    status, _, err = run_main([*base, *twice], capsys)
    assert status == 0
    assert (
        "rollout.temperature is given twice, rollout.temperature=0.7 and then "
        "recipe.rollout.temperature=0.8: the recipe holds the last" in err
    )
    text = (tmp_path / "recipe" / "x.yaml").read_text()
    assert "temperature: 0.8" in text and "temperature: 0.7" not in text
    status, _, err = run_main(
        [*base, "--force", "rollout.temperature=0.7", "rollout.temperature=0.7"], capsys
    )
    assert status == 0 and "given twice" not in err
    assert (tmp_path / "recipe" / "x.yaml").read_text().count("temperature: 0.7") == 1


def test_new_recipe_makes_a_config_dir_not_there_yet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rlpost new` writes into --config-dir, and makes it when it is not there, as `rlpost
    new model` does; a file given as the folder is refused."""
    user = tmp_path / "mine"
    argv = ["new", "recipe", "r1", "--from", "grpo_tiny_math", "--config-dir", str(user)]
    status, out, err = run_main(argv, capsys)
    assert status == 0, err
    assert (user / "recipe" / "r1.yaml").is_file() and f"wrote {user}" in out
    check = ["validate", "--no-local-checks", "--config-dir", str(user), "recipe=r1"]
    status, out, err = run_main([*check, "model=qwen3-tiny", "hardware=cpu"], capsys)
    assert status == 0, err
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    status, _, err = run_main([*argv[:-1], str(a_file)], capsys)
    assert status == 2 and "is not a directory" in err


def test_new_refuses_to_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["new", "recipe", "copy", "--from", "grpo_dapo", "--config-dir", str(tmp_path)]
    assert run_main(argv, capsys)[0] == 0
    status, _, err = run_main(argv, capsys)
    assert status == 2 and "already exists" in err and "--force" in err
    assert run_main([*argv, "--force"], capsys)[0] == 0


def test_an_unknown_command_suggests_the_right_one(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run_main(["vaildate"], capsys)
    assert status == 2 and "Did you mean 'validate'?" in err


def test_the_command_validates_a_run_file_end_to_end() -> None:
    result = rlpost("validate", "--no-local-checks", str(EXAMPLES / "qwen3_8b_a100x4.yaml"))
    assert result.returncode == 0, result.stderr
    assert "layout qwen3-8b_a100x4" in result.stdout


def test_the_command_exits_2_without_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "recipe").mkdir()
    (tmp_path / "recipe" / "r.yaml").write_text("defaults:\n  - grpo_dap\n  - _self_\n")
    result = rlpost("validate", str(tmp_path / "recipe" / "r.yaml"))
    assert result.returncode == 2
    assert "Did you mean 'grpo_dapo'?" in result.stderr and "Traceback" not in result.stderr


def test_import_slime_reads_slimes_own_script(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slime = REPO / "tests" / "fixtures" / "slime"
    argv = ["import", "slime", str(slime / "scripts" / "run-qwen3-32B.sh"), "--out", str(tmp_path),
            "--slime-dir", str(slime), "--env", "BASE_DIR=/data"]  # fmt: skip
    status, out, _ = run_main(argv, capsys)
    assert status == 0
    assert "wrote" in out and "model=qwen3-32b" in out  # drawn from slime's MODEL_ARGS
    assert "pkill -9 python" in out  # recorded, not run
    assert "NCCL_NVLS_ENABLE=1" in out  # the job's environment, listed


def test_import_slime_refuses_an_sft_script_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = REPO / "tests" / "fixtures" / "slime" / "scripts" / "run-qwen3-4B-base-sft.sh"
    status, _, err = run_main(["import", "slime", str(script), "--out", str(tmp_path)], capsys)
    assert status != 0 and "supervised fine-tuning" in err and "Traceback" not in err


def test_a_refused_import_names_the_scripts_flag_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--rm-type ifbench imports to a reward type rlpost refuses: the refusal names the script
    and the flag with its value (not the recipe the import would write), and --out is left as
    it was, an earlier import's files included."""
    script = tmp_path / "run.sh"
    script.write_text(
        "source scripts/models/qwen3-4B.sh\n"
        "python3 train.py ${MODEL_ARGS[@]} --actor-num-nodes 1 --actor-num-gpus-per-node 8 "
        "--colocate --hf-checkpoint /models/Qwen3-4B --prompt-data /data/math.jsonl "
        "--label-key label --num-rollout 10 --rollout-batch-size 8 --n-samples-per-prompt 8 "
        "--global-batch-size 64 --rollout-max-response-len 1024 --rm-type ifbench\n"
    )
    out = tmp_path / "imported"
    status, _, err = run_main(["import", "slime", str(script), "--out", str(out)], capsys)
    assert status == 2 and "Traceback" not in err
    assert f"--rm-type = 'ifbench'   ({script})" in err
    assert "imported as recipe.rollout.reward.type: reward type 'ifbench' is not available" in err
    assert "fix: change --rm-type in the script" in err
    assert "recipe/run.yaml" not in err and f"nothing was written to {out}" in err
    assert not out.exists()
    (out / "recipe").mkdir(parents=True)
    (out / "recipe" / "run.yaml").write_text("name: run\n")  # an earlier import's
    status, _, _ = run_main(["import", "slime", str(script), "--out", str(out)], capsys)
    assert status == 2
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        "recipe",
        "recipe/run.yaml",
    ]
    assert (out / "recipe" / "run.yaml").read_text() == "name: run\n"


def test_import_slime_without_a_script_says_so_and_shows_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, _, err = run_main(["import", "slime"], capsys)
    assert status == 2 and "Traceback" not in err and "None" not in err
    assert "the slime launch script to import is missing" in err
    assert "rlpost import slime SCRIPT.sh [--out DIR]" in err


def test_each_commands_usage_line_names_its_required_flags() -> None:
    """`rlpost --help` opens with a line per command: every flag a command requires is on it."""
    import argparse

    from rlpost.cli import main as cli_main

    usage = [line.strip() for line in (cli_main.__doc__ or "").splitlines()]
    for name, verb in cli_main.verbs().items():
        parser = argparse.ArgumentParser()
        verb.add_arguments(parser)
        required = [a.option_strings[0] for a in parser._actions if a.required and a.option_strings]
        line = next(line for line in usage if line.startswith(f"rlpost {name} "))
        assert all(flag in line for flag in required), (name, required, line)


def test_the_usage_lines_name_every_option_and_subcommand_of_the_config_verbs() -> None:
    """`rlpost --help`'s lines for the verbs a new user starts with (checking, showing,
    planning, importing) and `cluster` name every option and subcommand each takes but
    --config-name (its own help says it)."""
    from rlpost.cli import main as cli_main

    doc = " ".join((cli_main.__doc__ or "").split())
    for name in ("ls", "validate", "show", "plan", "import", "cluster"):
        parser = argparse.ArgumentParser()
        cli_main.verbs()[name].add_arguments(parser)
        words = [
            option
            for action in parser._actions
            for option in (
                list(action.choices)
                if isinstance(action, argparse._SubParsersAction)
                else [o for o in action.option_strings if o.startswith("--")][:1]
            )
        ]
        lines = [part for part in doc.split("rlpost ")[1:] if part.startswith(f"{name} ")]
        missing = [w for w in words if w not in ("--help", "--config-name")]
        missing = [w for w in missing if not any(w in line for line in lines)]
        assert not missing, (name, missing)


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """`parser` and every subcommand's parser under it, nested ones included."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found += _parsers(child)
    return found


def test_every_command_prints_its_help() -> None:
    # argparse expands %-formats in help texts: a bare "90%" made `rlpost kuberay --help`
    # end in a TypeError
    parsers = _parsers(build_parser(verbs()))
    assert any(p.prog == "rlpost kuberay" for p in parsers)
    for parser in parsers:
        assert parser.format_help()
    assert "90% of the profile's node" in " ".join(
        next(p for p in parsers if p.prog == "rlpost kuberay").format_help().split()
    )


def test_a_run_directorys_config_yaml_is_refused_rather_than_read_as_the_shipped_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a run's config.yaml has the shipped primary config's name: Hydra would read conf/'s
    run = tmp_path / "exp1"
    run.mkdir()
    (run / "config.yaml").write_text("defaults:\n  - config\n  - _self_\nrun:\n  seed: 7\n")
    for verb in ("validate", "show"):
        status, out, err = run_main([verb, str(run / "config.yaml")], capsys)
        assert status == 2 and not out, out
        assert f"FILE = '{run / 'config.yaml'}'" in err and "conf/config.yaml" in err
        assert f"cp {run / 'config.yaml'} exp1_config.yaml" in err
    copy = tmp_path / "exp1_config.yaml"
    copy.write_text((run / "config.yaml").read_text())
    status, out, err = run_main(["show", str(copy), "--only", "run.seed"], capsys)
    assert status == 0 and "7" in out and str(copy) in out, err


@pytest.mark.parametrize("verb", ["show", "validate"])
def test_a_run_directory_given_for_a_config_is_refused_with_rlpost_status_in_the_fix(
    verb: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run's folder, or the config.yaml a launch wrote there, where a config is composed:
    refused as before, and the fix names `rlpost status RUN_DIR`, what answers a question
    about a run; a config.yaml outside a run directory is refused without it."""
    run_dir = tmp_path / "exp1"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("mode: train\n")
    (run_dir / "launches.jsonl").write_text("")
    for target in (str(run_dir), str(run_dir / "config.yaml")):
        status, _, err = run_main([verb, target], capsys)
        assert status == 2 and "Traceback" not in err, err
        assert f"rlpost status {run_dir}" in err and "cp " in err, err
    (run_dir / "launches.jsonl").unlink()
    status, _, err = run_main([verb, str(run_dir / "config.yaml")], capsys)
    assert status == 2 and "read in place of this one" in err and "rlpost status" not in err
