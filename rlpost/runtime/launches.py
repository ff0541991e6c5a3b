"""How each launch of a run began and how it ended, and what run.resume=auto does next.

launches.jsonl gets a line as each launch begins (a first start, a resume, a restart in place:
rlpost.runtime.rundir.prepare_run_dir), launch_ends.jsonl one as it ends, naming the start it
ends by its place in launches.jsonl (`launch`, 0 for the first). A second file keeps
launches.jsonl one line per launch, as every reader of it has it. An end says the outcome, the
exit status, the last rollout trained, the newest checkpoint saved and, for a failure or a
stop, what happened in a line. A driver that dies (SIGKILL, the OOM killer, a lost machine)
writes no end: a start without one is a launch that ended without a word, or one still running
while a process holds the run directory's lock.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import yaml

from rlpost.errors import EXIT_INTERNAL_ERROR, UserError
from rlpost.runtime import checkpoint
from rlpost.runtime.failures import RunFailed, describe
from rlpost.runtime.metrics import read_metrics
from rlpost.runtime.progress import status
from rlpost.runtime.rundir import CONFIG_FILE, LAUNCHES_FILE, LOCK_FILE, lock_holder
from rlpost.runtime.stop import EXIT_STOPPED, Terminated

ENDS_FILE = "launch_ends.jsonl"
Outcome = Literal["finished", "restarted", "stopped", "interrupted", "failed", "refused"]


@dataclass(frozen=True)
class LaunchEnd:
    """How one launch ended. `exit_status` is None for a fault a restart in place mends:
    the process goes on, and the restart is the next launch."""

    outcome: Outcome
    exit_status: int | None
    what: str = ""


@dataclass(frozen=True)
class Launch:
    """A launch as its run directory tells it: its start line, its end line or None."""

    index: int
    start: dict[str, Any]
    end: dict[str, Any] | None


def ending(exc: BaseException) -> LaunchEnd | None:
    """How a launch that raised `exc` ends, as the launcher reports it; None for what ends
    the process otherwise (SystemExit)."""
    from rlpost.runtime.failures import EXIT_INTERRUPTED, RunInterrupted, RunStopped

    if isinstance(exc, RunFailed):
        outcome: Outcome = "failed"
        if isinstance(exc, RunInterrupted):
            outcome = "interrupted"
        elif isinstance(exc, RunStopped):
            outcome = "stopped"
        what = exc.what.splitlines()[0]
        if exc.restarts:
            what += f" (after {exc.restarts} restart(s))"
        return LaunchEnd(outcome, exc.exit_status, what)
    if isinstance(exc, UserError):
        first = exc.issues[0] if exc.issues else None
        what = f"{first.key}: {first.message}".splitlines()[0] if first else exc.title
        more = len(exc.issues) - 1
        return LaunchEnd("refused", 2, what + (f" (and {more} more)" if more > 0 else ""))
    if isinstance(exc, KeyboardInterrupt):
        return LaunchEnd("interrupted", EXIT_INTERRUPTED, "interrupted (Ctrl-C)")
    if isinstance(exc, Terminated):
        return LaunchEnd("stopped", EXIT_STOPPED, "SIGTERM")
    if isinstance(exc, Exception):
        what = describe(exc).splitlines()[0]
        return LaunchEnd("failed", EXIT_INTERNAL_ERROR, f"internal error: {what}")
    return None


def launch_count(run_dir: Path) -> int:
    """How many launches launches.jsonl records (the next one's index)."""
    return len(_read_lines(run_dir / LAUNCHES_FILE))


def record_end(run_dir: Path, launch: int, end: LaunchEnd) -> None:
    """Append launch `launch`'s end to launch_ends.jsonl, with what the run directory holds
    then: the last rollout trained and the newest checkpoint saved. A disk that refuses the
    line is reported, and the launch ends as it was ending (its message, its exit status)."""
    newest = checkpoint.scan(run_dir, check_hashes=False).latest
    saved = None
    if newest is not None:
        saved = {"path": str(newest), "rollouts_done": checkpoint.rollouts_done_of(newest)}
    line = {
        "launch": launch,
        "ended_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "outcome": end.outcome,
        "exit_status": end.exit_status,
        "last_rollout": last_rollout(run_dir, newest),
        "checkpoint": saved,
        "what": end.what.splitlines()[0] if end.what else "",  # the rest: failures.log
    }
    try:
        with (run_dir / ENDS_FILE).open("a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:  # a full disk: the launch still ends as it was ending
        status(f"could not record how the launch ended in {run_dir / ENDS_FILE}: {exc}")


def last_rollout(run_dir: Path, newest: Path | None) -> int | None:
    """The last rollout trained: its record's, or the newest checkpoint's last rollout when
    that is later (a SIGTERM's save keeps the stopped rollout's record for the next launch)."""
    records = read_metrics(run_dir)
    logged = max((int(r["rollout_id"]) for r in records if "rollout_id" in r), default=None)
    done = checkpoint.rollouts_done_of(newest) if newest is not None else None
    saved = done - 1 if done else None
    candidates = [n for n in (logged, saved) if n is not None]
    return max(candidates) if candidates else None


def read_launches(run_dir: Path) -> list[Launch]:
    """Every launch of the run with its end (None where none was written); a run directory
    written before ends were recorded reads as launches without ends."""
    ends: dict[int, dict[str, Any]] = {}
    for line in _read_lines(run_dir / ENDS_FILE):
        if isinstance(line.get("launch"), int):
            ends[line["launch"]] = line
    starts = _read_lines(run_dir / LAUNCHES_FILE)
    return [Launch(i, start, ends.get(i)) for i, start in enumerate(starts)]


def _read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a .jsonl file; a last line a crash cut short is skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    lines = []
    for raw in text.splitlines():
        try:
            line = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if isinstance(line, dict):
            lines.append(line)
    return lines


def running_pid(run_dir: Path) -> str | None:
    """The pid of the process that holds the run directory (a launch running now), or None."""
    try:
        fd = os.open(run_dir / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return lock_holder(run_dir)
    finally:
        os.close(fd)  # closing it lets go of a lock taken here
    return None


def describe_end(launch: Launch, running: str | None) -> str:
    """A launch's end in a line."""
    end = launch.end
    if end is None:
        if running is not None:
            return f"not yet: running now (pid {running} holds the run directory)"
        return "ended without a word: its driver was killed or crashed (no end was written)"
    text = str(end.get("outcome", "?"))
    code = end.get("exit_status")
    text += f" (exit status {code})" if code is not None else " (restarted in place)"
    if end.get("what"):
        text += f": {end['what']}"
    facts = []
    if end.get("last_rollout") is not None:
        facts.append(f"last rollout trained {end['last_rollout']}")
    saved = end.get("checkpoint")
    if isinstance(saved, dict):
        facts.append(f"newest checkpoint {saved.get('path')}")
    elif end.get("outcome") != "refused":
        facts.append("no checkpoint saved")
    if facts:
        text += f"\n      {'; '.join(facts)}"
    return text


def next_with_auto(run_dir: Path, launches: list[Launch], usable: Usable | None = None) -> str:
    """What a launch with run.resume=auto in `run_dir` would do, from the checkpoint it
    would take (`usable`: read here when not given)."""
    config = _config(run_dir)
    if config.get("mode") == "eval":
        return (
            "nothing to continue: an evaluation saves no checkpoint (launch it again to "
            "evaluate anew)"
        )
    usable = usable if usable is not None else usable_checkpoint(run_dir)
    newest = usable.newest
    if newest is None:
        if usable.broken:
            return f"refused: every checkpoint in {checkpoint.checkpoint_root(run_dir)} is broken"
        text = "start from scratch (rollout 0): the run has no checkpoint"
        forked = launches[-1].start.get("resume") if launches else None
        if forked not in (None, "auto"):
            text += f"; run.resume={forked} continues from the checkpoint it began from"
        return text
    done = checkpoint.rollouts_done_of(newest) or 0
    total = ((config.get("recipe") or {}).get("rollout") or {}).get("num_rollout")
    unfinished = _unfinished(newest)
    if isinstance(total, int) and done >= total:
        if unfinished is not None:
            from rlpost.runtime.run_state import left_by

            return (
                f"finish what {left_by(unfinished)} left of rollout {done - 1} ({newest}), "
                "then nothing: "
                f"{done} of recipe.rollout.num_rollout={total} rollouts are done"
            )
        return (
            f"nothing to continue: finished ({done} of recipe.rollout.num_rollout={total} "
            "rollouts done); raise num_rollout to train on"
        )
    return f"continue from rollout {done} ({newest})"


@dataclass(frozen=True)
class Usable:
    """The checkpoint run.resume=auto would load (None: none is whole), the broken ones
    with why, and saves that never finished (`tmp-` folders)."""

    newest: Path | None
    broken: list[checkpoint.CheckpointError]
    interrupted: list[Path]


def usable_checkpoint(run_dir: Path) -> Usable:
    """Check the checkpoints as a launch with run.resume=auto does: every file's size
    against the manifest, and the sha256 of each, newest first, until one is whole (the
    one it would load; older ones are read no further than their sizes)."""
    scan = checkpoint.scan(run_dir, check_hashes=False)
    broken = list(scan.broken)
    newest = None
    for path in scan.complete:
        try:
            checkpoint.verify(path)
        except checkpoint.CheckpointError as exc:
            broken.append(exc)
        else:
            newest = path
            break
    broken.sort(key=lambda b: checkpoint.rollouts_done_of(b.path) or 0, reverse=True)
    return Usable(newest, broken, scan.interrupted)


def describe_problems(usable: Usable) -> list[str]:
    """A line for each checkpoint run.resume=auto would not load, and each unfinished save."""
    lines = []
    newest_done = checkpoint.rollouts_done_of(usable.newest) if usable.newest else None
    for bad in usable.broken:
        done = checkpoint.rollouts_done_of(bad.path)
        later = newest_done is not None and done is not None and done > newest_done
        what = f"  {bad.unloaded()}"
        if later:
            what += f" (a resume moves it to {bad.path.parent / checkpoint.ABANDONED_DIR}/)"
        lines.append(what)
    for staging in usable.interrupted:
        lines.append(f"  {checkpoint.unfinished_save(staging)}")
    return lines


def _config(run_dir: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load((run_dir / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _unfinished(path: Path) -> dict[str, Any] | None:
    """What the checkpoint at `path` records as left of its last rollout (loop.json)."""
    from rlpost.runtime.run_state import read_loop_state

    try:
        return read_loop_state(path).unfinished
    except (OSError, ValueError, TypeError):  # no loop state, or not one this reads
        return None


def render_status(run_dir: Path) -> str:
    """Each launch of the run, how it began and ended, and what run.resume=auto does next."""
    launches = read_launches(run_dir)
    running = running_pid(run_dir)
    lines = [f"run directory: {run_dir}"]
    for launch in launches:
        start = launch.start
        how = "restart" if start.get("restart") else ("resume" if start.get("resume") else "start")
        if start.get("restart"):
            how += f" {start['restart']}"
        lines.append(
            f"  launch {launch.index}: {how} at rollout {start.get('start_rollout', '?')}, "
            f"{start.get('started_at', '?')} on {start.get('host', '?')}"
        )
        last = launch is launches[-1]
        lines.append(f"    ended: {describe_end(launch, running if last else None)}")
    if not launches:
        lines.append("  no launch recorded")
    usable = usable_checkpoint(run_dir)
    lines.extend(describe_problems(usable))
    lines.append(f"next, with run.resume=auto: {next_with_auto(run_dir, launches, usable)}")
    return "\n".join(lines)
