"""The log a train rank or the reward model's actor keeps under the run's logs/, beside the
engines' and the router's: what it prints (stdout, stderr: its Python logging reaches there),
and a fatal signal's Python stack (faulthandler), so that a run directory alone says what a
process printed before it died. What it prints still reaches Ray's worker log, and from there
the launch's terminal, as before; the stack of a fatal signal goes to this file only (a
process has one faulthandler file), and the fault that names the dead actor names the file."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import socket
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

__all__ = ["log_to", "note", "reward_model_log", "train_rank_log"]

LOGS_DIR = "logs"  # under run.dir, beside engine_<i>.log, router.log and failures.log
REWARD_MODEL_LOG = "reward_model.log"


def train_rank_log(run_dir: Path, rank: int) -> Path:
    return run_dir / LOGS_DIR / f"train_rank_{rank}.log"


def reward_model_log(run_dir: Path) -> Path:
    return run_dir / LOGS_DIR / REWARD_MODEL_LOG


class _Tee:
    """A text stream that writes to `stream` (what the process wrote to before) and to
    `file`; everything else (fileno, isatty, encoding) is the stream's."""

    def __init__(self, stream: Any, file: IO[str]) -> None:
        self.stream, self.file = stream, file

    def write(self, text: str) -> int:
        written: int = self.stream.write(text)
        with contextlib.suppress(ValueError, OSError):  # a full disk costs the file, not the run
            self.file.write(text)
        return written

    def flush(self) -> None:
        self.stream.flush()
        with contextlib.suppress(ValueError, OSError):
            self.file.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def log_to(path: Path, who: str) -> None:
    """This process's stdout and stderr also to `path` (appended: a restart or a resume in
    the same run directory adds to it, after a line saying `who` starts), and a fatal signal's
    Python stack of every thread to it. Call it first in the actor, before anything logs: a
    logging handler made earlier holds the stream it was given. Called again (another path),
    the earlier file is let go. A file it cannot open (a run directory this node does not
    mount, which the run's start-up then reports as such) is said on stderr and skipped: the
    actor's constructor must not fail, or its death would say less than that check does."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        file = path.open("a", buffering=1, encoding="utf-8")  # line-buffered: a kill loses no line
    except OSError as exc:
        print(f"rlpost: {who} keeps no log at {path}: {exc}", file=sys.stderr, flush=True)
        return
    _stamped(file, f"{who} starts (pid {os.getpid()} on {socket.gethostname()})")
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, _Tee):
            stream.file.close()
            stream = stream.stream
        setattr(sys, name, _Tee(stream, file))
    faulthandler.enable(file=file, all_threads=True)


def note(text: str) -> None:
    """A line with the time in this process's log (`log_to`) alone, not on the terminal: what
    the process is about to do, so that the last one says what it was doing if it dies."""
    stream = sys.stderr
    if isinstance(stream, _Tee):
        with contextlib.suppress(ValueError, OSError):
            _stamped(stream.file, text)


def _stamped(file: IO[str], text: str) -> None:
    file.write(f"--- {datetime.now(UTC).isoformat(timespec='seconds')} {text}\n")
