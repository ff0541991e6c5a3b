"""How a run that has started ends when something fails, and which failures a restart mends.

A fault (`RunFault`) is a part of the run that died or hung: a train rank, an engine, the
router, the driver's actors, a collective that timed out. Starting the run again from its
newest complete checkpoint mends it, and `run.max_restarts` does so. Anything else (a reward
hook that raises, a generate hook that returns garbage, a bug) would fail the same way again:
the run ends. Either way the launcher prints one message (`RunFailed.render`): what failed, the run
directory and the newest checkpoint to resume from, and exits with EXIT_RUN_FAILED. A run
stopped by SIGTERM (`RunStopped`) says the same and exits with EXIT_STOPPED, one Ctrl-C
ended (`RunInterrupted`) with EXIT_INTERRUPTED.
"""

from __future__ import annotations

import re
import shlex
import signal
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from rlpost.runtime.remote_errors import remote_cause
from rlpost.runtime.stop import EXIT_STOPPED, Stopped

EXIT_RUN_FAILED = 3
EXIT_INTERRUPTED = 128 + signal.SIGINT  # what a shell reports for a process Ctrl-C ended
FAILURES_LOG = "failures.log"  # in <run.dir>/logs: each failure's whole traceback
RESUME_KEYS = frozenset({"run.dir", "run.resume"})  # what continuing a run sets anew


class RunFault(RuntimeError):
    """A part of the run died or stopped answering; a restart from a checkpoint mends it."""

    def __init__(self, message: str, component: str = "") -> None:
        super().__init__(message)
        self.component = component


def actor_died(exc: BaseException | None) -> bool:
    """Whether `exc` says a Ray actor or worker process is gone (killed, crashed, its node
    lost)."""
    if exc is None:
        return False
    import ray.exceptions as rex

    gone = (
        rex.RayActorError,
        rex.WorkerCrashedError,
        rex.NodeDiedError,
        rex.ObjectLostError,
        rex.OwnerDiedError,
    )
    return isinstance(exc, gone)


def constructor_raised(exc: BaseException | None) -> bool:
    """Whether `exc` says an actor died because its constructor raised: rlpost's actors
    build nothing there that could fail one time and not the next (their work starts in
    later calls), so it fails the same way again and no restart mends it."""
    return actor_died(exc) and "raised in its creation task" in str(exc)


def cured_by_restart(exc: BaseException | None) -> bool:
    """Whether `exc` says an actor's process or node is gone (killed, crashed, lost), which
    a restart mends, not that its constructor raised."""
    return actor_died(exc) and not constructor_raised(exc)


def death_cause(exc: BaseException) -> str:
    """Why `exc` (Ray's word that an actor died) says the actor died, in one line. Ray's own
    text runs to a dozen lines (the actor's ids, its namespace, a list of common causes);
    logs/failures.log keeps it whole. Ray cannot tell which signal ended a process: one killed
    by SIGKILL, by the kernel's OOM killer, or that crashed, ended without a word."""
    text = str(exc)
    fields = dict(re.findall(r"^\t(\w+): (.*)$", text, re.MULTILINE))
    pid, ip = fields.get("pid"), fields.get("ip")
    where = " on ".join(part for part in (pid and f"pid {pid}", ip) if part)
    process = f"its process ({where})" if where else "its process"
    if "Worker unexpectedly exits" in text:
        return f"{process} ended without a word: killed (SIGKILL, the OOM killer) or crashed"
    if "NODE_OUT_OF_MEMORY" in text:
        return f"Ray's memory monitor killed {process}: its node ran low on memory"
    if "raised in its creation task" in text:  # the traceback's last line says what
        return f"its constructor raised {text.strip().splitlines()[-1].strip()}"
    because = re.search(r"^The actor is dead because (.*?)(?: Some common causes|$)", text, re.M)
    if because is not None:
        why = because.group(1).strip().rstrip(".")
        return f"{why} ({where})" if where else why
    return " ".join(text.split())


def killed_while_starting(exc: BaseException, parts: Mapping[str, str] | None = None) -> str | None:
    """The part (engine, router, another actor) that `exc` says was killed while it started
    (a signal, its actor gone), rather than failing on its own (a bad model folder or router
    option fails the same way every time); None when it says neither. `parts`: the part each
    actor other than the engines is, by its actor id (hex); a dead actor not among them is an
    engine's."""
    from rlpost.backends.sglang.process import EngineStartError
    from rlpost.runtime.router import RouterError

    if isinstance(exc, RouterError) and exc.killed:
        return "router"
    if cured_by_restart(exc):
        actor_id = getattr(exc, "actor_id", None)
        return (parts or {}).get(actor_id, "engine") if isinstance(actor_id, str) else "engine"
    cause = remote_cause(exc)
    return "engine" if isinstance(cause, EngineStartError) and cause.killed else None


@dataclass(frozen=True)
class ActorPart:
    """One of the run's actors as a failure names it: `part`, the RunFault's component
    (engine, train rank, ...); `name`, which one ("train rank 1"); `log`, what it writes
    under the run's logs, where it writes there."""

    part: str
    name: str
    log: Path | None = None


def death_fault(
    exc: BaseException, actors: Mapping[str, ActorPart], starting: bool
) -> RunFault | None:
    """Ray's own word that one of the run's actors died (`exc`, many lines) as a RunFault in
    one line: which actor (`actors`, by actor id), why (`death_cause`), and its log. None when
    `exc` is no such word (a RunFault already says it in its own)."""
    if not actor_died(exc):
        return None
    actor_id = getattr(exc, "actor_id", None)
    named = actors.get(actor_id) if isinstance(actor_id, str) else None
    if named is None:
        named = ActorPart("actor", f"Ray actor {actor_id}" if actor_id else "Ray actor")
    when = " while starting" if starting else ""
    log = f"; its log: {named.log}" if named.log is not None and named.log.exists() else ""
    return RunFault(f"the {named.name} died{when} ({death_cause(exc)}){log}", component=named.part)


def is_fault(exc: BaseException) -> bool:
    """Whether a restart can mend `exc` (it or its cause is a fault)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, RunFault) or cured_by_restart(current):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def describe(exc: BaseException) -> str:
    """The failure in a line or two: the exception and its first cause, no traceback (nor
    Ray's many lines on an actor that died: `death_cause`)."""
    text = f"{type(exc).__name__}: {said(exc)}"
    cause = exc.__cause__
    if cause is not None and said(cause) and said(cause) not in text:
        text += f"\n    caused by {type(cause).__name__}: {said(cause)}"
    return text


def said(exc: BaseException) -> str:
    """What `exc` says, in one line where it is Ray's word that an actor died."""
    return death_cause(exc) if actor_died(exc) else str(exc)


def record_failure(run_dir: Path, exc: BaseException) -> None:
    """The whole traceback, for whoever debugs it: appended to logs/failures.log (the
    message on the terminal stays one failure, no traceback)."""
    log_dir = run_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    text = "".join(traceback.format_exception(exc))
    with (log_dir / FAILURES_LOG).open("a", encoding="utf-8") as f:
        f.write(f"--- {datetime.now(UTC).isoformat(timespec='seconds')}\n{text}\n")


@dataclass
class RunFailed(Exception):
    """A run that started and could not finish."""

    what: str
    run_dir: Path
    checkpoint: Path | None
    restarts: int = 0
    evaluation: bool = False  # mode=eval: it saves no checkpoint and resumes none
    waits: str | None = None  # what the checkpoint holds for the continued run to do first

    exit_status = EXIT_RUN_FAILED
    headline = "the run failed"

    def __str__(self) -> str:
        return self.render()

    def render(self, command: Sequence[str] | None = None) -> str:
        """The message; `command`: the launch's flags and overrides, when known, for the
        whole command that continues the run."""
        lines = [f"rlpost: {self.headline}: {self.what}", f"  run directory: {self.run_dir}"]
        if self.restarts:
            lines.append(f"  restarted {self.restarts} time(s) before giving up")
        if self.evaluation:
            lines.append("  an evaluation saves no checkpoint: launch it again to evaluate anew")
        elif self.checkpoint is not None:
            lines.append(f"  newest usable checkpoint: {self.checkpoint}")
            if self.waits:
                lines.append(f"  {self.waits}")
            lines.append(f"  to continue: {self.continue_command(command)}")
        else:
            lines.append("  no checkpoint was saved yet")
        lines.append(self._logs())
        return "\n".join(lines)

    def continue_command(self, command: Sequence[str] | None = None) -> str:
        """What continues the run from its newest checkpoint: `command` (the launch's flags
        and overrides) with its run.dir and run.resume replaced, as a whole command line; the
        two overrides alone when the command is not known. Adding them to a command that
        already gives another run.resume (a fork's run.resume=<path>) would be refused as a
        key given two values."""
        assert self.checkpoint is not None  # only a run that has one is continued
        value = resume_value(self.checkpoint, self.run_dir)
        resume = [f"run.dir={self.run_dir}", f"run.resume={value}"]
        if command is None:
            return (
                f"launch again with {' '.join(resume)} (replacing any run.dir= or run.resume= "
                "the launch was given)"
            )
        kept = [t for t in command if t.split("=", 1)[0].lstrip("+~") not in RESUME_KEYS]
        return shlex.join(["python", "launch.py", *kept, *resume])

    def _logs(self) -> str:
        logs = self.run_dir / "logs"
        return f"  logs: {logs} (the traceback: {logs / FAILURES_LOG})"


class RunInterrupted(RunFailed):
    """A run that Ctrl-C ended (KeyboardInterrupt): the launch exits with 130, and a sweep
    ends (its next job does not start). Nothing failed, so no traceback is recorded."""

    exit_status = EXIT_INTERRUPTED
    headline = "the run stopped"

    def _logs(self) -> str:
        return f"  logs: {self.run_dir / 'logs'}"


class RunStopped(RunFailed):
    """A run that stopped when asked to (SIGTERM: rlpost.runtime.stop)."""

    exit_status = EXIT_STOPPED
    headline = "the run stopped"

    def _logs(self) -> str:
        return f"  logs: {self.run_dir / 'logs'}"


def resume_value(checkpoint: Path, run_dir: Path) -> str:
    """run.resume for continuing in `run_dir` from `checkpoint`: `auto` for one of the run's
    own (the newest), its path for another run's (a fork that has saved none of its own yet,
    where `auto` would find nothing and start at rollout 0)."""
    if checkpoint.resolve().is_relative_to(run_dir.resolve()):
        return "auto"
    return str(checkpoint)


def _newest_checkpoint(run_dir: Path, resumed: Path | None = None) -> Path | None:
    """The run's newest checkpoint; before it has one, `resumed`: the checkpoint the launch
    started from (another run's, for a fork), which is still where it continues from."""
    from rlpost.runtime import checkpoint

    return checkpoint.scan(run_dir, check_hashes=False).latest or resumed


def failed(
    what: str,
    run_dir: Path,
    restarts: int,
    evaluation: bool = False,
    resumed: Path | None = None,
) -> RunFailed:
    """What the launch says when the run could not finish: `what`, and where to resume (an
    evaluation, mode=eval, resumes nothing; `resumed`: the checkpoint the launch started
    from)."""
    checkpoint = None if evaluation else _newest_checkpoint(run_dir, resumed)
    waits = _record_waiting(checkpoint) if checkpoint is not None else None
    return RunFailed(what, run_dir, checkpoint, restarts, evaluation, waits)


def _record_waiting(checkpoint: Path) -> str | None:
    """What `checkpoint` holds of a rollout whose record waits for its evaluation (the save
    before a failed evaluation ended the run, or a stop's), for the message: the continued
    run does that evaluation first. None where nothing waits, or loop.json cannot say."""
    from rlpost.runtime.run_state import read_loop_state

    try:
        unfinished = read_loop_state(checkpoint).unfinished
    except (OSError, ValueError, TypeError):  # the resume that reads it says what is wrong
        return None
    if not unfinished or unfinished.get("metrics") is None:
        return None
    rollout = int(unfinished["rollout_id"])
    return (
        f"the evaluation after rollout {rollout + 1} waits in it: the continued run does it "
        f"first, and logs rollout {rollout}'s record with it"
    )


def interrupted(
    run_dir: Path, restarts: int, evaluation: bool = False, resumed: Path | None = None
) -> RunInterrupted:
    """What the launch says when Ctrl-C ended the run."""
    checkpoint = None if evaluation else _newest_checkpoint(run_dir, resumed)
    return RunInterrupted("interrupted (Ctrl-C)", run_dir, checkpoint, restarts, evaluation)


def stopped(
    halted: Stopped | None,
    run_dir: Path,
    restarts: int,
    save_error: str = "",
    evaluation: bool = False,
    resumed: Path | None = None,
) -> RunStopped:
    """What the launch says when SIGTERM stopped it: `halted`, the loop's Stopped (None: it
    stopped elsewhere, or its save failed with `save_error`); an evaluation resumes nothing;
    `resumed`: the checkpoint the launch started from."""
    if halted is None:
        what = "SIGTERM" + (f"; the save it asked for failed: {save_error}" if save_error else "")
    elif halted.saved is not None:
        what = f"SIGTERM; every finished rollout ({halted.done}) is in {halted.saved}"
        if halted.waiting:
            verb = "are" if len(halted.waiting) > 1 else "is"
            what += (
                f" ({' and '.join(halted.waiting)} due after rollout {halted.done} {verb} done "
                "first when the run continues)"
            )
    else:
        what = f"SIGTERM after rollout {halted.done}"
    checkpoint = None if evaluation else _newest_checkpoint(run_dir, resumed)
    return RunStopped(what, run_dir, checkpoint, restarts, evaluation)
