"""The preflight's look at what run.dir already holds: a folder of someone's own is refused
before the launch writes its config.yaml, provenance.json and metrics.jsonl over theirs; a
run's own directory, however its last launch ended, is taken."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlpost.config.loader import compose_run_config
from rlpost.errors import Issue
from rlpost.plan import build_plan
from rlpost.preflight.run_dir import check_run_dir
from rlpost.runtime.rundir import LOCK_FILE, foreign_entries, prepare_run_dir


def run_dir_issues(run_dir: Path, *overrides: str) -> list[Issue]:
    cfg = compose_run_config([f"run.dir={run_dir}", *overrides])[0]
    return check_run_dir(cfg, build_plan(cfg))


def test_a_folder_of_the_users_own_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    own = tmp_path / "proj"
    own.mkdir()
    (own / "config.yaml").write_text("mine: true\n")
    (own / "metrics.jsonl").write_text('{"mine": 1}\n')
    for overrides in ((), ("run.resume=auto",)):
        (issue,) = run_dir_issues(own, *overrides)
        assert issue.key == "run.dir" and issue.value == str(own)
        assert issue.message.startswith(f"{own} holds config.yaml, metrics.jsonl; it is no run's")
        assert "launches.jsonl and provenance.json" in issue.message
        assert issue.fix.startswith("choose a new or empty folder, or the run's own folder")
    assert sorted(p.name for p in own.iterdir()) == ["config.yaml", "metrics.jsonl"]
    assert (own / "config.yaml").read_text() == "mine: true\n"


def test_a_source_folder_is_refused_naming_a_few_of_its_entries(tmp_path: Path) -> None:
    for name in ("a.py", "b.py", "c.py", "d.py", "e.py", "f.py"):
        (tmp_path / name).write_text("")
    (issue,) = run_dir_issues(tmp_path)
    assert f"{tmp_path} holds a.py, b.py, c.py, d.py and 2 more;" in issue.message


@pytest.mark.parametrize("resume", [None, "auto"])
def test_a_runs_own_directory_is_taken_however_its_launch_ended(
    tmp_path: Path, resume: str | None
) -> None:
    """What every launch writes before anything else marks the folder as a run's: one that
    finished, failed, was stopped or refused after writing them holds at least these (and
    whatever the user added since)."""
    resume_args = () if resume is None else (f"run.resume={resume}",)
    run_dir = tmp_path / "run"
    cfg = compose_run_config([f"run.dir={run_dir}"])[0]
    prepare_run_dir(cfg)
    (run_dir / "metrics.jsonl").write_text('{"rollout_id": 0}\n')
    (run_dir / "notes.txt").write_text("lr too high?\n")
    assert run_dir_issues(run_dir, *resume_args) == []
    moved = tmp_path / "moved"  # checkpoints copied into a folder of their own
    (moved / "ckpt" / "rollout_4").mkdir(parents=True)
    assert run_dir_issues(moved, *resume_args) == []


def test_a_new_an_empty_or_a_claimed_folder_is_taken(tmp_path: Path) -> None:
    assert run_dir_issues(tmp_path / "new") == []
    assert foreign_entries(tmp_path / "new") == []
    assert run_dir_issues(tmp_path) == []
    (tmp_path / LOCK_FILE).write_text("123\n")  # the launcher's claim on Hydra's job folder
    assert run_dir_issues(tmp_path) == []


def test_a_resume_target_the_launch_would_refuse_is_refused_by_validation(
    tmp_path: Path,
) -> None:
    hf_folder = Path(__file__).resolve().parents[3] / "rlpost" / "assets" / "qwen3-tiny"
    unfinished = tmp_path / "old" / "ckpt" / "rollout_4"  # a save that wrote no manifest
    unfinished.mkdir(parents=True)
    for target, says in (
        (hf_folder, f"{hf_folder} holds no complete checkpoint"),
        (unfinished, "no manifest.json: the save did not finish"),
    ):
        (issue,) = run_dir_issues(tmp_path / "new", f"run.resume={target}")
        assert issue.key == "run.resume" and issue.value == str(target)
        assert issue.message.startswith("cannot resume from it:") and says in issue.message
        assert "run.resume=auto" in issue.fix


def test_an_evaluations_resume_target_is_refused_with_a_fix_it_can_take(tmp_path: Path) -> None:
    """mode=eval refuses run.resume=auto, so its fix offers model.load's weights instead."""
    (tmp_path / "old" / "ckpt").mkdir(parents=True)
    for target, says in (
        (tmp_path / "nowhere", "no such checkpoint or run directory on this machine"),
        (tmp_path / "old", "holds no complete checkpoint"),
    ):
        (issue,) = run_dir_issues(tmp_path / "new", "mode=eval", f"run.resume={target}")
        assert issue.key == "run.resume" and issue.value == str(target) and says in issue.message
        assert "run.resume=auto" not in issue.fix
        assert issue.fix.endswith(
            "or remove run.resume to evaluate model.load (else model.hf_checkpoint)"
        )
