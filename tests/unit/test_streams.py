"""stdout and stderr that outlive their reader (rlpost.streams): a pipe whose read end is
closed takes the guarded stream to /dev/null, and the process ends with its own status."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlpost.streams import GuardedStream

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def closed_pipe() -> Iterator[int]:
    """The write end of a pipe whose reader has gone."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    yield write_end
    os.close(write_end)


def is_devnull(fd: int) -> bool:
    return os.fstat(fd).st_rdev == os.stat(os.devnull).st_rdev


def test_a_write_into_a_closed_pipe_sends_the_stream_to_devnull(closed_pipe: int) -> None:
    guarded = GuardedStream(os.fdopen(os.dup(closed_pipe), "w"))
    assert guarded.write("x" * 100_000) == 100_000  # past the buffer: it writes, and fails
    assert guarded.reader_gone and is_devnull(guarded.fileno())
    assert guarded.write("later\n") == len("later\n")
    guarded.flush()
    guarded.stream.close()


def test_a_flush_into_a_closed_pipe_sends_the_stream_to_devnull(closed_pipe: int) -> None:
    guarded = GuardedStream(os.fdopen(os.dup(closed_pipe), "w"))
    guarded.writelines(["buffered, ", "not written yet\n"])
    assert not guarded.reader_gone
    guarded.flush()
    assert guarded.reader_gone and is_devnull(guarded.fileno())
    guarded.stream.close()


# a process that prints its progress (a status line, a tqdm bar, a line left in the buffer
# for the flush at exit) and ends with a status of its own
PROGRAM = """
import sys
from rlpost.streams import guard_std_streams
guard_std_streams()
from rlpost.runtime.progress import Progress, status
bar = Progress(total=2)
status("starting")
for _ in range(2):
    bar.update({"rollout/reward_mean": 0.5})
bar.close()
print("a failure message", file=sys.stderr, flush=True)
print("run directory: left in the buffer")
raise SystemExit(int(sys.argv[1]))
"""


@pytest.mark.parametrize("code", [0, 3])
@pytest.mark.parametrize("closed", ["stdout", "stdout and stderr"])
def test_a_process_whose_reader_left_exits_with_its_own_status(
    closed_pipe: int, closed: str, code: int
) -> None:
    stderr = closed_pipe if closed == "stdout and stderr" else subprocess.PIPE
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(code)],
        cwd=ROOT,
        stdout=closed_pipe,
        stderr=stderr,
        timeout=60,
        check=False,
    )
    assert done.returncode == code, done.stderr
    if closed == "stdout":
        assert done.stderr.decode() == "a failure message\n"
