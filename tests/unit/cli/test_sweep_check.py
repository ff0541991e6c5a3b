"""A sweep's jobs are each checked, before the first starts, as a single launch checks."""

from __future__ import annotations

import os
import subprocess
import sys
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


REPO = Path(__file__).resolve().parents[3]
LR_SWEEP = ["-m", "recipe.optim.lr=1e-6,2e-6"]
WANDB = ["tracking.wandb.enabled=true", "tracking.wandb.mode=offline"]


def sweep_refusal(argv: list[str]) -> UserError:
    with pytest.raises(UserError) as refused:
        check_sweep(prepare_argv(argv))
    return refused.value


def test_jobs_that_share_a_run_dir_from_the_command_line_are_refused_before_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every job would run in the same directory: the second would be refused after the
    first had trained (or evaluated). A directory per job, a sweep of one job, a sweep of
    plans, or a single run is fine."""
    monkeypatch.chdir(tmp_path)
    (issue,) = sweep_refusal([*LR_SWEEP, "run.dir=runs/exp"]).issues
    shared = tmp_path / "runs" / "exp"
    assert (issue.key, issue.value) == ("run.dir", str(shared))
    assert str(issue.location) == "command line: run.dir=runs/exp"
    assert issue.message.startswith(
        "job 0 (recipe.optim.lr=1e-6), job 1 (recipe.optim.lr=2e-6) share this value: each "
        "job would run in this one directory"
    )
    assert f"run.dir='{shared}/${{hydra:job.num}}'" in issue.fix
    for fine in (
        [*LR_SWEEP, "run.dir=runs/exp/${hydra:job.num}"],
        ["-m", "recipe.optim.lr=1e-6", "run.dir=runs/a,runs/b"],
        ["-m", "recipe.optim.lr=1e-6", "run.dir=runs/exp"],
        [*LR_SWEEP, "run.dir=runs/exp", "mode=plan"],
        ["recipe.optim.lr=1e-6", "run.dir=runs/exp"],
    ):
        check_sweep(prepare_argv(fine))
    assert list(tmp_path.iterdir()) == []


def test_a_swept_run_dir_crossed_with_another_sweep_is_shared_by_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two run.dir values over two learning rates make four jobs: two in each directory."""
    monkeypatch.chdir(tmp_path)
    issues = sweep_refusal([*LR_SWEEP, "run.dir=runs/a,runs/b"]).issues
    assert [(i.key, i.value) for i in issues] == [
        ("run.dir", str(tmp_path / "runs" / "a")),
        ("run.dir", str(tmp_path / "runs" / "b")),
    ]
    assert issues[0].message.startswith("job 0 (recipe.optim.lr=1e-6 run.dir=runs/a), job 2")


def test_jobs_that_share_a_wandb_run_id_from_the_command_line_are_refused_before_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every job would resume the same wandb run and log from step 0, and wandb drops the
    steps below its last (https://github.com/wandb/wandb/issues/1450: 'User provided step:
    26500 is less than current step: 52501. Dropping entry'). An id per job, a swept id, a
    sweep of one job, a sweep of plans, or a single run is fine."""
    monkeypatch.chdir(tmp_path)
    sweep = [*LR_SWEEP, *WANDB]
    (issue,) = sweep_refusal([*sweep, "tracking.wandb.run_id=grpo-lr-sweep"]).issues
    assert (issue.key, issue.value) == ("tracking.wandb.run_id", "grpo-lr-sweep")
    assert str(issue.location) == "command line: tracking.wandb.run_id=grpo-lr-sweep"
    assert "wandb drops every step below the last one logged" in issue.message
    per_job = "tracking.wandb.run_id='grpo-lr-sweep-${hydra:job.num}'"
    assert per_job in issue.fix
    for fine in (
        [*sweep, per_job.replace("'", "")],
        ["-m", "recipe.optim.lr=1e-6", *WANDB, "tracking.wandb.run_id=a,b"],
        sweep,
        ["-m", "recipe.optim.lr=1e-6", *WANDB, "tracking.wandb.run_id=grpo-lr-sweep"],
        [*sweep, "tracking.wandb.run_id=grpo-lr-sweep", "mode=plan"],
        ["recipe.optim.lr=1e-6", *WANDB, "tracking.wandb.run_id=grpo-lr-sweep"],
    ):
        check_sweep(prepare_argv(fine))
    assert list(tmp_path.iterdir()) == []


def test_a_launch_of_jobs_sharing_a_run_dir_exits_2_before_anything_starts(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "launch.py"), *LR_SWEEP, "run.dir=runs/exp"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "run.dir = " in done.stderr and "share this value" in done.stderr
    assert "no job has started" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_jobs_that_share_a_run_dir_or_wandb_run_set_in_a_file_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Wherever the value was set: here an experiment file."""
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
            "job 0 (recipe.optim.lr=1e-5), job 1 (recipe.optim.lr=2e-5) share this value:"
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
