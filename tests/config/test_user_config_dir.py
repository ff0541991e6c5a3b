"""Configs kept outside the package: found, extended, validated and located like shipped ones.

A user folder (a recipe extending grpo_dapo, a 4-GPU hardware profile) is composed through
every entry point: `--config-dir` (compose_run_config and the launcher itself), a
`hydra.searchpath` in the user's primary config, and `rlpost validate FILE.yaml`. Errors in
the user's files name those files, with did-you-mean.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlpost.cli.main import main
from rlpost.cli.planning import plan_run
from rlpost.config.loader import compose_run_config
from rlpost.config.overrides import prepare_argv
from rlpost.errors import UserError

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "my_configs"

RECIPE = """\
# my_grpo: grpo_dapo with shorter responses
defaults:
  - grpo_dapo
  - _self_

name: my_grpo
description: grpo_dapo with 4k responses

rollout:
  max_response_len: 4096
  temperature: 0.8
"""
HARDWARE = """\
name: a100x4
description: one node of 4 x A100 80GB
kind: gpu
gpu_name: A100-SXM-80GB
num_nodes: 1
gpus_per_node: 4
gpu_memory_gib: 79.3
peak_bf16_tflops: 312
host_memory_gib: 1024
cpus_per_node: 64
"""
CHOICES = ("model=qwen3-4b", "recipe=my_grpo", "hardware=a100x4")


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "my_configs"
    (folder / "recipe").mkdir(parents=True)
    (folder / "hardware").mkdir()
    (folder / "recipe" / "my_grpo.yaml").write_text(RECIPE)
    (folder / "hardware" / "a100x4.yaml").write_text(HARDWARE)
    return folder


def errors_of(overrides: tuple[str, ...], **kwargs: object) -> UserError:
    with pytest.raises(UserError) as caught:
        compose_run_config(overrides, **kwargs)  # type: ignore[arg-type]
    return caught.value


def test_a_user_recipe_extends_a_shipped_one_and_plans_on_user_hardware(user_dir: Path) -> None:
    run, sources = compose_run_config(CHOICES, config_dir=user_dir)
    run, plan = plan_run(run, sources)
    assert run.recipe.rollout.max_response_len == 4096  # the user's value
    assert run.recipe.rollout.n_samples_per_prompt == 8  # grpo_dapo's, inherited
    assert plan.placement.train_gpus == 4 and plan.hardware == "a100x4"
    user_file = str(user_dir / "recipe" / "my_grpo.yaml")
    assert str(sources.get("recipe.rollout.temperature")) == f"{user_file}:11"
    shipped = Path(str(sources.get("recipe.rollout.top_p").file)).resolve()
    assert shipped == REPO / "conf" / "recipe" / "grpo_dapo.yaml"
    assert sources.get("hardware.gpus_per_node").file == str(user_dir / "hardware/a100x4.yaml")


def test_a_key_typo_in_the_user_file_names_that_file_and_the_fix(user_dir: Path) -> None:
    recipe = user_dir / "recipe" / "my_grpo.yaml"
    recipe.write_text(RECIPE.replace("temperature:", "temprature:"))
    issue = errors_of(CHOICES, config_dir=user_dir).issues[0]
    assert issue.key == "recipe.rollout.temprature"
    assert str(issue.location) == f"{recipe}:11"
    assert "Did you mean 'temperature'?" in issue.message


def test_a_misspelled_base_in_the_defaults_list_is_located_with_did_you_mean(
    user_dir: Path,
) -> None:
    recipe = user_dir / "recipe" / "my_grpo.yaml"
    recipe.write_text(RECIPE.replace("  - grpo_dapo", "  - grpo_dappo"))
    issue = errors_of(CHOICES, config_dir=user_dir).issues[0]
    assert str(issue.location) == f"{recipe}:3"
    assert issue.value == "grpo_dappo" and "Did you mean 'grpo_dapo'?" in issue.message


def test_broken_yaml_in_a_user_file_is_a_located_error(user_dir: Path) -> None:
    (user_dir / "hardware" / "a100x4.yaml").write_text(HARDWARE + "bad: [1, 2\n")
    issue = errors_of(CHOICES, config_dir=user_dir).issues[0]
    assert issue.location is not None
    assert issue.location.file == str(user_dir / "hardware" / "a100x4.yaml")
    assert "not valid YAML" in issue.message


@pytest.mark.parametrize(
    ("written_twice", "key", "lines", "fix"),
    [
        ("\nrollout:\n  top_p: 0.9\n", "rollout", (9, 13), "write rollout: once"),
        ("  temperature: 0.7\n", "rollout.temperature", (11, 12), "keep one of the two"),
    ],
    ids=["a section", "a value"],
)
def test_a_key_written_twice_in_a_user_file_names_both_lines(
    user_dir: Path, written_twice: str, key: str, lines: tuple[int, int], fix: str
) -> None:
    """Plain YAML keeps the last of the two without a word; the refusal names the file, the
    key and both lines, before Hydra runs (the launcher) and when composing (validate)."""
    recipe = user_dir / "recipe" / "my_grpo.yaml"
    recipe.write_text(RECIPE + written_twice)
    for refusal in (
        lambda: prepare_argv(["--config-dir", str(user_dir), *CHOICES, "mode=plan"]),
        lambda: compose_run_config(CHOICES, config_dir=user_dir),
    ):
        with pytest.raises(UserError) as caught:
            refusal()
        (issue,) = caught.value.issues
        assert issue.key == key and issue.location is not None
        assert (issue.location.file, issue.location.line) == (str(recipe), lines[1])
        assert f"written twice in {recipe}, at lines {lines[0]} and {lines[1]}" in issue.message
        assert issue.fix.startswith(fix)


def test_a_plan_error_points_into_the_user_file_after_hydra_has_closed(user_dir: Path) -> None:
    run, sources = compose_run_config(
        ("model=glm4.5-355b-a32b", "recipe=my_grpo", "hardware=a100x4"), config_dir=user_dir
    )
    with pytest.raises(UserError) as caught:
        plan_run(run, sources)  # the source map is built now, outside compose's Hydra context
    assert "layout.train.tp" in [i.key for i in caught.value.issues]
    assert sources.get("hardware.num_nodes").file == str(user_dir / "hardware/a100x4.yaml")


def test_a_user_primary_config_with_a_search_path_composes(user_dir: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs_dir"
    runs.mkdir()
    (runs / "my_run.yaml").write_text(
        "defaults:\n  - config\n  - override model: qwen3-4b\n  - override recipe: my_grpo\n"
        f"  - override hardware: a100x4\n  - _self_\n\nhydra:\n  searchpath:\n"
        f"    - file://{user_dir}\n"
    )
    run, _ = compose_run_config(["recipe.optim.lr=3e-6"], config_dir=runs, config_name="my_run")
    assert (run.recipe.name, run.hardware.name, run.recipe.optim.lr) == ("my_grpo", "a100x4", 3e-6)
    # the launcher's pre-check reads the same search path, so user groups are known to it
    argv = ["--config-dir", str(runs), "--config-name", "my_run", "recipe=my_grpo", "mode=plan"]
    assert prepare_argv(argv)[:5] == argv[:5]


def test_a_command_line_search_path_is_read_by_rlpost_commands_as_by_the_launcher(
    user_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`hydra.searchpath=[file://...]` on the command line, as Hydra users write it: the
    launcher composed it, and `rlpost validate` with the same words said no such recipe."""
    overrides = [*CHOICES, f"hydra.searchpath=[file://{user_dir}]"]
    assert prepare_argv([*overrides, "mode=plan"])[: len(overrides)] == overrides
    run, sources = compose_run_config(overrides)
    assert (run.recipe.name, run.hardware.name) == ("my_grpo", "a100x4")
    assert sources.get("recipe.rollout.temperature").file == str(user_dir / "recipe/my_grpo.yaml")
    main(["validate", "--no-local-checks", *overrides])  # a refusal exits 2
    assert capsys.readouterr().out.startswith("rlpost: OK  model=qwen3-4b recipe=my_grpo")


def test_the_launcher_reports_a_user_file_typo_before_hydra_runs(user_dir: Path) -> None:
    (user_dir / "recipe" / "my_grpo.yaml").write_text(RECIPE.replace("- grpo_dapo", "- grpo_dap"))
    with pytest.raises(UserError) as caught:
        prepare_argv(["--config-dir", str(user_dir), *CHOICES, "mode=plan"])
    assert "Did you mean 'grpo_dapo'?" in caught.value.issues[0].message


@pytest.mark.parametrize("flag_at", [0, 1], ids=["first", "among the overrides"])
def test_launch_py_plans_a_user_config_dir(user_dir: Path, flag_at: int) -> None:
    """--config-dir before the overrides or among them, as rlpost validate takes it."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [*CHOICES, "mode=plan"]
    argv[flag_at:flag_at] = ["--config-dir", str(user_dir)]
    result = subprocess.run(
        [sys.executable, "launch.py", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "recipe=my_grpo hardware=a100x4" in result.stdout


def test_an_export_with_a_config_dir_is_the_export_without(user_dir: Path, tmp_path: Path) -> None:
    """An export keeps run.dir null under Hydra's job too: the slime script of an imported
    config (which needs --config-dir) saves to ./slime/ as any other export, not to the
    folder it was exported in (which a second import made the run's run.dir)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, str(REPO / "launch.py"), "--config-dir", str(user_dir)]
    command += [*CHOICES[:2], "hardware=h100x8", "mode=slime_args"]
    export = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert export.returncode == 0, export.stderr[-2000:]
    assert "--save ./slime/" in export.stdout and str(tmp_path) not in export.stdout


def test_validate_refuses_a_user_file_shadowed_by_a_shipped_one(
    user_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shadowed = user_dir / "recipe" / "grpo_dapo.yaml"
    shadowed.write_text(RECIPE.replace("name: my_grpo", "name: grpo_dapo"))
    with pytest.raises(SystemExit) as caught:
        main(["validate", str(shadowed), "model=qwen3-4b", "hardware=a100x4"])
    assert caught.value.code == 2
    assert "would never be loaded" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        [
            "validate",
            "--no-local-checks",
            "--config-dir",
            str(EXAMPLES),
            "model=qwen3-8b",
            "recipe=my_grpo",
            "hardware=a100x4",
        ],
        ["validate", "--no-local-checks", str(EXAMPLES / "qwen3_8b_a100x4.yaml")],
        [
            "validate",
            "--no-local-checks",
            str(EXAMPLES / "recipe" / "my_grpo.yaml"),
            "model=qwen3-1.7b",
            "hardware=a100x4",
        ],
    ],
    ids=["config-dir", "run-file", "group-file"],
)
def test_the_worked_example_validates(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    main(argv)
    assert "rlpost: OK" in capsys.readouterr().out


def worked_example_commands() -> list[str]:
    """The `rlpost` lines of README's worked example ("Keeping recipes in your repo")."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## Keeping recipes in your repo", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    return [line for line in lines if line.startswith("rlpost ")]


def test_the_readmes_worked_example_runs_as_written_on_any_machine(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every `rlpost` line of the worked example does what it says here, where the example's
    checkpoints, data and GPUs are not: its validate lines say --no-local-checks."""
    import shlex

    monkeypatch.chdir(REPO)
    commands = worked_example_commands()
    assert sum(c.startswith("rlpost validate ") for c in commands) == 3, commands
    for command in commands:
        try:
            main(shlex.split(command)[1:])
        except SystemExit as exc:
            assert not exc.code, (command, capsys.readouterr().err[-2000:])
        if command.startswith("rlpost validate "):
            assert "rlpost: OK" in capsys.readouterr().out, command
