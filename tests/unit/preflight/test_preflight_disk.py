"""The preflight's look at run.dir's disk: saves that cannot all fit in its free space are
refused before anything starts, not found out at the first save that hits a full disk."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlpost.config.loader import compose_run_config
from rlpost.plan import Plan, build_plan
from rlpost.preflight import run_dir as preflight_module
from rlpost.preflight.run_dir import checkpoint_disk, checkpoint_disk_issues, saves_due
from rlpost.schema import RunConfig

GIB = 1024**3
QWEN4B = ("model=qwen3-4b", "recipe=grpo_dapo", "hardware=h100x8")  # 3000 rollouts, saves every 20


def planned(*overrides: str) -> tuple[RunConfig, Plan]:
    cfg = compose_run_config(list(overrides))[0]
    return cfg, build_plan(cfg)


@pytest.mark.parametrize(
    ("interval", "total", "saves"), [(None, 10, 0), (5, 10, 2), (3, 10, 4), (20, 10, 1)]
)
def test_a_save_every_interval_and_one_at_the_end(
    interval: int | None, total: int, saves: int
) -> None:
    assert saves_due(interval, total) == saves


@pytest.mark.parametrize(
    ("overrides", "bytes_per_param"),
    [
        ((), 2 + 4 + 8),  # megatron in bf16: weights, float32 master weights, two moments
        (("recipe.save.save_optimizer=false",), 2),
        (("model.params_dtype=fp32",), 4 + 8),  # the weights are the master weights
        (("trainer.backend=torch", "layout=auto"), 4 + 8),  # float32 shards and two moments
    ],
    ids=["megatron-bf16", "weights-only", "megatron-fp32", "torch"],
)
def test_a_checkpoint_holds_the_weights_and_the_optimizer_state(
    overrides: tuple[str, ...], bytes_per_param: int
) -> None:
    cfg, plan = planned(*QWEN4B, *overrides)
    need = checkpoint_disk(cfg, plan)
    assert need.checkpoint == plan.memory.params_total * bytes_per_param
    assert need.kept == cfg.recipe.save.keep_last + 1  # 150 saves; the new one before pruning
    assert need.hf_exports == 0


def test_saves_beyond_the_free_space_are_refused_with_their_figures_and_the_ways_out() -> None:
    cfg, plan = planned(*QWEN4B, "recipe.save.save_hf_interval=1000")
    need = checkpoint_disk(cfg, plan)
    assert need.hf_exports == 3 and need.hf_export == plan.memory.params_total * 2
    assert checkpoint_disk_issues(cfg, plan, need.total) == []
    (issue,) = checkpoint_disk_issues(cfg, plan, need.total - 1)
    assert issue.key == "run.dir"
    assert f"the run's saves need {need.total / GIB:,.1f} GiB" in issue.message
    assert f"4 checkpoint(s) of {need.checkpoint / GIB:,.1f} GiB at once" in issue.message
    assert "3 HF export(s)" in issue.message
    for fix in ("keep_last", "save_optimizer: false", "save_hf_interval", "larger disk"):
        assert fix in issue.fix


def test_the_run_dirs_disk_is_asked_by_the_preflight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, plan = planned(*QWEN4B, f"run.dir={tmp_path / 'run'}")
    asked: list[Path] = []

    def usage(path: Path) -> SimpleNamespace:
        asked.append(Path(path))
        return SimpleNamespace(total=10 * GIB, used=9 * GIB, free=1 * GIB)

    monkeypatch.setattr(shutil, "disk_usage", usage)
    (issue,) = preflight_module.check_run_dir(cfg, plan)
    assert asked == [tmp_path]  # the nearest folder that exists
    assert issue.key == "run.dir" and "its disk has 1.0 GiB free" in issue.message
    # the CPU default's saves are a few MB
    tiny, tiny_plan = planned(f"run.dir={tmp_path / 'tiny'}")
    assert preflight_module.check_run_dir(tiny, tiny_plan) == []


def test_a_resumed_runs_own_checkpoints_count_as_room_and_its_exports_as_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Resuming in run.dir: its checkpoints give way to the new ones (pruned past keep_last),
    and the HF exports it wrote are not written again."""
    run_dir = tmp_path / "run"
    cfg, plan = planned(*QWEN4B, f"run.dir={run_dir}", "recipe.save.save_hf_interval=1000")
    need = checkpoint_disk(cfg, plan)
    held = 3 * 1024**2  # what this run's ckpt/ holds (a stand-in size: the sum is what counts)
    (run_dir / "ckpt" / "rollout_40").mkdir(parents=True)
    (run_dir / "ckpt" / "rollout_40" / "weights.bin").write_bytes(b"\0" * held)
    for n in (1000, 2000):
        (run_dir / "hf" / f"rollout_{n}").mkdir(parents=True)
    one_export = need.hf_export
    room = need.total - 2 * one_export - held  # free space that fits only with both counted
    monkeypatch.setattr(
        shutil, "disk_usage", lambda path: SimpleNamespace(total=0, used=0, free=room)
    )
    assert preflight_module.check_run_dir(cfg, plan) == []
    monkeypatch.setattr(
        shutil, "disk_usage", lambda path: SimpleNamespace(total=0, used=0, free=room - 1)
    )
    (issue,) = preflight_module.check_run_dir(cfg, plan)
    assert "1 HF export(s)" in issue.message  # the third, still to come


def test_with_no_save_due_the_checkpoint_a_sigterm_saves_still_needs_room() -> None:
    """recipe.save.interval null: no save is due, yet run.on_sigterm: save (the default)
    writes one checkpoint when a scheduler stops the run; with run.on_sigterm: stop nothing
    is written."""
    no_saves = (*QWEN4B, "recipe.save.interval=null")
    cfg, plan = planned(*no_saves)
    need = checkpoint_disk(cfg, plan)
    assert (need.kept, need.on_sigterm_only) == (1, True)
    assert need.total == need.checkpoint
    assert checkpoint_disk_issues(cfg, plan, need.total) == []
    (issue,) = checkpoint_disk_issues(cfg, plan, need.total - 1)
    assert f"the checkpoint of {need.checkpoint / GIB:,.1f} GiB a SIGTERM saves" in issue.message
    assert "keep_last" not in issue.fix and "run.on_sigterm: stop" in issue.fix
    cfg, plan = planned(*no_saves, "run.on_sigterm=stop")
    assert checkpoint_disk(cfg, plan).total == 0
    assert checkpoint_disk_issues(cfg, plan, 0) == []


def test_an_evaluation_saves_nothing_and_needs_no_room_for_saves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mode=eval writes no checkpoint and no HF export, stopped or not: the training recipe's
    save settings, which it never reads, are not counted against run.dir's disk."""
    cfg, plan = planned(*QWEN4B, "mode=eval", f"run.dir={tmp_path / 'eval'}")
    assert checkpoint_disk(cfg, plan).total == 0
    monkeypatch.setattr(
        shutil, "disk_usage", lambda path: SimpleNamespace(total=10 * GIB, used=9 * GIB, free=GIB)
    )
    assert preflight_module.check_run_dir(cfg, plan) == []
