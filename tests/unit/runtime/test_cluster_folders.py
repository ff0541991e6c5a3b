"""Folders the ranks and engines of every node read (the model's, a checkpoint to resume
from): checked on each node of a cluster before anything loads from them
(`Cluster.check_seen`), as the run directory is (`Cluster.check_shared`)."""

from __future__ import annotations

from pathlib import Path

from rlpost.config.loader import compose_run_config
from rlpost.errors import UserError
from rlpost.plan import build_plan
from rlpost.runtime.cluster import unseen_issues
from rlpost.runtime.session import Session


def session(tmp_path: Path, *overrides: str, resume_from: Path | None = None) -> Session:
    cfg, _ = compose_run_config([f"run.dir={tmp_path / 'run'}", *overrides])
    return Session(cfg, build_plan(cfg), tmp_path / "run", resume_from=resume_from)


def test_the_models_folders_and_a_checkpoint_from_elsewhere_are_checked(tmp_path: Path) -> None:
    ref = tmp_path / "ref"
    elsewhere = tmp_path / "other_run" / "ckpt" / "rollout_4"
    folders = session(
        tmp_path,
        f"model.ref_load={ref}",
        "recipe.algo.use_kl_loss=true",
        "recipe.algo.kl_loss_coef=0.01",
        resume_from=elsewhere,
    )._read_on_every_node()
    assert set(folders) == {"model.hf_checkpoint", "model.ref_load", "run.resume"}
    assert folders["model.ref_load"] == str(ref) and folders["run.resume"] == str(elsewhere)


def test_a_reference_no_one_reads_and_the_runs_own_checkpoint_are_not(tmp_path: Path) -> None:
    """As the preflight: the reference only where the recipe reads it; the run directory's
    own checkpoints are checked with the run directory."""
    own = tmp_path / "run" / "ckpt" / "rollout_4"
    folders = session(
        tmp_path, f"model.ref_load={tmp_path / 'ref'}", resume_from=own
    )._read_on_every_node()
    assert set(folders) == {"model.hf_checkpoint"}


def test_a_folder_a_node_cannot_see_is_refused_naming_the_node_and_the_key() -> None:
    issues = unseen_issues(
        {"model.hf_checkpoint": "/local/qwen3-4b", "run.resume": "/shared/ckpt/rollout_4"},
        {"model.hf_checkpoint": ["10.0.0.2", "10.0.0.3"], "run.resume": []},
    )
    text = UserError(issues).render()
    assert [i.key for i in issues] == ["model.hf_checkpoint"]
    assert "model.hf_checkpoint = '/local/qwen3-4b'" in text
    assert "node(s) 10.0.0.2, 10.0.0.3 cannot see it" in text
    assert "put it on storage every node mounts at the same path" in text
