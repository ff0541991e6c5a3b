"""stdout and stderr that outlive their reader.

`launch.py ... | head`, `2>&1 | tee log` whose tee is killed: the reader of a command's
output may leave while the command still has work to do. What a run leaves on disk
(metrics.jsonl, checkpoints, the run directory) is its record; what it prints is for whoever
watches. So the first write that finds its stream's reader gone points that stream's file
descriptor at /dev/null, and the command goes on writing nowhere, to end with the status it
would have had (a finished run 0, a refusal 2, a failed run 3, a stopped one 143).

The guard sits on sys.stdout and sys.stderr, not around each print: every writer that looks
the stream up when it writes goes through it (print, Ray's forwarding of its workers' output
to the driver, Python's flush at exit), and so does every writer handed the stream after the
guard went in (tqdm's bar, the logging handlers Hydra, Ray and rlpost make). A writer that
holds the descriptor itself (C code, a child process) finds /dev/null there once the guard
has seen the reader gone.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any, TextIO, cast


def to_devnull(stream: TextIO) -> None:
    """Point the stream's file descriptor at /dev/null: what it holds unwritten, and all that
    is written to it from now on, go nowhere."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, stream.fileno())
    finally:
        os.close(devnull)


class GuardedStream:
    """A text stream whose closed pipe is sent to /dev/null instead of raising
    BrokenPipeError; everything else is the stream's own."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.reader_gone = False

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self._reader_left()
            return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            self._reader_left()

    def _reader_left(self) -> None:
        to_devnull(self.stream)
        self.reader_gone = True
        self.stream.flush()  # what the failed write left in the buffer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def guard_std_streams() -> None:
    """sys.stdout and sys.stderr outlive their reader from now on, for the rest of the
    process (its flush at exit included). Idempotent."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, GuardedStream):
            setattr(sys, name, cast(TextIO, GuardedStream(stream)))
