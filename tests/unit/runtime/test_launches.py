"""How each launch of a run ended (rlpost.runtime.launches): launch_ends.jsonl beside
launches.jsonl, written on every way a launch ends, and `rlpost status RUN_DIR`, which reads
them and says what run.resume=auto would do next."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from rlpost.cli.main import main
from rlpost.config.loader import compose_run_config
from rlpost.errors import EXIT_INTERNAL_ERROR, Issue, UserError
from rlpost.plan import build_plan
from rlpost.runtime import checkpoint, train
from rlpost.runtime.failures import (
    EXIT_INTERRUPTED,
    EXIT_RUN_FAILED,
    RunFailed,
    RunFault,
    failed,
    interrupted,
    stopped,
)
from rlpost.runtime.launches import (
    ENDS_FILE,
    LaunchEnd,
    ending,
    launch_count,
    read_launches,
    record_end,
    render_status,
)
from rlpost.runtime.run_state import LoopState, SavedGroups, write_driver_state
from rlpost.runtime.rundir import LAUNCHES_FILE, lock_run_dir, prepare_run_dir
from rlpost.runtime.stop import EXIT_STOPPED, Stopped, Terminated


def save_checkpoint(run_dir: Path, done: int, unfinished: dict[str, Any] | None = None) -> Path:
    """A checkpoint through the real writer (the trainer's file a stand-in)."""
    staging = checkpoint.start_save(run_dir, done)
    state = LoopState(rollouts_done=done, data={}, unfinished=unfinished)
    write_driver_state(staging, state, SavedGroups([], [], []), "model: {}\n", "{}\n")
    checkpoint.write_synced(staging / "trainer" / "rank_0.pt", b"weights")
    return checkpoint.commit_save(staging, keep_last=2)


def ends(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / ENDS_FILE).read_text().splitlines()]


def test_each_end_names_its_launch_with_the_last_rollout_and_checkpoint(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cfg, _ = compose_run_config([f"run.dir={run_dir}", "recipe.rollout.num_rollout=4"])
    prepare_run_dir(cfg, 0)
    assert launch_count(run_dir) == 1
    (run_dir / "metrics.jsonl").write_text('{"rollout_id": 0}\n{"rollout_id": 1}\n{"rollo')
    own = save_checkpoint(run_dir, 2)
    record_end(run_dir, 0, LaunchEnd("restarted", None, "RunFault: train rank 0 died"))
    prepare_run_dir(cfg, 2, restart=1)
    # a SIGTERM's save after rollout 2 keeps its record for the next launch: the checkpoint's
    # last rollout is the later one
    newest = save_checkpoint(run_dir, 3)
    record_end(run_dir, 1, LaunchEnd("stopped", EXIT_STOPPED, "SIGTERM; every finished ..."))
    first, second = read_launches(run_dir)
    assert first.start["start_rollout"] == 0 and second.start["restart"] == 1
    assert first.end is not None and second.end is not None
    assert (first.end["outcome"], first.end["exit_status"]) == ("restarted", None)
    assert first.end["last_rollout"] == 1
    assert first.end["checkpoint"] == {"path": str(own), "rollouts_done": 2}
    assert (second.end["outcome"], second.end["exit_status"]) == ("stopped", 143)
    assert second.end["last_rollout"] == 2 and second.end["checkpoint"]["rollouts_done"] == 3
    # launches.jsonl stays one line per launch, as its readers take it
    assert [json.loads(x)["start_rollout"] for x in (run_dir / LAUNCHES_FILE).open()] == [0, 2]
    text = render_status(run_dir)
    assert "launch 0: start at rollout 0" in text and "launch 1: restart 1 at rollout 2" in text
    assert "ended: restarted (restarted in place): RunFault: train rank 0 died" in text
    assert f"last rollout trained 2; newest checkpoint {newest}" in text
    assert text.endswith(f"next, with run.resume=auto: continue from rollout 3 ({newest})")


def test_a_disk_that_refuses_the_end_is_reported_and_the_launch_ends_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / ENDS_FILE).mkdir()  # any OSError: a full disk, a quota
    record_end(tmp_path, 0, LaunchEnd("failed", EXIT_RUN_FAILED, "RunFault: ..."))
    assert f"could not record how the launch ended in {tmp_path / ENDS_FILE}" in (
        capsys.readouterr().out
    )


def test_a_run_dir_without_ends_reads_as_launches_that_ended_without_a_word(
    tmp_path: Path,
) -> None:
    """A run written before ends were recorded, or whose driver was killed: its launches
    read, each without an end, and the next step is the same as with them."""
    run_dir = tmp_path / "run"
    cfg, _ = compose_run_config([f"run.dir={run_dir}", "recipe.rollout.num_rollout=4"])
    assert "start from scratch (rollout 0): the run has no checkpoint" in render_status(run_dir)
    prepare_run_dir(cfg, 0)
    with (run_dir / LAUNCHES_FILE).open("a") as f:
        f.write('{"start_rollout": 2, "resu')  # a line a crash cut short
    (launch,) = read_launches(run_dir)
    assert launch.end is None
    save_checkpoint(run_dir, 2)
    text = render_status(run_dir)
    assert "ended: ended without a word: its driver was killed or crashed" in text
    assert "next, with run.resume=auto: continue from rollout 2" in text
    assert lock_run_dir(run_dir) == os.getpid()  # a launch running there now
    assert f"ended: not yet: running now (pid {os.getpid()} holds the run directory)" in (
        render_status(run_dir)
    )


@pytest.mark.parametrize(
    ("left_by", "what"),
    [
        ("stop", "the stop"),
        ("evaluation", "the failed evaluation"),
        (None, "the last launch"),  # a checkpoint saved before the cause was recorded
    ],
)
def test_what_waits_after_the_last_rollout_is_said_to_be_left_by_what_left_it(
    tmp_path: Path, left_by: str | None, what: str
) -> None:
    """A failed evaluation's save leaves the rollout's evaluation, record and HF export for
    the resumed run as a stop's does: `rlpost status` and the resumed run name the one the
    checkpoint records."""
    run_dir = tmp_path / "run"
    cfg, _ = compose_run_config([f"run.dir={run_dir}", "recipe.rollout.num_rollout=4"])
    prepare_run_dir(cfg, 0)
    unfinished: dict[str, Any] = {"rollout_id": 3, "metrics": {"train/loss": 0.5}}
    if left_by is not None:
        unfinished["left_by"] = left_by
    left = save_checkpoint(run_dir, 4, unfinished=unfinished)
    assert render_status(run_dir).endswith(
        f"next, with run.resume=auto: finish what {what} left of rollout 3 ({left}), then "
        "nothing: 4 of recipe.rollout.num_rollout=4 rollouts are done"
    )
    assert train.finishing(4, 4, unfinished) == (
        "4 rollouts are done and recipe.rollout.num_rollout=4: no rollout to train; "
        f"finishing what {what} left of rollout 3"
    )


def test_what_run_resume_auto_would_do_next(tmp_path: Path) -> None:
    run_dir, fork = tmp_path / "run", tmp_path / "fork"
    cfg, _ = compose_run_config([f"run.dir={run_dir}", "recipe.rollout.num_rollout=4"])
    prepare_run_dir(cfg, 0)
    left = save_checkpoint(run_dir, 4, unfinished={"rollout_id": 3, "left_by": "stop"})
    assert f"finish what the stop left of rollout 3 ({left}), then nothing" in (
        render_status(run_dir)
    )
    save_checkpoint(run_dir, 5)
    assert render_status(run_dir).endswith(
        "nothing to continue: finished (5 of recipe.rollout.num_rollout=4 rollouts done); "
        "raise num_rollout to train on"
    )
    forked = str(run_dir / "ckpt" / "rollout_5")
    prepare_run_dir(compose_run_config([f"run.dir={fork}", f"run.resume={forked}"])[0], 5)
    assert render_status(fork).endswith(
        "start from scratch (rollout 0): the run has no checkpoint; "
        f"run.resume={forked} continues from the checkpoint it began from"
    )


def test_every_way_a_launch_ends_is_an_outcome_with_the_launchers_exit_status(
    tmp_path: Path,
) -> None:
    ckpt = tmp_path / "ckpt" / "rollout_3"
    refusal = UserError(
        [
            Issue("recipe.rollout.max_response_len", "beyond the context", "fewer"),
            Issue("a", "b", "c"),
        ]
    )
    cases = [
        (failed("RunFault: a train rank died\n    caused by ...", tmp_path, 2), "failed", 3),
        (stopped(Stopped(3, ckpt), tmp_path, 0), "stopped", EXIT_STOPPED),
        (interrupted(tmp_path, 0), "interrupted", EXIT_INTERRUPTED),
        (refusal, "refused", 2),
        (KeyboardInterrupt(), "interrupted", EXIT_INTERRUPTED),
        (Terminated(), "stopped", EXIT_STOPPED),
        (ValueError("a bug"), "failed", EXIT_INTERNAL_ERROR),
    ]
    for exc, outcome, status in cases:
        end = ending(exc)
        assert end is not None and (end.outcome, end.exit_status) == (outcome, status), exc
        if isinstance(exc, RunFailed):
            assert exc.exit_status == status
    assert ending(cases[0][0]) == LaunchEnd(
        "failed", EXIT_RUN_FAILED, "RunFault: a train rank died (after 2 restart(s))"
    )
    assert ending(refusal) == LaunchEnd(
        "refused", 2, "recipe.rollout.max_response_len: beyond the context (and 1 more)"
    )
    assert ending(SystemExit(0)) is None


@pytest.mark.parametrize(
    ("raised", "overrides", "expected"),
    [
        (None, [], [("finished", 0)]),
        (KeyboardInterrupt, [], [("interrupted", EXIT_INTERRUPTED)]),
        (Stopped(0, None), ["run.on_sigterm=stop"], [("stopped", EXIT_STOPPED)]),
        (
            RunFault("train rank 0 died\nits last words: ..."),
            ["run.max_restarts=1"],
            [("restarted", None), ("failed", EXIT_RUN_FAILED)],
        ),
        (ValueError("a reward hook raised"), [], [("failed", EXIT_RUN_FAILED)]),
        (None, ["recipe.rollout.max_response_len=500"], [("refused", 2)]),
    ],
    ids=["finished", "ctrl-c", "sigterm-stop", "fault-after-max-restarts", "failure", "refusal"],
)
def test_a_launch_records_how_it_ended_on_every_way_out(
    raised: BaseException | None,
    overrides: list[str],
    expected: list[tuple[str, int | None]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """train.run with the session's part (Ray, the engines, the ranks) standing in: it loads
    the inputs for real (a prompt too long for the context is refused there), then ends as
    the session would have."""
    run_dir = tmp_path / "run"
    cfg, _ = compose_run_config([f"run.dir={run_dir}", *overrides])

    async def session(cfg: Any, plan: Any, run_dir: Path, inputs: Any, *rest: Any) -> list[Any]:
        await asyncio.wrap_future(inputs)
        if raised is not None:
            raise raised
        return []

    monkeypatch.setattr(train, "_train", session)
    before = signal.getsignal(signal.SIGINT)
    try:
        if raised is None and not overrides:
            train.run(cfg, build_plan(cfg))
        else:
            with pytest.raises((RunFailed, UserError)):
                train.run(cfg, build_plan(cfg))
    finally:
        signal.signal(signal.SIGINT, before)
    launches = read_launches(run_dir)
    assert [(x.end["outcome"], x.end["exit_status"]) for x in launches if x.end] == expected
    assert len(launches) == len(expected)
    if len(expected) == 2:
        assert launches[0].end is not None
        assert launches[0].end["what"] == "RunFault: train rank 0 died"
        assert launches[1].start["restart"] == 1


def test_rlpost_status_reads_a_run_dir_and_refuses_a_folder_that_is_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    cfg, _ = compose_run_config([f"run.dir={run_dir}"])
    prepare_run_dir(cfg, 0)
    record_end(run_dir, 0, LaunchEnd("finished", 0))
    main(["status", str(run_dir)])
    out = capsys.readouterr().out
    assert out.startswith(f"run directory: {run_dir}\n  launch 0: start at rollout 0, ")
    assert "    ended: finished (exit status 0)\n      no checkpoint saved\n" in out
    with pytest.raises(SystemExit) as refused:
        main(["status", str(tmp_path)])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert f"{tmp_path} holds no launches.jsonl: it is not a run directory" in err
    assert "Traceback" not in err


def test_status_names_a_broken_newest_checkpoint_and_resumes_from_the_one_auto_would(
    tmp_path: Path,
) -> None:
    """A shard truncated, altered in place (same size) or gone: status says which checkpoint
    is broken and why, and names the older one run.resume=auto would load, as the launch
    would, instead of the broken one or nothing."""
    run_dir = tmp_path / "run"
    cfg, _ = compose_run_config([f"run.dir={run_dir}", "recipe.rollout.num_rollout=8"])
    prepare_run_dir(cfg, 0)
    older = save_checkpoint(run_dir, 2)
    newest = save_checkpoint(run_dir, 4)
    shard = newest / "trainer" / "rank_0.pt"
    for damage, problem in [
        (lambda: shard.write_bytes(b"weig"), "trainer/rank_0.pt has 4 bytes, the manifest says 7"),
        (lambda: shard.write_bytes(b"WEIGHTS"), "trainer/rank_0.pt does not match its sha256"),
        (shard.unlink, "trainer/rank_0.pt is listed in the manifest but missing"),
    ]:
        damage()
        text = render_status(run_dir)
        assert f"checkpoint {newest} is broken and will not be loaded: {problem}" in text
        assert f"a resume moves it to {run_dir / 'ckpt' / 'abandoned'}/" in text
        assert text.endswith(f"next, with run.resume=auto: continue from rollout 2 ({older})")
    (older / "manifest.json").unlink()
    text = render_status(run_dir)
    assert f"checkpoint {older} is broken and will not be loaded: no manifest.json" in text
    assert text.endswith(f"refused: every checkpoint in {run_dir / 'ckpt'} is broken")
