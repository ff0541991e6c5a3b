"""Faults at random moments of a real run, on a seeded schedule; the run must lose nothing.

    .venv/bin/python benchmarks/chaos.py [--seed 0] [--per-kind 2] [--kinds ...]
        [--mode sync|async|fully_async] [--no-engine-fault-tolerance]
        [--collective-timeout-s 60] [--reference DIR] [overrides ...]

Kinds of fault, each delivered `--per-kind` times in one run, in an order the seed draws:

    train_rank     SIGKILL a train rank (ray::TrainActor)
    engine_actor   SIGKILL an engine's Ray actor (ray::EngineActor; its server dies with it)
    engine_server  SIGKILL an engine server (the rlpost.backends.cpu_engine child of an actor)
    router         SIGKILL the sglang-router
    reward_worker  SIGKILL a grading worker (rlpost.rewards.worker; math rewards use them)
    driver         SIGKILL the launch itself, then `run.resume=auto` in a new launch
    sigterm        SIGTERM the launch (a scheduler's time limit): it must save every rollout
                   it has logged and exit with status 143; then `run.resume=auto`
    hang           SIGSTOP a train rank: it stays alive and never answers
    disk_full      fill the checkpoint folder's file system while a save runs

The schedule is tied to loop events, not to wall-clock time, so a seed replays it: each
fault waits for a drawn number (0-2) of new records in metrics.jsonl after the previous
one, then for its target process to exist (0: the target as soon as it exists, which after
a restart is while the run starts up). Where inside a step a kill lands still depends on
the machine's speed.

The disk is really full: the run's `ckpt/` folder is a tmpfs of its own (mounting one needs
root; without it disk_full is left out and the report says so), and the fault fills it with
a ballast file once a step's record is written (its save follows), and empties it again
when the run reports the save it refused or the next record is written.

The oracle. Sync mode runs deterministic (`run.deterministic=true`) and an unfaulted run of
the same config first (or is given one made before: `--reference DIR`, the run directory
of an unfaulted launch with the same settings; its records are the oracle, so a run of other
settings fails it): every per-rollout record must equal the unfaulted one, except the
wall-clock figures (`perf/*`, `train/*time_s`, `train/*_per_s`); the engines' logprob
numerics (`train/rollout_logprob_abs_diff`) too, exactly: a deterministic run's CPU engines
compute one row per forward, so a row's numerics never depend on what else is running. Both
runs dump their samples (`run.dump_rollouts`), and a violated oracle says where the first
differing rollout's samples part (rlpost.runtime.rollout_dump.first_difference): their
tokens, the engines' logprobs, rewards, or none of them (then training differs).
The async modes cannot repeat exactly; their oracle is the sample accounting of
the `groups` records: no group trained twice, none lost (every group drawn before the last
one trained was trained, filtered, dropped as stale or cut short, or is outstanding), and
staleness within the mode's bound. After each driver kill the run is resumed at once, and
every process the killed launch had started must end (by itself, or ended by the resumed
launch: rlpost.runtime.leftovers), at the latest ORPHAN_WAIT_S after the run (one still
alive then is reported as an orphan, and killed).

Every kill of a train rank, the router or (without engine fault tolerance) an engine
restarts the run in place from its newest checkpoint: one of `run.max_restarts`, which
counts per launch (set here to the number of faults). With `engine.fault_tolerance` an
engine kill restarts only that engine: one of `engine.max_restarts_per_engine`, counted per
engine and per launch (a run restart starts the count again). A driver kill ends the
launch; the new launch's counts start at zero. A grading worker is replaced in place and a
refused save is skipped; neither counts against anything.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from rlpost.plan import build_plan
from rlpost.runtime.rollout_dump import dump_path, first_difference
from rlpost.runtime.run_state import read_loop_state
from rlpost.schema import RunConfig

ROOT = Path(__file__).resolve().parents[1]
KINDS = (
    "train_rank", "engine_actor", "engine_server", "router", "reward_worker", "driver",
    "sigterm", "hang", "disk_full",
)  # fmt: skip
RESUMED = ("driver", "sigterm")  # faults that end the launch; a new one resumes the run
# A process of the run, by its command line.
TARGETS = {
    "train_rank": ("ray::TrainActor",),
    "hang": ("ray::TrainActor",),
    "engine_actor": ("ray::EngineActor",),
    "engine_server": ("rlpost.backends.cpu_engine",),
    "router": ("sglang_router", "sglang::router"),
    "reward_worker": ("rlpost.rewards.worker",),
}
DECOUPLED = ("layout.colocate=false", "layout.train.num_gpus=1", "layout.rollout.num_gpus=1")
WALL_CLOCK = ("perf/",)
WALL_CLOCK_SUFFIXES = ("time_s", "_per_s")
ORPHAN_WAIT_S = 60.0
SAVE_REFUSED = "could not be written"
POLL_S = 0.02


@dataclass(frozen=True)
class Fault:
    kind: str
    after_records: int


def schedule(seed: int, kinds: Sequence[str], per_kind: int) -> list[Fault]:
    """`per_kind` faults of each kind in a seeded order, each after 0-2 new records (a
    disk-full fault needs a save: at least one)."""
    rng = random.Random(seed)
    order = [k for k in kinds for _ in range(per_kind)]
    rng.shuffle(order)
    return [Fault(k, max(rng.randint(0, 2), 1 if k == "disk_full" else 0)) for k in order]


@dataclass
class Outcome:
    fault: Fault
    delivered: bool = False
    survived: bool = False
    target: str = ""
    recovery_s: float | None = None
    note: str = ""


@dataclass
class Report:
    outcomes: list[Outcome]
    exit_code: int
    launches: int
    run_restarts: int
    engine_restarts: int
    wall_s: float
    reference_wall_s: float | None  # None: no unfaulted run launched here
    verdict: list[str] = field(default_factory=list)  # what the oracle found wrong
    orphans: list[str] = field(default_factory=list)
    lingered: list[tuple[float, str]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    reference: Path | None = None  # the unfaulted run given, launched before

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.verdict and not self.orphans

    def render(self) -> str:
        lines = ["kind            delivered  survived  mean recovery"]
        by_kind: dict[str, list[Outcome]] = {}
        for o in self.outcomes:
            by_kind.setdefault(o.fault.kind, []).append(o)
        for kind, outs in by_kind.items():
            rec = [o.recovery_s for o in outs if o.recovery_s is not None]
            mean = f"{sum(rec) / len(rec):.1f} s" if rec else "-"
            delivered = sum(o.delivered for o in outs)
            survived = sum(o.survived for o in outs)
            lines.append(f"{kind:<15} {delivered:>9}  {survived:>8}  {mean:>13}")
        lines.append(
            f"launches: {self.launches} (driver kills and SIGTERMs resumed), run restarts in "
            f"place: {self.run_restarts}, engine restarts: {self.engine_restarts}"
        )
        if self.reference_wall_s is not None:
            lost = (
                f"{self.wall_s - self.reference_wall_s:.1f} s lost against the unfaulted run "
                f"({self.reference_wall_s:.1f} s)"
            )
        elif self.reference is not None:
            lost = f"its records compared with {self.reference} (launched before, not timed)"
        else:
            lost = "no unfaulted run to compare"
        lines.append(f"wall: {self.wall_s:.1f} s, {lost}")
        for line in self.skipped:
            lines.append(f"left out: {line}")
        if self.lingered:
            seconds, name = max(self.lingered)
            lines.append(
                f"after driver kills, {len(self.lingered)} process(es) of the killed launch "
                f"ended, the last {seconds:.1f} s after it: {name}"
            )
        for line in self.orphans:
            lines.append(
                f"orphan after a driver kill (alive {ORPHAN_WAIT_S:g} s after the run): {line}"
            )
        verdict = "satisfied" if self.ok else "VIOLATED: " + "; ".join(self.verdict or ["-"])
        lines.append(f"exit status {self.exit_code}; oracle {verdict}")
        return "\n".join(lines)


# ---- the run's processes -----------------------------------------------------------------


def run_processes(driver: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return [psutil.Process(driver), *psutil.Process(driver).children(recursive=True)]
    return []


def find(driver: int, kind: str, newer_than: float = 0.0) -> psutil.Process | None:
    """The first process of `kind` (by pid) among the launch's descendants, started after
    `newer_than` (a time.time())."""
    for process in sorted(run_processes(driver)[1:], key=lambda p: p.pid):
        with contextlib.suppress(psutil.Error):
            line = " ".join(process.cmdline())
            if (
                any(name in line for name in TARGETS[kind])
                and _running(process)
                and process.create_time() > newer_than
            ):
                return process
    return None


def describe(process: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return f"{process.pid} {' '.join(process.cmdline())[:80]}"
    return str(process.pid)


# ---- the disk ------------------------------------------------------------------------------


class SmallDisk:
    """A tmpfs of `size_mb` at `path`, and a ballast file that fills it."""

    def __init__(self, path: Path, size_mb: int) -> None:
        self.path, self.size_mb = path, size_mb
        self.ballast = path / "ballast"
        self.mounted = False

    def mount(self) -> str | None:
        """Mount it; the reason when that is not possible."""
        self.path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m", "tmpfs", str(self.path)],
            capture_output=True, text=True,
        )  # fmt: skip
        self.mounted = done.returncode == 0
        return None if self.mounted else (done.stderr.strip() or "mount failed")

    def fill(self) -> None:
        free = os.statvfs(self.path).f_bavail * os.statvfs(self.path).f_frsize
        with self.ballast.open("wb") as f, contextlib.suppress(OSError):
            os.posix_fallocate(f.fileno(), 0, max(free, 1))

    def empty(self) -> None:
        self.ballast.unlink(missing_ok=True)

    @property
    def full(self) -> bool:
        return self.ballast.exists()

    def unmount(self) -> None:
        if self.mounted:
            self.empty()
            subprocess.run(["umount", "-l", str(self.path)], check=False)


# ---- one run under faults ------------------------------------------------------------------


class Chaos:
    """Launch, deliver the faults in order as their events come, resume after a driver kill,
    and note which faults the run got past (a record written after it, or the run's end)."""

    def __init__(
        self,
        faults: list[Fault],
        args: list[str],
        run_dir: Path,
        log: Path,
        num_rollout: int,
        disk: SmallDisk | None,
    ) -> None:
        self.args, self.run_dir, self.log = args, run_dir, log
        self.num_rollout, self.disk = num_rollout, disk
        self.outcomes = [Outcome(f) for f in faults]
        self.launches = 0
        self.orphans: list[str] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.seen = 0  # metrics.jsonl lines seen
        self.records = 0  # record events: lines written, redone rollouts included
        self.launch_records = 0  # record events when the current launch started
        self.last_rollout = -1
        self.open: list[tuple[Outcome, float, int]] = []  # delivered, not yet got past
        self.filled_at: int | None = None  # record count when the disk was filled
        self.refusals = 0
        self.filling: Outcome | None = None
        # the processes of killed launches, until they end: (process, killed at, what)
        self.killed: dict[int, tuple[psutil.Process, float, str]] = {}
        self.lingered: list[tuple[float, str]] = []  # how long each outlived its launch

    def run(self) -> int:
        self._launch(resume=False)
        since = 0.0  # when the previous fault was delivered
        for outcome in self.outcomes:
            fault, start = outcome.fault, self.records
            if not self._wait(self._records_past(start, fault.after_records)):
                break
            target = None
            if fault.kind in TARGETS:
                target = self._target(fault, since)
                if target is None:
                    break
            self._deliver(outcome, target)
            since = time.time()
        # watch until the launch ends: a full disk delivered last is emptied once a save is
        # refused or a record follows (_poll), as any other; unwatched, every later save would
        # be refused and the run would end on its last one
        self._wait(lambda: False)
        assert self.proc is not None
        code = self.proc.wait()
        self._poll()
        if code == 0:
            for outcome, at, _ in self.open:
                outcome.survived, outcome.recovery_s = True, time.monotonic() - at
        if self.disk is not None:
            self.disk.empty()
        self._orphans()
        return code

    def _records_past(self, start: int, count: int) -> Callable[[], bool]:
        """Whether `count` records came after the `start`-th."""
        return lambda: self.records - start >= count

    def _target(self, fault: Fault, since: float) -> psutil.Process | None:
        """The process to hit, once there is one. After 0 records: one started since the
        previous fault (a start-up), or whichever there is once the next record comes."""
        records = self.records
        found: list[psutil.Process] = []

        def there() -> bool:
            fresh = fault.after_records == 0 and self.records == records
            process = find(self._pid(), fault.kind, newer_than=since if fresh else 0.0)
            found[:] = [process] if process is not None else []
            return bool(found)

        return found[0] if self._wait(there) else None

    def _pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def _launch(self, resume: bool) -> None:
        command = [sys.executable, str(ROOT / "launch.py"), *self.args]
        if resume:
            command.append("run.resume=auto")
        self.launch_records = self.records
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.launches += 1

    def _wait(self, until: Callable[[], bool]) -> bool:
        """Poll until `until()`; False when the launch exits first."""
        assert self.proc is not None
        while True:
            self._poll()
            if until():
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(POLL_S)

    def _poll(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            lines = (self.run_dir / "metrics.jsonl").read_text().splitlines()
            if len(lines) > self.seen:
                self.records += len(lines) - self.seen
                self.last_rollout = int(json.loads(lines[-1])["rollout_id"])
            self.seen = len(lines)  # a restart drops the records of the rollouts it redoes
        now = time.monotonic()
        for pid, (process, since, name) in list(self.killed.items()):
            if not _running(process):
                self.lingered.append((now - since, name))
                del self.killed[pid]
        for outcome, at, records in list(self.open):
            if self.records > records:
                outcome.survived, outcome.recovery_s = True, now - at
                self.open.remove((outcome, at, records))
        if self.filled_at is not None and self.disk is not None:
            refused = self._text().count(SAVE_REFUSED) > self.refusals
            if refused or self.records > self.filled_at:
                self.disk.empty()
                self.filled_at = None
                if self.filling is not None:
                    self.filling.note = (
                        "a save was refused" if refused else "no save ran while it was full"
                    )

    def _text(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")
        return ""

    def _deliver(self, outcome: Outcome, target: psutil.Process | None) -> None:
        kind = outcome.fault.kind
        if kind == "disk_full":
            assert self.disk is not None
            if self.last_rollout >= self.num_rollout - 2:
                outcome.note = "not delivered: the run's last save must succeed"
                return
            self.refusals = self._text().count(SAVE_REFUSED)
            self.disk.fill()
            self.filled_at, self.filling = self.records, outcome
            outcome.target = "ckpt/ (tmpfs)"
        else:
            if kind in RESUMED:
                target = psutil.Process(self._pid())
            assert target is not None
            outcome.target = describe(target)
            sent = {"hang": signal.SIGSTOP, "sigterm": signal.SIGTERM}.get(kind, signal.SIGKILL)
            try:
                members = run_processes(self._pid())[1:] if kind in RESUMED else []
                target.send_signal(sent)
            except psutil.Error as exc:
                outcome.note = f"not delivered: {exc}"
                return
            if kind == "sigterm" and not self._stopped_with_everything_saved(outcome):
                outcome.delivered = True  # and never survived
                self._after_driver_kill(members)
                return
            if kind in RESUMED:
                self._after_driver_kill(members)
        outcome.delivered = True
        self.open.append((outcome, time.monotonic(), self.records))

    def _stopped_with_everything_saved(self, outcome: Outcome) -> bool:
        """After a SIGTERM: the launch exited with 143, and when it had logged a rollout of
        its own, its newest checkpoint holds every rollout logged (before that, a launch
        still starting saves nothing, and the records past its checkpoint are redone), and
        one more when that rollout's record waits for its evaluation (`Unfinished`)."""
        assert self.proc is not None
        code = self.proc.wait()
        self._poll()
        logged = self.records > self.launch_records
        # killed by the signal itself: only in the instant before the launch's Python handles
        # it (its interpreter starting), with nothing of its own to save
        if code != 143 and not (code == -signal.SIGTERM and not logged):
            outcome.note = f"exit status {code} after SIGTERM, not 143"
            return False
        saves = (self.run_dir / "ckpt").glob("rollout_*")
        newest = max((int(p.name.removeprefix("rollout_")) for p in saves), default=0)
        if logged and newest == self.last_rollout + 2:
            waiting = read_loop_state(self.run_dir / "ckpt" / f"rollout_{newest}").unfinished
            newest -= bool(waiting and waiting["metrics"] is not None)
        if logged and newest != self.last_rollout + 1:
            outcome.note = (
                f"stopped with {self.last_rollout + 1} rollouts logged and the newest "
                f"checkpoint at rollout {newest}"
            )
            return False
        return True

    def _after_driver_kill(self, members: list[psutil.Process]) -> None:
        """Resume at once, as a user would; every process the killed launch had started
        must end, by itself or ended by the resumed launch (watched from here on, see _poll
        and _orphans)."""
        assert self.proc is not None
        self.proc.wait()
        now = time.monotonic()
        for process in members:
            self.killed[process.pid] = (process, now, describe(process))
        self._launch(resume=True)

    def _orphans(self) -> None:
        """What the killed launches left behind: given ORPHAN_WAIT_S after the run to end."""
        deadline = time.monotonic() + ORPHAN_WAIT_S
        while self.killed and time.monotonic() < deadline:
            time.sleep(0.1)
            self._poll()
        for process, _, name in self.killed.values():
            self.orphans.append(name)
            with contextlib.suppress(psutil.Error):
                process.kill()
        self.killed.clear()


def _running(process: psutil.Process) -> bool:
    try:
        running: bool = process.is_running() and process.status() != psutil.STATUS_ZOMBIE
        return running
    except psutil.Error:
        return False


# ---- the oracle ----------------------------------------------------------------------------


def run_restarts(log: str) -> int:
    """The run's restarts in place that a launch's output tells of."""
    return log.count("[rlpost] restarting from")


def engine_restarts(log: str) -> int:
    """The engines restarted by engine fault tolerance that a launch's output tells of: one
    that died or hung while serving ("serves again at"), and one killed while it started
    (started again by the pool). Without fault tolerance an engine's death while starting is
    the run's fault ("the engine 0 died while starting ..."), a restart of the run."""
    return log.count("serves again at") + log.count("; starting it again")


def records_of(run_dir: Path) -> list[dict[str, object]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def wall_clock(key: str) -> bool:
    return key.startswith(WALL_CLOCK) or key.endswith(WALL_CLOCK_SUFFIXES)


def same_records(run_dir: Path, reference: Path) -> list[str]:
    """Sync and deterministic: every record equal to the unfaulted run's (see the module)."""
    ours, theirs = records_of(run_dir), records_of(reference)
    if len(ours) != len(theirs):
        return [f"{len(ours)} records against {len(theirs)} in the unfaulted run"]
    found, first = [], None
    for a, b in zip(ours, theirs, strict=True):
        keys = sorted(set(a) | set(b))
        differ = [k for k in keys if not wall_clock(k) and a.get(k) != b.get(k)]
        if differ:
            found.append(f"rollout {a.get('rollout_id')}: {', '.join(differ[:5])} differ")
            first = a.get("rollout_id") if first is None else first
    if isinstance(first, int):  # where that rollout's samples part
        where = first_difference(dump_path(run_dir, first), dump_path(reference, first))
        found.insert(0, f"rollout {first}'s samples: {where}")
    return found


def accounting(run_dir: Path, num_rollout: int, batch_size: int, bound: int) -> list[str]:
    """Async modes: every group trained once, none lost, staleness within the bound."""
    records = records_of(run_dir)
    found = []
    if [r["rollout_id"] for r in records] != list(range(num_rollout)):
        found.append(f"rollouts {[r['rollout_id'] for r in records]} logged")
    groups = [r["groups"] for r in records]
    trained = [i for g in groups for i in g["trained"]]  # type: ignore[index]
    if len(trained) != len(set(trained)):
        twice = sorted(i for i, n in Counter(trained).items() if n > 1)
        found.append(f"groups {twice} trained twice")
    if len(trained) != num_rollout * batch_size:
        found.append(f"{len(trained)} groups trained, not {num_rollout * batch_size}")
    accounted = set(trained) | set(groups[-1]["outstanding"])  # type: ignore[index]
    for g in groups:
        for what in ("filtered", "dropped_stale", "cut_short"):
            accounted |= set(g[what])  # type: ignore[index]
    lost = sorted(set(range(max(trained, default=-1) + 1)) - accounted)
    if lost:
        found.append(f"groups {lost} lost")
    worst = max((float(r["rollout/staleness_max"]) for r in records), default=0.0)  # type: ignore[arg-type]
    if worst > bound:
        found.append(f"staleness {worst:g} past its bound {bound}")
    return found


# ---- a benchmark run -----------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    seed: int = 0
    per_kind: int = 2
    kinds: tuple[str, ...] = KINDS
    mode: str = "sync"
    rollouts: int | None = None  # None: enough for the schedule
    engine_fault_tolerance: bool = True
    overrides: tuple[str, ...] = ()
    disk_mb: int = 256
    collective_timeout_s: float = 60.0
    workdir: Path | None = None
    keep: bool = False  # keep the runs' folders (and say where)
    # the run directory of an unfaulted sync run with these settings, made before: compared
    # with, and none launched (its num_rollout is the run's unless `rollouts` says it)
    reference: Path | None = None


def launch_args(settings: Settings, run_dir: Path, faults: int, rollouts: int) -> list[str]:
    mode = settings.mode
    args = [
        f"recipe.rollout.num_rollout={rollouts}", "recipe.save.interval=1",
        "recipe.eval.interval=null", f"run.max_restarts={faults + 1}",
        f"trainer.collective_timeout_s={settings.collective_timeout_s}",
        "run.progress=false", f"run.dir={run_dir}", f"hydra.run.dir={run_dir.parent / 'hydra'}",
    ]  # fmt: skip
    if mode == "sync":  # the samples too, to say where a violated oracle parts
        args += ["run.deterministic=true", "run.dump_rollouts=true"]
    else:
        args += [*DECOUPLED, f"recipe.loop.mode={mode}"]
    if settings.engine_fault_tolerance:
        args += [
            "engine.fault_tolerance=true", "engine.health_check_interval_s=0.5",
            f"engine.max_restarts_per_engine={faults + 1}",
        ]  # fmt: skip
    return [*args, *settings.overrides]


def run_config(run_dir: Path) -> dict[str, object]:
    import yaml

    loaded: dict[str, object] = yaml.safe_load((run_dir / "config.yaml").read_text())
    return loaded


def given_rollouts(reference: Path) -> int:
    """The num_rollout of a run made before (its config.yaml); a ValueError where `reference`
    is no finished run's directory."""
    if not (reference / "metrics.jsonl").is_file() or not (reference / "config.yaml").is_file():
        raise ValueError(
            f"reference {reference}: not the run directory of a finished launch (no "
            "metrics.jsonl or config.yaml there); give the run.dir of an unfaulted sync run"
        )
    run = RunConfig.model_validate(run_config(reference))
    return run.recipe.rollout.num_rollout


def bench(settings: Settings) -> Report:
    if settings.reference is not None and settings.mode != "sync":
        raise ValueError(
            f"reference {settings.reference}: only a sync run is compared with an unfaulted "
            f"one; --mode {settings.mode} checks its sample accounting instead (leave "
            "--reference out)"
        )
    given = None if settings.reference is None else given_rollouts(settings.reference)
    kinds = list(settings.kinds)
    skipped = []
    with contextlib.ExitStack() as stack:
        if settings.keep:
            work = Path(tempfile.mkdtemp(prefix="chaos-", dir=settings.workdir))
            print(f"runs and logs in {work}", flush=True)
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=settings.workdir)))
        disk = None
        if "disk_full" in kinds:
            disk = SmallDisk(work / "chaos" / "run" / "ckpt", settings.disk_mb)
            why = disk.mount()
            if why is not None:
                kinds.remove("disk_full")
                skipped.append(f"disk_full (a tmpfs for ckpt/ could not be mounted: {why})")
                disk = None
        try:
            faults = schedule(settings.seed, kinds, settings.per_kind)
            rollouts = settings.rollouts or given or 2 * len(faults) + 4
            reference_wall, reference = None, settings.reference
            if settings.mode == "sync" and reference is None:
                reference = work / "reference" / "run"
                args = launch_args(settings, reference, len(faults), rollouts)
                started = time.monotonic()
                subprocess.run(
                    [sys.executable, str(ROOT / "launch.py"), *args],
                    cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                )  # fmt: skip
                reference_wall = time.monotonic() - started
            run_dir = work / "chaos" / "run"
            run_dir.mkdir(parents=True, exist_ok=True)
            log = work / "chaos" / "run.log"
            chaos = Chaos(
                faults, launch_args(settings, run_dir, len(faults), rollouts), run_dir, log,
                rollouts, disk,
            )  # fmt: skip
            started = time.monotonic()
            code = chaos.run()
            wall = time.monotonic() - started
            text = log.read_text(errors="replace")
            report = Report(
                outcomes=chaos.outcomes,
                exit_code=code,
                launches=chaos.launches,
                run_restarts=run_restarts(text),
                engine_restarts=engine_restarts(text),
                wall_s=wall,
                reference_wall_s=reference_wall,
                reference=settings.reference,
                orphans=chaos.orphans,
                lingered=chaos.lingered,
                skipped=skipped,
            )
            if code != 0:
                report.verdict.append(f"the run ended with exit status {code}:\n{text[-2000:]}")
            elif reference is not None:  # sync
                report.verdict += same_records(run_dir, reference)
            else:
                # the staleness bound the run ran under: the plan's (fully_async's default is
                # derived there, not written in the config)
                run = RunConfig.model_validate(run_config(run_dir))
                bound = build_plan(run).runtime.loop.max_staleness
                batch = run.recipe.rollout.batch_size
                report.verdict += accounting(run_dir, rollouts, batch, bound)
            report.verdict += [
                f"sigterm: {o.note}"
                for o in report.outcomes
                if o.fault.kind == "sigterm" and o.delivered and o.note
            ]
            missed = [o for o in report.outcomes if not o.delivered]
            if missed:
                report.skipped.append(
                    f"{len(missed)} fault(s) not delivered before the run ended: "
                    + ", ".join(f"{o.fault.kind} {o.note}".strip() for o in missed)
                )
            return report
        finally:
            if disk is not None:
                disk.unmount()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-kind", type=int, default=2)
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--mode", choices=("sync", "async", "fully_async"), default="sync")
    parser.add_argument("--rollouts", type=int, default=None)
    parser.add_argument("--no-engine-fault-tolerance", action="store_true")
    parser.add_argument("--disk-mb", type=int, default=256)
    parser.add_argument(
        "--collective-timeout-s", type=float, default=60.0,
        help="trainer.collective_timeout_s: how long a hung rank holds the run",
    )  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the runs' folders and logs")
    parser.add_argument(
        "--reference", type=Path, default=None, metavar="DIR",
        help="the run.dir of an unfaulted sync run with the same settings, made before: "
        "compared with, and no unfaulted run launched",
    )  # fmt: skip
    parser.add_argument("overrides", nargs="*", help="config overrides for both runs")
    ns = parser.parse_args()
    settings = Settings(
        seed=ns.seed,
        per_kind=ns.per_kind,
        kinds=tuple(ns.kinds),
        mode=ns.mode,
        rollouts=ns.rollouts,
        engine_fault_tolerance=not ns.no_engine_fault_tolerance,
        overrides=tuple(ns.overrides),
        disk_mb=ns.disk_mb,
        collective_timeout_s=ns.collective_timeout_s,
        keep=ns.keep,
        reference=ns.reference,
    )
    faults = schedule(settings.seed, settings.kinds, settings.per_kind)
    print(f"schedule (seed {settings.seed}): " + ", ".join(
        f"{f.kind}@+{f.after_records}" for f in faults))  # fmt: skip
    try:
        report = bench(settings)
    except ValueError as exc:
        parser.error(str(exc))
    for o in report.outcomes:
        state = "survived" if o.survived else ("delivered" if o.delivered else "not delivered")
        rec = f" after {o.recovery_s:.1f} s" if o.recovery_s is not None else ""
        print(f"  {o.fault.kind:<14} +{o.fault.after_records}  {state}{rec}  {o.target} {o.note}")
    print(report.render())
    sys.exit(0 if report.ok else 1)


if __name__ == "__main__":
    main()
