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
