"""What a train rank reads while it starts or loads a checkpoint, as the driver sees it
(rlpost.runtime.rank_io): a load that keeps reading outlasts trainer.collective_timeout_s, one
that stops reading is cut off a timeout after its last read."""

from __future__ import annotations

import asyncio
import mmap
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from rlpost.runtime import rank_calls, rank_io
from rlpost.runtime.failures import RunFault
from rlpost.runtime.rank_calls import await_ranks
from rlpost.runtime.rank_io import ReadMeter, metered, reads_seen

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/fdinfo"), reason="needs /proc")

TIMEOUT_S = 2.0  # a loaded machine may pause a thread for a good part of a second


@pytest.fixture(autouse=True)
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rank_io, "METER_S", 0.05)
    monkeypatch.setattr(rank_calls, "PROGRESS_POLL_S", 0.05)
    monkeypatch.setattr(rank_calls, "RANK_GRACE_S", 0.1)


def seen(folder: Path, rank: int = 0) -> int:
    path = folder / f"rank_{rank}"
    return int(path.read_text()) if path.exists() else 0


def next_change(folder: Path, rank: int, before: int) -> int:
    """The meter's count once it has moved past `before` (within 10 s)."""
    ends = time.monotonic() + 10
    while seen(folder, rank) == before and time.monotonic() < ends:
        time.sleep(0.01)
    return seen(folder, rank)


def test_a_meter_counts_reads_under_its_roots_and_nothing_else(tmp_path: Path) -> None:
    loaded, other = tmp_path / "ckpt", tmp_path / "elsewhere"
    loaded.mkdir()
    other.mkdir()
    for folder in (loaded, other):
        torch.save({"w": torch.zeros(1 << 16)}, folder / "state.pt")
    reads = tmp_path / "reads"
    with ReadMeter(reads, 3, [str(loaded)]):
        time.sleep(0.3)
        assert seen(reads, 3) == 0  # this process reads all the time, but nothing there
        with open(other / "state.pt", "rb") as f:
            f.read(1000)
            time.sleep(0.3)
        assert seen(reads, 3) == 0
        count = 0
        with open(loaded / "state.pt", "rb", buffering=0) as f:
            for _ in range(3):  # each read of a load moves its offset: one change each
                f.read(1000)
                count = next_change(reads, 3, count)
            assert count == 3
            time.sleep(0.3)  # stuck in a read: the offset stands still
            assert seen(reads, 3) == count
        assert next_change(reads, 3, count) == count + 1  # closed: one more change
        time.sleep(0.3)
        assert seen(reads, 3) == count + 1
    assert reads_seen(reads) == count + 1


def test_a_read_through_a_memory_map_counts_as_its_pages_come_in(tmp_path: Path) -> None:
    """safetensors (and torch.load(mmap=True)) read a file through a map: no offset moves,
    but each page read becomes resident in the map."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    loaded, other = tmp_path / "ckpt", tmp_path / "elsewhere"
    loaded.mkdir()
    other.mkdir()
    (other / "data").write_bytes(os.urandom(16 << 20))
    (loaded / "data").write_bytes(os.urandom(16 << 20))
    reads = tmp_path / "reads"
    with ReadMeter(reads, 0, [str(loaded)]):
        with (
            open(other / "data", "rb") as f,
            mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m,
        ):
            for step in range(3):
                m[(2 + 4 * step) << 20]  # a page read in
                time.sleep(0.15)
        assert seen(reads) == 0  # mapped, but not under the roots
        with (
            open(loaded / "data", "rb") as f,
            mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m,
        ):
            count = next_change(reads, 0, 0)  # opened and mapped
            # pages 4 MB apart: each its own fault, past any read-around or huge page (2 MB)
            for step in range(3):
                m[(2 + 4 * step) << 20]
                assert next_change(reads, 0, count) > count
                count = seen(reads)
            time.sleep(0.3)  # no page read: it stands still
            assert seen(reads) == count
        count = next_change(reads, 0, count)  # closed and unmapped
        # a safetensors load, as a rank's model load from an HF folder
        save_file({"w": torch.randn(1 << 20)}, loaded / "model.safetensors")
        with safe_open(loaded / "model.safetensors", "pt") as f:
            assert next_change(reads, 0, count) > count
            count = seen(reads)
            f.get_tensor("w")
            assert next_change(reads, 0, count) > count


def test_the_driver_sums_every_ranks_file_and_skips_what_it_cannot_read(tmp_path: Path) -> None:
    assert reads_seen(tmp_path / "none") == 0
    (tmp_path / "rank_0").write_text("100")
    (tmp_path / "rank_1").write_text("23")
    (tmp_path / "rank_2").write_text("")  # never (the files are renamed in), but harmless
    (tmp_path / ".rank_3.77").write_text("5")  # a meter's staging file
    assert reads_seen(tmp_path) == 123


def slow_load(data: Path, seconds: float, then_hang: bool = False) -> int:
    """A rank loading: it reads `data` a chunk at a time for `seconds`, then returns, or
    hangs (as one stuck in a collective after its load)."""
    ends = time.monotonic() + seconds
    chunks = 0
    with open(data, "rb", buffering=0) as f:
        while time.monotonic() < ends:
            if not f.read(1024):
                f.seek(0)
            chunks += 1
            time.sleep(0.05)
    if then_hang:
        threading.Event().wait(3600)
    return chunks


def on_a_thread(fn: Callable[..., int], *args: Any) -> asyncio.Future[int]:
    """`fn(*args)` on a daemon thread (as a rank's call runs in its own process): one that
    hangs is left behind, where asyncio.to_thread's would hold up asyncio.run's end."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[int] = loop.create_future()

    def run() -> None:
        result = fn(*args)
        loop.call_soon_threadsafe(lambda: future.done() or future.set_result(result))

    threading.Thread(target=run, daemon=True).start()
    return future


def test_a_load_that_keeps_reading_outlasts_the_timeout_and_a_stalled_one_does_not(
    tmp_path: Path,
) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "shard").write_bytes(os.urandom(64 << 10))
    reads = tmp_path / "reads"

    async def ranks(then_hang: bool) -> list[int]:
        load = (slow_load, ckpt / "shard", 2 * TIMEOUT_S, then_hang)
        calls = [on_a_thread(metered, str(reads), 0, [str(ckpt)], *load)]
        return await await_ranks(
            "loading the checkpoint", calls, TIMEOUT_S, progress=lambda: reads_seen(reads)
        )

    assert asyncio.run(ranks(then_hang=False))[0] > 10
    started = time.monotonic()
    with pytest.raises(RunFault, match=r"rank\(s\) \[0\] did not arrive: loading the checkpoint"):
        asyncio.run(asyncio.wait_for(ranks(then_hang=True), timeout=30))
    # it read for 2 timeouts, then was cut off one timeout after its last read
    assert 3 * TIMEOUT_S < time.monotonic() - started < 3 * TIMEOUT_S + 10
