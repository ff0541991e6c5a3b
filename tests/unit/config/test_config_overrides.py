"""Command-line overrides are checked before Hydra runs: group choices, key paths, syntax."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlpost.config.loader import compose_run_config
from rlpost.config.overrides import (
    check_override,
    check_overrides,
    flags_first,
    parse_argv,
    prepare_argv,
    repeated_keys,
    search_roots,
)
from rlpost.config.sources import group_options
from rlpost.errors import Issue, UserError

ROOTS = search_roots()
REPO = Path(__file__).resolve().parents[3]


def only_issue(token: str) -> Issue:
    _, issues = check_override(token, ROOTS)
    assert len(issues) == 1, issues
    assert issues[0].location is not None and issues[0].location.override == token
    return issues[0]


def test_unknown_group_choice_suggests_and_lists_choices() -> None:
    issue = only_issue("model=glm4-9")
    assert issue.key == "model" and issue.value == "glm4-9"
    assert "Did you mean 'glm4-9b'?" in issue.message
    assert "qwen3-4b" in issue.fix and "glm4.7-flash" in issue.fix


def test_a_group_set_to_null_names_the_group_and_its_remedy() -> None:
    issue = only_issue("layout=null")
    assert issue.key == "layout" and "~layout" in issue.fix and "qwen3-tiny_cpu" in issue.fix
    # the remedy it names works: ~layout composes, validates and plans (a derived layout)
    from rlpost.config.loader import compose_run_config
    from rlpost.plan import plan_config

    run, _ = compose_run_config(["~layout"])
    assert plan_config(run)[1].derived
    for group in ("model", "recipe", "hardware"):
        issue = only_issue(f"{group}=null")
        assert issue.key == group and "~" not in issue.fix
        assert all(name in issue.fix for name in group_options(ROOTS, group))


def test_every_choice_of_a_sweep_is_checked() -> None:
    _, (issue,) = check_override("hardware=h100x8,h100x32", ROOTS, multirun=True)
    assert issue.value == "h100x32"
    assert check_override("hardware=h100x8,h100x64", ROOTS, multirun=True)[1] == []


@pytest.mark.parametrize(
    ("token", "one"),
    [
        ("recipe.train.global_batch_size=64,32", "(recipe.train.global_batch_size=64)"),
        ("model=qwen3-4b,qwen3-8b", "(model=qwen3-4b)"),
        ("recipe.optim.lr=interval(0.1,0.2)", "or give one value"),
    ],
)
def test_a_sweep_without_multirun_names_its_key_and_minus_m(token: str, one: str) -> None:
    issue = only_issue(token)
    key, values = token.split("=", 1)
    assert (issue.key, issue.value) == (key, values)
    assert f"python launch.py -m {token}" in issue.fix and issue.fix.endswith(one)
    assert check_override(token, ROOTS, multirun=True)[1] == []
    with pytest.raises(UserError, match="is a sweep"):
        prepare_argv([token])
    assert prepare_argv(["-m", token])[-1].endswith(token)


def test_unknown_key_suggests_the_sibling() -> None:
    issue = only_issue("recipe.rollout.temprature=0.8")
    assert issue.key == "recipe.rollout.temprature" and issue.value == 0.8
    assert "Did you mean 'temperature'?" in issue.message
    assert "recipe.rollout.temperature" in issue.fix


def test_misplaced_key_suggests_its_full_path() -> None:
    issue = only_issue("recipe.max_tokens_per_gpu=4096")
    assert "recipe.train.max_tokens_per_gpu" in issue.message


def test_adding_an_unknown_key_is_rejected_too() -> None:
    assert only_issue("+model.hiden_size=8").key == "model.hiden_size"


def test_key_below_a_value_is_rejected() -> None:
    issue = only_issue("layout.train.tp.size=2")
    assert "single value" in issue.message


def test_schema_keys_become_force_adds() -> None:
    # over_sampling_batch_size is not in grpo_dapo.yaml; the schema has it
    assert check_override("recipe.rollout.over_sampling_batch_size=64", ROOTS) == (
        "++recipe.rollout.over_sampling_batch_size=64",
        [],
    )
    # grpo_dapo.yaml sets top_k: Hydra's '+' would refuse to add it again
    assert check_override("+recipe.rollout.top_k=5", ROOTS) == ("++recipe.rollout.top_k=5", [])
    assert check_override("++recipe.rollout.top_k=5", ROOTS) == ("++recipe.rollout.top_k=5", [])
    assert check_override("~model.ref_load", ROOTS) == ("~model.ref_load", [])


def test_free_form_mappings_accept_any_subkey() -> None:
    form, issues = check_override("layout.rollout.sglang.any_option_name=1", ROOTS)
    assert issues == [] and form.startswith("++")
    assert check_override("recipe.eval.datasets.0.name=aime", ROOTS)[1] == []


def test_group_and_hydra_overrides_pass_unchanged() -> None:
    assert check_override("model=qwen3-4b", ROOTS) == ("model=qwen3-4b", [])
    assert check_override("hydra.run.dir=/tmp/x", ROOTS) == ("hydra.run.dir=/tmp/x", [])
    assert check_override("hydra/job_logging=disabled", ROOTS)[1] == []


def test_syntax_error_is_an_issue() -> None:
    issue = only_issue("recipe.rollout.stop=[")
    assert "cannot parse" in issue.message


def test_all_bad_overrides_are_reported_at_once() -> None:
    with pytest.raises(UserError) as caught:
        check_overrides(["model=glm4-9", "recipe=grpo", "recipe.rollout.temprature=1"], ROOTS)
    assert [i.key for i in caught.value.issues] == ["model", "recipe", "recipe.rollout.temprature"]
    assert "Did you mean 'grpo_dapo'?" in caught.value.issues[1].message


def test_a_key_given_two_values_on_one_command_line_takes_the_last_and_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Hydra keeps the last of the two without a word (a script's base arguments, then an
    experiment's own): the run takes the last, as Hydra does, and a note says which."""
    tokens = [
        "recipe.optim.lr=1e-6",
        "recipe=grpo_tiny_math",
        "recipe.optim.lr=2e-6",
        "recipe=grpo_tiny_calculator",
    ]
    assert len(check_overrides(tokens, ROOTS)) == 4  # nothing refused
    err = capsys.readouterr().err
    assert (
        "rlpost: note: recipe.optim.lr is given twice on the command line, recipe.optim.lr=1e-6 "
        "and then recipe.optim.lr=2e-6: the last is taken (recipe.optim.lr=2e-6)" in err
    )
    assert "recipe is given twice on the command line, recipe=grpo_tiny_math" in err
    check_overrides(tokens, ROOTS)  # said once a process
    assert capsys.readouterr().err == ""
    # a sweep given a value again, in any of Hydra's spellings of the key
    assert repeated_keys(["-m", "recipe.optim.lr=1e-6,1e-5", "++recipe.optim.lr=2e-6"]) == [
        "recipe.optim.lr is given twice on the command line, recipe.optim.lr=1e-6,1e-5 and "
        "then ++recipe.optim.lr=2e-6: the last is taken (recipe.optim.lr=2e-6)"
    ]


def test_the_composed_run_takes_the_last_of_a_key_given_twice() -> None:
    run, _ = compose_run_config(["recipe.optim.lr=1e-6", "recipe.optim.lr=2e-6"])
    assert run.recipe.optim.lr == 2e-6


def test_the_same_value_given_twice_changes_nothing_and_passes() -> None:
    """As when a resume's `run.dir=...` is added to the command that started the run."""
    tokens = ["run.dir=runs/a", "recipe.optim.lr=1e-6", "run.dir=runs/a", "recipe.optim.lr=1.0e-6"]
    assert len(check_overrides(tokens, ROOTS)) == 4
    assert repeated_keys(tokens) == []


def test_plan_mode_runs_in_place_unless_told_otherwise() -> None:
    assert prepare_argv(["mode=plan"])[-1] == "hydra.run.dir=."
    assert "hydra.run.dir=." not in prepare_argv(["mode=train"])
    assert "hydra.run.dir=." not in prepare_argv(["-m", "mode=plan"])
    assert prepare_argv(["mode=plan", "hydra.run.dir=out"]).count("hydra.run.dir=.") == 0


def test_help_is_left_to_hydra_and_cfg_is_checked() -> None:
    assert prepare_argv(["--help"]) == ["--help"]
    assert parse_argv(["--hydra-help", "model=x"]).informational
    with pytest.raises(UserError):
        prepare_argv(["--cfg", "job", "model=glm4-9"])
    assert prepare_argv(["--info", "defaults", "model=glm4-9b"]) == [
        "--info",
        "defaults",
        "model=glm4-9b",
    ]


def test_config_dir_adds_group_choices(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "my-model.yaml").write_text("name: my-model\n")
    roots = search_roots(config_dir=str(tmp_path))
    assert "my-model" in group_options(roots, "model")
    with pytest.raises(UserError) as caught:
        prepare_argv(["--config-dir", str(tmp_path), "model=my-modle"])
    assert "Did you mean 'my-model'?" in caught.value.issues[0].message
    assert prepare_argv(["-cd", str(tmp_path), "model=my-model"]) == [
        "-cd",
        str(tmp_path),
        "model=my-model",
    ]


WANDB = ["tracking.wandb.enabled=true", "tracking.wandb.mode=online"]


def test_the_wandb_run_id_per_job_the_refusal_names_resolves_per_job(tmp_path: Path) -> None:
    """${hydra:job.num} in the run id resolves through the loader to each job's number."""
    argv = ["-m", "recipe.optim.lr=1e-4,2e-4", *WANDB, "mode=slime_args"]
    argv.append("tracking.wandb.run_id=grpo-lr-sweep-${hydra:job.num}")
    done = subprocess.run(
        [sys.executable, str(REPO / "launch.py"), *argv],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    ids = re.findall(r"--wandb-run-id (\S+)", done.stdout)
    assert ids == ["grpo-lr-sweep-0", "grpo-lr-sweep-1"], done.stdout[-2000:]


def test_a_list_entry_past_the_end_names_its_key_and_the_whole_list() -> None:
    from rlpost.config.loader import compose_run_config

    token = "recipe.eval.datasets.1.path=/x.jsonl"
    with pytest.raises(UserError) as composed:
        compose_run_config([token])
    with pytest.raises(UserError) as launched:
        prepare_argv([token])
    for caught in (composed, launched):
        (issue,) = caught.value.issues
        assert (issue.key, issue.value) == ("recipe.eval.datasets.1.path", "/x.jsonl")
        assert "recipe.eval.datasets has 1 entry, so there is no entry 1" in issue.message
        assert issue.fix == (
            "write the whole list: "
            "recipe.eval.datasets='[{name: ..., path: ...}, {name: ..., path: ...}]'"
        )
    assert check_override("recipe.eval.datasets.0.path=/x.jsonl", ROOTS)[1] == []


def test_a_sweep_checks_list_entries_for_each_choice_that_shapes_the_list() -> None:
    """Under -m the entry is checked once per distinct set of group choices and list
    overrides, before any job starts (the swept learning rate changes no list); before, a
    sweep got Hydra's bare 'list index out of range'."""
    past_end = ["-m", "recipe.optim.lr=1e-6,2e-6", "recipe.eval.datasets.1.name=x", "mode=plan"]
    with pytest.raises(UserError) as caught:
        prepare_argv(past_end)
    (issue,) = caught.value.issues
    assert issue.key == "recipe.eval.datasets.1.name"
    assert "has 1 entry, so there is no entry 1" in issue.message
    prepare_argv(["-m", "recipe.optim.lr=1e-6,2e-6", "recipe.eval.datasets.0.name=x"])


def test_deleting_a_key_the_composed_config_does_not_hold_names_it() -> None:
    """glm4-9b's layout on h100x8 sets no SGLang options: `~layout.rollout.sglang` has
    nothing to delete, which Hydra says only when it merges, under no key."""
    from rlpost.config.loader import compose_run_config

    args = ["model=glm4-9b", "recipe=grpo_dapo", "hardware=h100x8", "~layout.rollout.sglang"]
    for refuse in (compose_run_config, prepare_argv):
        with pytest.raises(UserError) as caught:
            refuse(args)
        (issue,) = caught.value.issues
        assert issue.key == "layout.rollout.sglang"
        assert "there is no layout.rollout.sglang to delete" in issue.message
        assert issue.fix.startswith("remove ~layout.rollout.sglang")
    prepare_argv(["~recipe.eval.interval"])  # a key the config holds


@pytest.mark.parametrize(
    ("argv", "ordered"),
    [
        (
            ["model=x", "--config-dir", "d", "recipe=y"],
            ["--config-dir", "d", "model=x", "recipe=y"],
        ),
        (["a=1,2", "-m", "b=3"], ["-m", "a=1,2", "b=3"]),
        (
            ["a=1", "--config-dir=d", "--info", "config", "b=2"],
            ["--config-dir=d", "--info", "config", "a=1", "b=2"],
        ),
        (["a=1", "--info", "b=2"], ["--info", "a=1", "b=2"]),  # --info's value is optional
        (["--lr", "1e-6", "a=1"], ["--lr", "1e-6", "a=1"]),  # not Hydra's: parse_argv answers it
        (["-cd", "d", "a=1"], ["-cd", "d", "a=1"]),
    ],
)
def test_hydras_flags_go_ahead_of_the_overrides(argv: list[str], ordered: list[str]) -> None:
    assert flags_first(argv) == ordered
