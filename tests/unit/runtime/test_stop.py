"""SIGTERM for a launch (rlpost.runtime.stop): real signals to this process, handled by the
event loop; the first asks the loop to save and stop, or ends the launch's task at once."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from rlpost.runtime import checkpoint
from rlpost.runtime.failures import (
    EXIT_RUN_FAILED,
    RunFailed,
    RunStopped,
    failed,
    interrupted,
    stopped,
)
from rlpost.runtime.run_state import LoopState, SavedGroups, write_driver_state
from rlpost.runtime.stop import EXIT_STOPPED, StopSignal, Terminated, sigterm_raises


async def _sigterm(stop: StopSignal) -> None:
    assert stop._loop is not None, "no handler installed: SIGTERM would end the test process"
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(100):  # the loop runs its handler on its next turn
        await asyncio.sleep(0.01)
        if stop.received:
            return


def test_save_asks_the_loop_first_and_a_second_sigterm_ends_the_task() -> None:
    woken: list[str] = []

    async def launch(stop: StopSignal) -> None:
        stop.install()
        try:
            stop.accept(lambda: woken.append("pipeline"))
            await _sigterm(stop)
            assert stop.requested.is_set() and woken == ["pipeline"]
            await asyncio.sleep(0)  # not cancelled: the loop saves first
            await _sigterm(stop)
            await asyncio.sleep(10)
        finally:
            stop.uninstall()

    before = signal.getsignal(signal.SIGTERM)
    stop = StopSignal("save")
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(launch(stop))
    assert stop.received == 2 and stop.signalled
    assert signal.getsignal(signal.SIGTERM) == before  # given back


@pytest.mark.parametrize(
    ("on_sigterm", "accepted", "said"),
    [
        (
            "save",
            False,
            "SIGTERM while the run starts: nothing new to save; stopping at once",
        ),
        ("stop", False, "SIGTERM: stopping at once"),
        ("stop", True, "SIGTERM: stopping at once"),
    ],
    ids=["save, before the loop runs", "stop, before", "stop, while the loop runs"],
)
def test_the_task_ends_at_once_before_the_loop_runs_or_with_stop(
    on_sigterm: str, accepted: bool, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """At once, and saying why: with `save`, a stop before the loop runs has trained nothing
    since the launch began, so the checkpoint it started from holds everything (a resumed
    run loading it, finishing what a stop left of its last rollout)."""

    async def launch(stop: StopSignal) -> None:
        stop.install()
        try:
            if accepted:
                stop.accept(lambda: None)
            await _sigterm(stop)
            await asyncio.sleep(10)
        finally:
            stop.uninstall()

    stop = StopSignal(on_sigterm)  # type: ignore[arg-type]
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(launch(stop))
    assert stop.received == 1 and not stop.requested.is_set()
    assert said in capsys.readouterr().out


def test_a_stopped_run_says_so_with_its_own_exit_status(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt" / "rollout_3"
    stopped = RunStopped("SIGTERM; every finished rollout (3) is in " + str(ckpt), tmp_path, ckpt)
    text = stopped.render()
    assert text.startswith("rlpost: the run stopped: SIGTERM")
    assert f"to continue: launch again with run.dir={tmp_path} run.resume=auto (replacing" in text
    assert "traceback" not in text
    assert (stopped.exit_status, EXIT_STOPPED) == (143, 128 + signal.SIGTERM)
    failure = RunFailed("a train rank died", tmp_path, None)
    assert failure.exit_status == EXIT_RUN_FAILED and "traceback" in failure.render()


def test_a_fork_that_ends_before_its_first_save_continues_from_the_checkpoint_it_forked(
    tmp_path: Path,
) -> None:
    """A launch that resumed another run's checkpoint (run.resume=<path>, a run.dir of its own)
    and ended before it saved one names that checkpoint, and run.resume=<it>, to continue: it
    said that no checkpoint was saved yet, and run.resume=auto there starts at rollout 0. The
    run's own checkpoint, once it has one, comes first, with run.resume=auto."""
    forked = tmp_path / "exp1" / "ckpt" / "rollout_40"
    fork = tmp_path / "exp1b"
    for ended in (
        stopped(None, fork, 0, resumed=forked),
        failed("a train rank died", fork, 0, resumed=forked),
        interrupted(fork, 0, resumed=forked),
    ):
        text = ended.render()
        assert f"newest usable checkpoint: {forked}\n" in text
        hint = f"to continue: launch again with run.dir={fork} run.resume={forked} (replacing"
        assert hint in text
        assert "saved yet" not in text
    staging = checkpoint.start_save(fork, 42)
    state = LoopState(rollouts_done=42, data={})
    write_driver_state(staging, state, SavedGroups([], [], []), "model: {}\n", "{}\n")
    checkpoint.write_synced(staging / "trainer" / "rank_0.pt", b"weights")
    own = checkpoint.commit_save(staging, keep_last=1)
    text = stopped(None, fork, 0, resumed=forked).render()
    assert f"newest usable checkpoint: {own}\n" in text
    assert f"to continue: launch again with run.dir={fork} run.resume=auto (replacing" in text


def test_a_failed_or_stopped_evaluation_names_no_checkpoint_to_resume(tmp_path: Path) -> None:
    """mode=eval saves no checkpoint and refuses run.resume=auto: its failure says so, where
    a training run's says none was saved yet (or names run.resume=auto)."""
    for ended in (
        failed("an engine died", tmp_path, 0, evaluation=True),
        stopped(None, tmp_path, 0, evaluation=True),
    ):
        text = ended.render()
        assert "an evaluation saves no checkpoint: launch it again to evaluate anew" in text
        assert "run.resume" not in text and "saved yet" not in text
    assert "no checkpoint was saved yet" in failed("an engine died", tmp_path, 0).render()


def test_around_the_loop_a_sigterm_raises_terminated_and_the_handler_is_given_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated), sigterm_raises():  # the launch's start, between restarts
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100):  # delivered at the next bytecode boundary
            time.sleep(0.01)
    assert signal.getsignal(signal.SIGTERM) == before

    async def launch(stop: StopSignal) -> None:
        stop.install()  # the loop's handler in its place while the run runs
        try:
            stop.accept(lambda: None)
            await _sigterm(stop)
        finally:
            stop.uninstall()

    with sigterm_raises():
        stop = StopSignal("save")
        asyncio.run(launch(stop))
        assert stop.requested.is_set()
        assert signal.getsignal(signal.SIGTERM) is not before  # raising Terminated again
    assert signal.getsignal(signal.SIGTERM) == before


def test_held_signals_are_raised_when_released_and_an_ignored_one_stays_ignored() -> None:
    """Between a sweep's jobs Ctrl-C and SIGTERM wait for the launch's own code: held, they
    interrupt nothing (Hydra composing a config, the summary being written); released, the
    first is raised as the launch would have raised it."""
    before, before_int = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    # Ctrl-C as a terminal's command has it, whether or not these tests were started with it
    # ignored (in the background, under nohup)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        held_signals_are_raised_when_released(before)
    finally:
        signal.signal(signal.SIGINT, before_int)


def held_signals_are_raised_when_released(before: object) -> None:
    from rlpost.runtime.stop import HeldSignals, Terminated

    held = HeldSignals()
    held.hold()
    os.kill(os.getpid(), signal.SIGINT)  # interrupts nothing while held
    os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        held.release()  # the first one held
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) == before
    held.release()  # nothing held any more

    held.hold()
    os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(Terminated):
        held.release()

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a command started in the background
    held.hold()
    os.kill(os.getpid(), signal.SIGINT)
    held.release()  # ignored, as before the hold
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
