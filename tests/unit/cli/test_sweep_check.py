"""A sweep's jobs are each checked, before the first starts, as a single launch checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlpost.cli.sweep_check import check_sweep, sweep_jobs
from rlpost.config.overrides import prepare_argv
from rlpost.errors import UserError


def test_sweep_jobs_are_numbered_as_hydra_numbers_them() -> None:
    jobs = sweep_jobs(["a=1,2", "b=x,y", "c=3"])
    assert [(j.num, j.overrides) for j in jobs] == [
        (0, ["a=1", "b=x", "c=3"]),
        (1, ["a=1", "b=y", "c=3"]),
        (2, ["a=2", "b=x", "c=3"]),
        (3, ["a=2", "b=y", "c=3"]),
    ]


def test_a_bad_job_is_named_by_its_own_overrides() -> None:
    argv = prepare_argv(["-m", "recipe.rollout.temperature=0.8,-1,-2", "recipe.optim.lr=1e-5"])
    with pytest.raises(UserError) as caught:
        check_sweep(argv)
    issues = caught.value.issues
    assert [i.message.split(":", 1)[0] for i in issues] == [
        "in job 1 (recipe.rollout.temperature=-1)",
        "in job 2 (recipe.rollout.temperature=-2)",
    ]
    assert all(i.key == "recipe.rollout.temperature" and "must be > 0" in i.message for i in issues)


def test_a_problem_of_every_job_is_reported_once() -> None:
    argv = prepare_argv(["-m", "recipe.optim.lr=1e-5,2e-5", "recipe.rollout.top_p=2"])
    with pytest.raises(UserError) as caught:
        check_sweep(argv)
    (issue,) = caught.value.issues
    assert issue.key == "recipe.rollout.top_p"
    assert issue.message.startswith("in every job of the sweep (2):")


def test_a_good_sweep_passes_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    check_sweep(
        prepare_argv(["-m", "recipe.rollout.temperature=0.8,1.0", "run.dir=r/${hydra:job.num}"])
    )
    check_sweep(prepare_argv(["recipe.rollout.temperature=-1"]))  # no sweep: the job checks
    assert list(tmp_path.iterdir()) == []


def test_a_training_jobs_preflight_is_checked_too(tmp_path: Path) -> None:
    """What a training launch checks on this machine (here: a prompt file that is not there)
    refuses the job before the sweep starts, as it would refuse a single launch."""
    data = "recipe.data.prompt_data"
    argv = prepare_argv(["-m", f"{data}={tmp_path / 'a.jsonl'},{tmp_path / 'b.jsonl'}"])
    with pytest.raises(UserError) as caught:
        check_sweep(argv)
    assert [i.key for i in caught.value.issues] == [data, data]
    assert [i.message.split(" (")[0] for i in caught.value.issues] == ["in job 0", "in job 1"]


def test_jobs_that_share_a_run_dir_or_wandb_run_set_in_a_file_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command line's literal run.dir and run_id are refused as the argv is read; these
    come from an experiment file, and only the composed jobs show that they are one value."""
    monkeypatch.chdir(tmp_path)
    conf = tmp_path / "conf"
    (conf / "experiment").mkdir(parents=True)
    (conf / "experiment" / "fixed.yaml").write_text(
        "# @package _global_\n"
        "run:\n  dir: runs/fixed\n"
        "tracking:\n  wandb:\n    enabled: true\n    run_id: fixed-run\n"
    )
    argv = prepare_argv(
        ["-m", f"--config-dir={conf}", "+experiment=fixed", "recipe.optim.lr=1e-5,2e-5"]
    )
    with pytest.raises(UserError) as caught:
        check_sweep(argv)
    issues = {i.key: i for i in caught.value.issues}
    assert set(issues) == {"run.dir", "tracking.wandb.run_id"}
    assert issues["run.dir"].value == str(tmp_path / "runs/fixed")
    assert issues["tracking.wandb.run_id"].value == "fixed-run"
    for issue in issues.values():
        assert issue.message.startswith(
            "job 0 (recipe.optim.lr=1e-05), job 1 (recipe.optim.lr=2e-05) share this value:"
        )
        assert "${hydra:job.num}" in issue.fix
        assert "fixed.yaml" in issue.render()

    own = ["-m", f"--config-dir={conf}", "+experiment=fixed", "recipe.optim.lr=1e-5,2e-5"]
    check_sweep(
        prepare_argv(
            [*own, "run.dir=runs/r${hydra:job.num}", "tracking.wandb.run_id=r${hydra:job.num}"]
        )
    )
    assert list(tmp_path.iterdir()) == [conf]
