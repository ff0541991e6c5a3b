"""Calls on every train rank awaited as a whole (rlpost.runtime.rank_calls.await_ranks): a rank
that does not answer within trainer.collective_timeout_s is named; a save, which reports the
bytes it has written, is cut off only once it stops writing for that long."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from rlpost.runtime import rank_calls
from rlpost.runtime.checkpoint import bytes_under
from rlpost.runtime.failures import RunFault
from rlpost.runtime.rank_calls import Awaited, await_ranks

TIMEOUT_S = 1.0  # a loaded machine's event loop may pause for a good part of a second


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rank_calls, "PROGRESS_POLL_S", 0.05)
    monkeypatch.setattr(rank_calls, "RANK_GRACE_S", 0.1)


async def answer(value: int, after_s: float = 0.0) -> int:
    await asyncio.sleep(after_s)
    return value


async def never() -> int:
    await asyncio.sleep(3600)
    return -1


async def write(folder: Path, chunks: int, every_s: float, then_hang: bool = False) -> int:
    """A rank saving: `chunks` writes of 1 KiB, `every_s` apart; then done, or stalled."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(chunks):
        (folder / f"part-{i}").write_bytes(b"\0" * 1024)
        await asyncio.sleep(every_s)
    if then_hang:
        await never()
    return chunks


def test_every_rank_answers_in_rank_order() -> None:
    calls = [answer(0, 0.05), answer(1), answer(2, 0.02)]
    assert asyncio.run(await_ranks("a train step", calls, TIMEOUT_S)) == [0, 1, 2]


def test_a_rank_that_never_answers_is_named_after_the_timeout() -> None:
    start = time.monotonic()
    with pytest.raises(RunFault, match=r"train rank\(s\) \[1\] did not arrive: a train step"):
        asyncio.run(await_ranks("a train step", [answer(0), never()], TIMEOUT_S))
    assert TIMEOUT_S <= time.monotonic() - start < TIMEOUT_S + 2.0


def test_a_save_that_keeps_writing_outlasts_the_timeout(tmp_path: Path) -> None:
    """Twelve writes 0.2 s apart on one rank: 2.4 s, well past the 1 s timeout; each write
    starts the timeout again."""
    staging = tmp_path / "tmp-4"
    ranks = [write(staging / "rank0", 12, 0.2), answer(0, 0.05)]
    start = time.monotonic()
    done = asyncio.run(
        await_ranks("a checkpoint save", ranks, TIMEOUT_S, progress=lambda: bytes_under(staging))
    )
    assert done == [12, 0]
    assert time.monotonic() - start > 2 * TIMEOUT_S
    assert bytes_under(staging) == 12 * 1024


def test_a_save_that_stops_writing_is_cut_off_a_timeout_after_its_last_write(
    tmp_path: Path,
) -> None:
    staging = tmp_path / "tmp-4"
    ranks = [write(staging / "rank0", 3, 0.2, then_hang=True), answer(0)]
    start = time.monotonic()
    with pytest.raises(RunFault) as failure:
        asyncio.run(
            await_ranks(
                "a checkpoint save", ranks, TIMEOUT_S, progress=lambda: bytes_under(staging)
            )
        )
    elapsed = time.monotonic() - start
    assert "train rank(s) [0] did not arrive: a checkpoint save did not finish" in str(
        failure.value
    )
    assert "collective_timeout_s=1 s of its last progress" in str(failure.value)
    # the last write lands at about 0.4 s; the cut comes a timeout later, not before
    assert 0.4 + TIMEOUT_S <= elapsed < 0.5 + TIMEOUT_S + 2.0


def test_a_rank_that_fails_fails_the_call_and_the_others_get_a_grace() -> None:
    async def fails() -> int:
        await asyncio.sleep(0.02)
        raise ValueError("a bug in a hook")

    with pytest.raises(ValueError, match="a bug in a hook"):
        asyncio.run(await_ranks("a train step", [answer(0, 0.05), fails()], TIMEOUT_S))
    # one still stuck in a collective with it after the grace: named, with the cause
    with pytest.raises(RunFault, match=r"\[0\] did not arrive.*rank 1 failed: a bug in a hook"):
        asyncio.run(await_ranks("a train step", [never(), fails()], TIMEOUT_S))


def test_bytes_under_a_missing_folder_is_zero(tmp_path: Path) -> None:
    assert bytes_under(tmp_path / "absent") == 0
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f").write_bytes(b"12345")
    (tmp_path / "a" / "g").write_bytes(b"123")
    assert bytes_under(tmp_path) == 8


def test_another_actor_that_never_answers_is_named_as_itself_with_its_own_key() -> None:
    """A call awaited on another actor than the train ranks (the reward model actor's start)
    names it, and the key its timeout is the value of, never a train rank."""
    who = Awaited(
        part="reward model actor",
        key="engine.startup_timeout_s",
        names=("the reward model actor (pkg.RM)",),
        fix="raise engine.startup_timeout_s",
    )
    with pytest.raises(RunFault) as fault:
        asyncio.run(await_ranks("its start", [never()], TIMEOUT_S, who=who))
    assert fault.value.component == "reward model actor"
    assert str(fault.value) == (
        "the reward model actor (pkg.RM) did not arrive: its start did not finish within "
        "engine.startup_timeout_s=1 s; raise engine.startup_timeout_s"
    )
