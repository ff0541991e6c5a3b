"""Checkpoints: atomic saves, manifests, corruption, keep-last, and resume decisions."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from rlpost.config.loader import compose_run_config
from rlpost.errors import UserError
from rlpost.plan import build_plan
from rlpost.runtime import checkpoint
from rlpost.runtime.checkpoint import CheckpointError
from rlpost.runtime.config_changes import (
    ParallelChange,
    check_resume_changes,
    diff_configs,
    parallel_changes,
)
from rlpost.runtime.failures import failed
from rlpost.runtime.resume import find_resume_point, plan_grid, set_aside_newer
from rlpost.runtime.run_state import (
    LoopState,
    SavedGroups,
    read_groups,
    read_loop_state,
    write_driver_state,
)
from rlpost.runtime.rundir import config_dict, config_yaml
from rlpost.schema import RunConfig
from rlpost.schema.run import EVAL_RESUME_FIX
from rlpost.types import Sample

REPO = Path(__file__).resolve().parents[3]


def save(
    run_dir: Path,
    done: int,
    keep_last: int = 10,
    cfg: RunConfig | None = None,
    config_text: str | None = None,
    unfinished: dict[str, Any] | None = None,
) -> Path:
    """A checkpoint through the real writer; the trainer file is a stand-in payload."""
    staging = checkpoint.start_save(run_dir, done)
    state = LoopState(
        rollouts_done=done, data={"epoch": 0, "offset": done, "seed": 42}, unfinished=unfinished
    )
    buffer = [[Sample(group_index=done, index=0, prompt="p", prompt_ids=[1, 2])]]
    queued = [[Sample(group_index=done + 1, index=0, prompt="q", prompt_ids=[3])]]
    generating = [[Sample(group_index=done + 2, index=0, prompt="r", prompt_ids=[4])]]
    yaml_text = config_yaml(cfg) if cfg is not None else "model: {}\n"
    yaml_text = config_text if config_text is not None else yaml_text
    groups = SavedGroups(buffer, queued, generating)
    write_driver_state(staging, state, groups, yaml_text, "{}\n")
    checkpoint.write_synced(staging / "trainer" / "rank_0.pt", os.urandom(4096))
    return checkpoint.commit_save(staging, keep_last)


def test_commit_renames_staging_and_lists_every_file(tmp_path: Path) -> None:
    path = save(tmp_path, 3)
    assert path == tmp_path / "ckpt" / "rollout_3"
    assert not list((tmp_path / "ckpt").glob("tmp-*"))
    manifest = checkpoint.verify(path)
    on_disk = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()} - {
        "manifest.json"
    }
    assert set(manifest["files"]) == on_disk
    assert {"loop.json", "buffer.pkl", "rng/driver.pt", "trainer/rank_0.pt"} <= on_disk
    assert manifest["rollouts_done"] == 3
    assert read_loop_state(path).data == {"epoch": 0, "offset": 3, "seed": 42}
    saved = read_groups(path)
    assert saved.buffer[0][0].group_index == 3 and saved.queued[0][0].group_index == 4
    assert saved.generating[0][0].group_index == 5
    # a checkpoint from before `generating` was kept apart: its groups are in the buffer
    payload = pickle.loads((path / "buffer.pkl").read_bytes())
    del payload["generating"]
    (path / "buffer.pkl").write_bytes(pickle.dumps(payload))
    assert read_groups(path).generating == [] and read_groups(path).buffer == saved.buffer


def test_unfinished_save_is_never_taken_for_a_checkpoint(tmp_path: Path) -> None:
    save(tmp_path, 2)
    staging = checkpoint.start_save(tmp_path, 4)
    empty = SavedGroups()
    write_driver_state(
        staging, LoopState(4, {"epoch": 0, "offset": 4, "seed": 42}), empty, "model: {}\n", "{}\n"
    )
    (staging / checkpoint.MANIFEST).write_text("{}")  # even a manifest does not make it one
    found = checkpoint.scan(tmp_path)
    assert [p.name for p in found.complete] == ["rollout_2"]
    assert found.interrupted == [staging]
    checkpoint.start_save(tmp_path, 3)  # the next save clears what a killed save left
    assert not staging.exists()


SLOW_SAVE = """
import sys, time
from pathlib import Path
from rlpost.runtime import checkpoint
staging = checkpoint.start_save(Path(sys.argv[1]), 5)
with (staging / "trainer_big.bin").open("wb") as f:
    while True:
        f.write(b"x" * 65536); f.flush(); time.sleep(0.001)
"""


def test_save_killed_midway_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    previous = save(tmp_path, 4)
    writer = subprocess.Popen([sys.executable, "-c", SLOW_SAVE, str(tmp_path)], cwd=REPO)
    target = tmp_path / "ckpt" / "tmp-5" / "trainer_big.bin"
    deadline = time.monotonic() + 30
    while not (target.exists() and target.stat().st_size > 0) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    found = checkpoint.scan(tmp_path)
    assert found.latest == previous and not found.broken
    assert [p.name for p in found.interrupted] == ["tmp-5"]


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


CORRUPTIONS = {
    "flipped byte": (lambda p: _flip_byte(p / "trainer/rank_0.pt"), "sha256"),
    "truncated file": (
        lambda p: (p / "trainer/rank_0.pt").write_bytes(b"short"),
        "bytes, the manifest says",
    ),
    "missing file": (lambda p: (p / "buffer.pkl").unlink(), "missing"),
    "no manifest": (lambda p: (p / "manifest.json").unlink(), "did not finish"),
    "garbled manifest": (lambda p: (p / "manifest.json").write_text("{not json"), "parse"),
    "manifest of another rollout": (
        lambda p: (p / "manifest.json").write_text(
            json.dumps({**json.loads((p / "manifest.json").read_text()), "rollouts_done": 9})
        ),
        "the name says",
    ),
}


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_corrupted_checkpoint_is_reported_and_skipped(tmp_path: Path, kind: str) -> None:
    older = save(tmp_path, 2)
    newer = save(tmp_path, 4)
    corrupt, words = CORRUPTIONS[kind]
    corrupt(newer)
    with pytest.raises(CheckpointError, match=words):
        checkpoint.verify(newer)
    found = checkpoint.scan(tmp_path)
    assert found.latest == older
    assert [b.path for b in found.broken] == [newer]


def test_keep_last_keeps_the_newest(tmp_path: Path) -> None:
    for done in (1, 2, 3, 4, 5):
        save(tmp_path, done, keep_last=2)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["rollout_4", "rollout_5"]


def test_saving_a_rollout_again_replaces_it(tmp_path: Path) -> None:
    first = save(tmp_path, 3)
    before = (first / "trainer/rank_0.pt").read_bytes()
    second = save(tmp_path, 3)
    assert second == first and (second / "trainer/rank_0.pt").read_bytes() != before
    checkpoint.verify(second)


# ---- config changes on resume ---------------------------------------------------------------


def test_shape_and_backend_changes_are_refused_field_by_field() -> None:
    before = {"model": {"hidden_size": 256, "num_layers": 4}, "trainer": {"backend": "torch"}}
    after = {"model": {"hidden_size": 512, "num_layers": 4}, "trainer": {"backend": "megatron"}}
    with pytest.raises(UserError) as caught:
        check_resume_changes(
            diff_configs(before, after), [], "ckpt/rollout_3", ("torch", "megatron")
        )
    keys = [issue.key for issue in caught.value.issues]
    assert keys == ["model.hidden_size", "trainer.backend"]
    assert "set model.hidden_size=256" in caught.value.render()


def test_turning_mtp_training_on_or_off_is_refused() -> None:
    before = {"recipe": {"train": {"mtp_training": False}}}
    after = {"recipe": {"train": {"mtp_training": True}}}
    for saved, now in ((before, after), (after, before)):
        with pytest.raises(UserError, match=r"recipe\.train\.mtp_training"):
            check_resume_changes(diff_configs(saved, now), [], "c", ("megatron", "megatron"))


def test_another_prompt_order_seed_is_refused_and_other_data_changes_are_reported() -> None:
    """The saved data position is a place in the order the seed drew: resumed with another
    seed, the run would repeat and skip prompts. Other data changes reorder and are noted."""
    before = {"recipe": {"data": {"seed": 42, "max_prompt_len": None}}}
    after = {"recipe": {"data": {"seed": 7, "max_prompt_len": 64}}}
    with pytest.raises(UserError) as caught:
        check_resume_changes(diff_configs(before, after), [], "ckpt/rollout_3")
    (issue,) = caught.value.issues
    assert (issue.key, issue.value) == ("recipe.data.seed", 7)
    assert "set recipe.data.seed=42 to resume" in caught.value.render()
    after["recipe"]["data"]["seed"] = 42
    (reported,) = check_resume_changes(diff_configs(before, after), [], "c")
    assert "prompt order" in reported.render()


def test_naming_the_backend_that_auto_picks_is_not_a_change_of_backend() -> None:
    changes = diff_configs({"trainer": {"backend": "auto"}}, {"trainer": {"backend": "torch"}})
    reported = check_resume_changes(changes, [], "c", ("torch", "torch"))
    assert [c.key for c in reported] == ["trainer.backend"]


def test_other_changes_are_reported_and_launch_options_ignored() -> None:
    before = {"recipe": {"optim": {"lr": 1e-4}}, "run": {"resume": None, "seed": 1}}
    after = {"recipe": {"optim": {"lr": 2e-4}}, "run": {"resume": "auto", "seed": 1}}
    reported = check_resume_changes(diff_configs(before, after), [], "c")
    assert [(c.key, c.before, c.after) for c in reported] == [("recipe.optim.lr", 1e-4, 2e-4)]


def test_a_grid_change_passes_only_where_the_saved_state_reshards() -> None:
    grid = {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "etp": 1, "dp": 2}
    fewer_ranks = parallel_changes(grid, {**grid, "dp": 1}, {"dp"})
    assert check_resume_changes([], fewer_ranks, "c") == []
    with pytest.raises(UserError, match=r"layout\.train\.dp"):
        check_resume_changes([], parallel_changes(grid, {**grid, "dp": 1}, ()), "c")
    with pytest.raises(UserError, match=r"layout\.train\.tp"):
        check_resume_changes([], parallel_changes(grid, {**grid, "tp": 2}, {"dp"}), "c")
    moved = parallel_changes(grid, {**grid, "tp": 2, "dp": 1}, {"tp", "dp"})
    assert [(g.key, g.resharded) for g in moved] == [("tp", True), ("dp", True)]
    assert check_resume_changes([], moved, "c") == []


@pytest.mark.parametrize(
    ("record", "distributed", "expected"),
    [
        ({"optimizer": True, "optimizer_format": "fully_reshardable"}, True, "tp pp cp ep etp dp"),
        ({"optimizer": True, "optimizer_format": "fully_reshardable"}, False, "tp pp cp dp"),
        ({"optimizer": True}, True, "dp"),  # written before the format was recorded
        ({"optimizer": False}, True, "tp pp cp ep etp dp"),  # weights alone load anywhere
    ],
)
def test_megatron_checkpoints_reshard_as_their_record_says(
    tmp_path: Path, record: dict[str, object], distributed: bool, expected: str
) -> None:
    from rlpost.backends.megatron.ckpt_format import STATE_FILE, reshardable_keys

    (tmp_path / STATE_FILE).write_text(json.dumps({"step": 3, **record}))
    assert reshardable_keys(tmp_path, distributed) == frozenset(expected.split())


# ---- where a launch starts ------------------------------------------------------------------


def compose(run_dir: Path, *overrides: str) -> tuple[RunConfig, object]:
    cfg, _ = compose_run_config([f"run.dir={run_dir}", *overrides])
    return cfg, build_plan(cfg)


def test_resume_auto_takes_the_newest_complete_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg, plan = compose(tmp_path, "run.resume=auto")
    save(tmp_path, 2, cfg=cfg)
    broken = save(tmp_path, 4, cfg=cfg)
    _flip_byte(broken / "trainer/rank_0.pt")
    point = find_resume_point(cfg, plan, tmp_path)  # type: ignore[arg-type]
    assert point is not None and point.start_rollout == 2
    assert "rollout_4 is broken" in capsys.readouterr().out
    set_aside_newer(tmp_path, point.start_rollout)
    assert [p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("rollout")] == [
        "rollout_2"
    ]


def test_resume_auto_without_checkpoints_starts_fresh(tmp_path: Path) -> None:
    cfg, plan = compose(tmp_path, "run.resume=auto")
    assert find_resume_point(cfg, plan, tmp_path) is None  # type: ignore[arg-type]


def test_resume_from_a_corrupted_path_is_a_user_error(tmp_path: Path) -> None:
    path = save(tmp_path, 2)
    (path / "manifest.json").unlink()
    cfg, plan = compose(tmp_path / "new", f"run.resume={path}")
    with pytest.raises(UserError, match="did not finish"):
        find_resume_point(cfg, plan, tmp_path / "new")  # type: ignore[arg-type]


def test_an_evaluations_checkpoint_failing_its_hash_check_is_refused_with_a_fix_it_can_take(
    tmp_path: Path,
) -> None:
    """Validation reads no file's sha256; the launch does, and mode=eval refuses
    run.resume=auto, so its fix offers the weights it evaluates without a checkpoint."""
    from rlpost.preflight.run_dir import check_resume_target

    path = save(tmp_path, 2)
    _flip_byte(path / "trainer/rank_0.pt")
    assert check_resume_target(str(path), "eval") == []
    cfg, plan = compose(tmp_path / "new", "mode=eval", f"run.resume={path}")
    with pytest.raises(UserError) as caught:
        find_resume_point(cfg, plan, tmp_path / "new")  # type: ignore[arg-type]
    [issue] = caught.value.issues
    assert issue.key == "run.resume" and issue.value == str(path) and "sha256" in issue.message
    assert "run.resume=auto" not in issue.fix
    assert issue.fix == EVAL_RESUME_FIX
    training, plan = compose(tmp_path / "new", f"run.resume={path}")
    with pytest.raises(UserError, match=r"run\.resume=auto"):
        find_resume_point(training, plan, tmp_path / "new")  # type: ignore[arg-type]


def test_fresh_start_in_a_directory_with_checkpoints_is_refused(tmp_path: Path) -> None:
    save(tmp_path, 2)
    cfg, plan = compose(tmp_path)
    with pytest.raises(UserError, match=r"run.resume=auto"):
        find_resume_point(cfg, plan, tmp_path)  # type: ignore[arg-type]


def test_resume_with_another_model_shape_is_refused(tmp_path: Path) -> None:
    cfg, plan = compose(tmp_path)
    save(tmp_path, 2, cfg=cfg)
    changed = cfg.model_copy(
        update={
            "model": cfg.model.model_copy(update={"num_layers": 6}),
            "run": cfg.run.model_copy(update={"resume": "auto"}),
        }
    )
    with pytest.raises(UserError, match=r"model\.num_layers"):
        find_resume_point(changed, plan, tmp_path)  # type: ignore[arg-type]


def test_an_evaluation_of_a_checkpoint_of_another_shape_is_refused_with_an_evaluations_fix(
    tmp_path: Path,
) -> None:
    cfg, plan = compose(tmp_path / "run")
    path = save(tmp_path / "run", 2, cfg=cfg)
    evaluation, plan = compose(tmp_path / "eval", "mode=eval", f"run.resume={path}")
    changed = evaluation.model_copy(
        update={"model": evaluation.model.model_copy(update={"num_layers": 6})}
    )
    with pytest.raises(UserError) as caught:
        find_resume_point(changed, plan, tmp_path / "eval")  # type: ignore[arg-type]
    text = caught.value.render()
    assert "change that prevents evaluating the checkpoint" in text
    assert "set model.num_layers=4 to evaluate the checkpoint's weights" in text
    assert "remove run.resume" in text and "to resume" not in text


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_a_layout_or_trainer_a_checkpoint_cannot_be_read_in_gets_the_modes_own_fix(
    mode: str,
) -> None:
    """A saved grid that cannot be resharded, or another trainer's format: a resumed run is
    told to resume as it was saved, an evaluation to evaluate so (or its HF export)."""
    grid = [ParallelChange("tp", 2, 4, resharded=False)]
    with pytest.raises(UserError) as caught:
        check_resume_changes([], grid, "/ckpt/rollout_2", ("megatron", "torch"), mode)
    text = caught.value.render()
    verb = "evaluate" if mode == "eval" else "resume"
    assert f"{verb} with tp=2 (set layout.train.tp)" in text
    assert f"{verb} with trainer.backend=megatron" in text
    if mode == "eval":
        assert "resume with" not in text and "start a new run" not in text
        assert "evaluate that folder as model.hf_checkpoint" in text


def test_plan_grid_names_every_parallel_axis(tmp_path: Path) -> None:
    _, plan = compose(tmp_path)
    assert set(plan_grid(plan)) == {"tp", "pp", "cp", "ep", "etp", "dp"}  # type: ignore[arg-type]


FULL_DISK = """
import asyncio, os, resource, signal, sys
from pathlib import Path
from rlpost.runtime import checkpoint

run_dir = Path(sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))

async def write(staging: Path) -> None:
    (staging / "loop.json").write_text("{}")
    checkpoint.write_synced(staging / "trainer" / "rank_0.pt", os.urandom(4 << 20))

try:
    asyncio.run(checkpoint.save(run_dir, 4, write, keep_last=3))
except checkpoint.SaveError as exc:
    print("refused:", exc)
"""


def test_a_save_the_disk_refuses_leaves_the_previous_checkpoint_loadable(tmp_path: Path) -> None:
    previous = save(tmp_path, 3)
    done = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "refused: OSError" in done.stdout and "File too large" in done.stdout
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["rollout_3"]
    assert checkpoint.scan(tmp_path).latest == previous
    checkpoint.verify(previous)


def test_a_run_dir_written_another_way_is_the_same_run_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs/exp2").mkdir(parents=True)
    relative, absolute = "runs/exp2", str(tmp_path / "runs/exp2")
    for saved_dir, resumed_dir in ((relative, absolute), (absolute, relative)):
        shutil.rmtree(tmp_path / "runs/exp2/ckpt", ignore_errors=True)
        cfg, plan = compose(Path(saved_dir))
        save(Path(saved_dir), 2, cfg=cfg)
        resumed, _ = compose(Path(resumed_dir), "run.resume=auto")
        point = find_resume_point(resumed, plan, Path(resumed_dir))  # type: ignore[arg-type]
        assert point is not None and point.changes == []
        assert "fork" not in capsys.readouterr().out


def test_only_paths_to_one_file_are_the_same_value(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    paths = {"run.dir", "model.hf_checkpoint"}
    same = diff_configs(
        {"run": {"dir": str(tmp_path / "a")}}, {"run": {"dir": f"{tmp_path}/b/../a"}}, paths
    )
    assert same == []
    other = diff_configs(
        {"run": {"dir": str(tmp_path / "a")}}, {"run": {"dir": str(tmp_path / "b")}}, paths
    )
    assert [c.key for c in other] == ["run.dir"]
    hub = diff_configs(
        {"model": {"hf_checkpoint": "Qwen/Qwen3-4B"}},
        {"model": {"hf_checkpoint": "./Qwen/Qwen3-4B"}},
        paths,
    )
    assert [c.key for c in hub] == ["model.hf_checkpoint"]  # neither exists: not known to be one
    unlisted = diff_configs(
        {"recipe": {"x": str(tmp_path / "a")}}, {"recipe": {"x": f"{tmp_path}/b/../a"}}, paths
    )
    assert [c.key for c in unlisted] == ["recipe.x"]


def test_fields_an_older_version_did_not_write_are_not_changes_on_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint written before the schema grew a field (at the top, or in a list's items
    such as an evaluation dataset's) resumes with no change reported; a real change still is."""
    cfg, plan = compose(tmp_path, "run.resume=auto")
    older = config_dict(cfg)
    assert older["recipe"]["eval"]["datasets"], "the default recipe evaluates a dataset"
    del older["recipe"]["eval"]["datasets"][0]["max_response_len"]
    del older["recipe"]["optim"]["min_lr"]
    save(tmp_path, 2, config_text=yaml.safe_dump(older, sort_keys=False))
    point = find_resume_point(cfg, plan, tmp_path)  # type: ignore[arg-type]
    assert point is not None and point.changes == []

    older["recipe"]["optim"]["lr"] = cfg.recipe.optim.lr * 2
    shutil.rmtree(tmp_path / "ckpt")
    save(tmp_path, 2, config_text=yaml.safe_dump(older, sort_keys=False))
    point = find_resume_point(cfg, plan, tmp_path)  # type: ignore[arg-type]
    assert point is not None and [c.key for c in point.changes] == ["recipe.optim.lr"]


def test_a_fork_stopped_while_it_starts_says_to_continue_from_the_checkpoint_it_forked(
    tmp_path: Path,
) -> None:
    """SIGTERM to a launch that forks another run's checkpoint (run.dir of its own), once it has
    found the checkpoint and before anything trained: it stops (143) and names that
    checkpoint as the one to continue from, with run.resume=<it>; it said that no checkpoint
    was saved yet, and run.resume=auto in its run.dir starts at rollout 0."""
    exp1, fork = tmp_path / "exp1", tmp_path / "exp1b"
    cfg, _ = compose(exp1)
    forked = save(exp1, 2, cfg=cfg)
    log = tmp_path / "launch.log"
    args = [f"run.dir={fork}", f"run.resume={forked}", f"hydra.run.dir={tmp_path / 'hydra'}"]
    with log.open("w") as out:
        launch = subprocess.Popen(
            [sys.executable, str(REPO / "launch.py"), *args], cwd=REPO, stdout=out, stderr=out
        )
        try:
            deadline = time.monotonic() + 60
            while f"resuming from {forked}" not in log.read_text():
                assert launch.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            launch.send_signal(signal.SIGTERM)
            assert launch.wait(timeout=60) == 143, log.read_text()
        finally:
            launch.kill()
    text = log.read_text()
    assert f"newest usable checkpoint: {forked}\n" in text, text
    resumes = f"run.dir={fork} run.resume={forked}"
    hydra_dir = f"hydra.run.dir={tmp_path / 'hydra'}"
    assert f"to continue: python launch.py {hydra_dir} {resumes}\n" in text, text
    assert "no checkpoint was saved yet" not in text


def test_a_failure_names_the_evaluation_its_checkpoint_leaves_for_the_continued_run(
    tmp_path: Path,
) -> None:
    """The save before a failed evaluation ends the run holds the rollout whose record waits
    for it (loop.Unfinished): the failure says the continued run evaluates there first."""
    waiting = {"rollout_id": 1, "metrics": {"rollout/reward_mean": 0.5}, "left_by": "evaluation"}
    save(tmp_path / "run", 2, unfinished=waiting)
    text = failed("the evaluation after rollout 2: RewardError", tmp_path / "run", 0).render()
    assert (
        f"  newest usable checkpoint: {tmp_path / 'run' / 'ckpt' / 'rollout_2'}\n"
        "  the evaluation after rollout 2 waits in it: the continued run does it first, and "
        "logs rollout 1's record with it\n"
        "  to continue: "
    ) in text
    # a stop's save whose record was logged (only an HF export waits), or none at all: no line
    for unfinished in ({"rollout_id": 2, "metrics": None, "left_by": "stop"}, None):
        save(tmp_path / "other", 3, unfinished=unfinished)
        assert "waits in it" not in failed("x", tmp_path / "other", 0).render()
