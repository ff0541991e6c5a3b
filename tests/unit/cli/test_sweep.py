"""The sweep summary: one row per job, from each job's metrics, written and printed."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from rlpost.cli import launch
from rlpost.cli.sweep import (
    JobOutcome,
    JobSummary,
    SweepSummary,
    not_run,
    summarize_job,
    sweep_exit_status,
    write_summary,
)
from rlpost.runtime.failures import (
    EXIT_INTERRUPTED,
    EXIT_RUN_FAILED,
    FAILURES_LOG,
    RunFailed,
    RunInterrupted,
    RunStopped,
    interrupted,
    stopped,
)
from rlpost.runtime.stop import EXIT_STOPPED, Terminated

REPO = Path(__file__).resolve().parents[3]


def write_metrics(run_dir: Path, records: list[dict[str, float]]) -> None:
    run_dir.mkdir(parents=True)
    lines = [json.dumps({"rollout_id": i, **r}) for i, r in enumerate(records)]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_job_summary_takes_final_reward_best_eval_and_median_step(tmp_path: Path) -> None:
    write_metrics(
        tmp_path / "0",
        [
            {"rollout/reward_mean": 0.1, "perf/step_time_s": 9.0, "eval/a/accuracy": 0.2},
            {"rollout/reward_mean": 0.3, "perf/step_time_s": 1.0},
            {"rollout/reward_mean": 0.2, "perf/step_time_s": 2.0, "eval/a/accuracy": 0.6},
        ],
    )
    job = summarize_job(0, "recipe.optim.lr=1e-4", tmp_path / "0", "completed")
    assert (job.rollouts, job.final_reward, job.best_eval_accuracy, job.step_time_s) == (
        3, 0.2, 0.6, 2.0
    )  # fmt: skip
    empty = summarize_job(1, "", tmp_path / "missing", "failed")
    assert (empty.rollouts, empty.final_reward, empty.best_eval_accuracy) == (0, None, None)
    text = write_summary(tmp_path, [job, empty])
    assert "recipe.optim.lr=1e-4" in text and "0.60" in text
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert [JobSummary(**j) for j in saved] == [job, empty]


def test_multirun_writes_and_prints_the_summary(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "launch.py"),
            "-m",
            "mode=plan",
            "recipe.optim.lr=1e-4,2e-4",
            "run.seed=3",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "sweep summary" in done.stdout
    table = (sweep_dir / "summary.txt").read_text()
    rows = [line.split() for line in table.splitlines()[3:]]
    # only what differs between jobs is shown, as typed (Hydra gives the jobs 0.0001 and
    # 0.0002); plan jobs trained nothing and say so
    assert [row[:5] for row in rows] == [
        ["0", "recipe.optim.lr=1e-4", "plan", "printed", "-"],
        ["1", "recipe.optim.lr=2e-4", "plan", "printed", "-"],
    ]
    saved = json.loads((sweep_dir / "summary.json").read_text())
    assert [(j["status"], j["rollouts"]) for j in saved] == [("plan printed", None)] * 2


SWEEP = ["recipe.optim.lr=1e-6,1e-5,1e-4", "run.seed=3"]


@pytest.fixture
def started() -> Iterator[Callable[[Path], SweepSummary]]:
    """A sweep started in `sweep_dir`, as Hydra starts one (its callback holds Ctrl-C and
    SIGTERM between jobs): whatever the test leaves, this process's handlers are restored
    and no sweep runs afterwards, as the launcher's own end does (launch._sweep_over)."""
    made: list[SweepSummary] = []

    def start(sweep_dir: Path) -> SweepSummary:
        summary = SweepSummary()
        config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep_dir)}}})
        config.hydra.overrides = {"task": SWEEP}
        summary.on_multirun_start(config)
        made.append(summary)
        return summary

    yield start
    for summary in made:
        summary.signals.restore()
    SweepSummary.running = None


def ended(summary: SweepSummary, num: int, run_dir: Path, value: object) -> None:
    """Job `num` of the sweep ends, returning `value` (Hydra's JobReturn, as its launcher
    fills it in)."""
    job = JobReturn()
    job.overrides = summary.planned[num]
    job.cfg = OmegaConf.create({"mode": "train", "run": {"dir": str(run_dir)}})
    job.hydra_cfg = OmegaConf.create(
        {"hydra": {"mode": RunMode.MULTIRUN, "job": {"num": num}, "runtime": {"output_dir": ""}}}
    )
    job.status = JobStatus.COMPLETED
    job.return_value = value
    summary.on_job_end(OmegaConf.create(), job)


def saved(sweep_dir: Path) -> list[tuple[str, str, int | None]]:
    jobs = json.loads((sweep_dir / "summary.json").read_text())
    return [(j["overrides"], j["status"], j["exit_status"]) for j in jobs]


def test_a_failed_job_is_summarized_as_it_ends_and_the_sweep_exits_with_its_status(
    tmp_path: Path, started: Callable[[Path], SweepSummary]
) -> None:
    summary = started(tmp_path)
    run_dir = tmp_path / "0"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "logs" / FAILURES_LOG).write_text("Traceback ...\n")
    failure = RunFailed("ValueError: bad reward\n    caused by KeyError: 'x'", run_dir, None)
    ended(summary, 0, run_dir, JobOutcome.of_failure(failure))
    # written at once: a sweep killed now still says what ran, and what did not
    # as typed, not as Hydra hands them to the jobs (1e-06, 1e-05, 0.0001)
    lrs = ["recipe.optim.lr=1e-6", "recipe.optim.lr=1e-5", "recipe.optim.lr=1e-4"]
    assert saved(tmp_path) == [
        (lrs[0], "failed", 3), (lrs[1], "not run", None), (lrs[2], "not run", None)
    ]  # fmt: skip
    write_metrics(tmp_path / "1", [{"rollout/reward_mean": 0.5}])
    ended(summary, 1, tmp_path / "1", None)
    write_metrics(tmp_path / "2", [{"rollout/reward_mean": 0.5}])
    ended(summary, 2, tmp_path / "2", None)
    with pytest.raises(SystemExit) as exited:
        summary.on_multirun_end(OmegaConf.create())
    assert exited.value.code == EXIT_RUN_FAILED
    assert saved(tmp_path) == [
        (lrs[0], "failed", 3),
        (lrs[1], "completed", 0),
        (lrs[2], "completed", 0),
    ]
    job = json.loads((tmp_path / "summary.json").read_text())[0]
    assert job["reason"] == "ValueError: bad reward"
    assert job["logs"] == str(run_dir / "logs" / FAILURES_LOG)
    text = (tmp_path / "summary.txt").read_text()
    assert (
        f"job 0 failed: ValueError: bad reward\n  logs: {run_dir / 'logs' / FAILURES_LOG}" in text
    )


def test_a_stopped_job_ends_the_sweep_with_the_jobs_after_it_not_run(
    tmp_path: Path, started: Callable[[Path], SweepSummary]
) -> None:
    summary = started(tmp_path)
    write_metrics(tmp_path / "0", [{"rollout/reward_mean": 0.5}])
    ended(summary, 0, tmp_path / "0", None)
    stop = RunStopped("SIGTERM; every finished rollout (1) is in x", tmp_path / "1", None)
    with pytest.raises(SystemExit) as exited:
        ended(summary, 1, tmp_path / "1", JobOutcome.of_failure(stop))
    assert exited.value.code == EXIT_STOPPED
    assert [status for _, status, _ in saved(tmp_path)] == ["completed", "stopped", "not run"]
    ctrl_c = RunInterrupted("interrupted (Ctrl-C)", tmp_path / "0", None)
    assert JobOutcome.of_failure(ctrl_c).status == "interrupted"


def test_jobs_are_shown_and_relaunched_by_their_overrides_as_typed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Hydra hands the jobs `+recipe.note=0.001` for `+recipe.note=1e-3`: the summary and
    the launches printed for the jobs not run say what was typed, the latter with its '+'
    (without it, Hydra refuses a key the config does not have)."""
    summary = SweepSummary()
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    config.hydra.sweep.subdir = "${hydra.job.num}"
    config.hydra.overrides = {"task": ["+recipe.note=1e-3,2e-3", "recipe.optim.lr=1e-5"]}
    summary.on_multirun_start(config)
    try:
        summary.interrupt()
    finally:
        summary.signals.restore()
        SweepSummary.running = None
    assert [o for o, _, _ in saved(tmp_path)] == ["recipe.note=1e-3", "recipe.note=2e-3"]
    out = capsys.readouterr().out
    assert (
        "  job 1 (not run): python launch.py +recipe.note=2e-3 recipe.optim.lr=1e-5 "
        f"hydra.run.dir={tmp_path / '1'}\n"
    ) in out, out


def test_the_sweep_exit_status() -> None:
    def job(status: str, exit_status: int | None) -> JobSummary:
        return JobSummary(0, "", "", status, None, None, None, None, exit_status)

    done, failed, refused = job("completed", 0), job("failed", 3), job("refused", 2)
    assert sweep_exit_status([done, job("plan printed", 0)]) == 0
    assert sweep_exit_status([refused, failed, done]) == 3
    assert sweep_exit_status([refused, done]) == 2
    assert sweep_exit_status([failed, job("stopped", 143), job("not run", None)]) == 143
    assert sweep_exit_status([failed, job("interrupted", 130)]) == 130


def test_an_evaluation_before_the_first_rollout_is_no_rollout(tmp_path: Path) -> None:
    write_metrics(
        tmp_path / "0",
        [{"eval/a/accuracy": 0.25}, {"rollout/reward_mean": 0.5, "eval/a/accuracy": 0.5}],
    )
    job = summarize_job(0, "", tmp_path / "0", "completed")
    assert (job.rollouts, job.best_eval_accuracy) == (1, 0.5)


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., int]]:
    """launch.main on `argv`, each Hydra job doing what `job` does; its exit status."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    monkeypatch.setattr(sys, "argv", ["launch.py"])

    def run(argv: list[str], job: Callable[[DictConfig], None]) -> int:
        try:
            launch.main(argv, job)
        except SystemExit as exc:
            return int(exc.code or 0)
        except KeyboardInterrupt:
            pytest.fail("Ctrl-C went past the launch, to end it with a traceback")
        return 0

    yield run
    HydraConfig.instance().cfg = None  # type: ignore[assignment]
    GlobalHydra.instance().clear()
    SweepSummary.running = None


@pytest.fixture
def sweep(tmp_path: Path, launched: Callable[..., int]) -> Callable[..., int]:
    """A sweep of three mode=plan jobs, composed, checked and summarized as any sweep is,
    each job doing what `job` does; its exit status."""
    argv = ["-m", "mode=plan", *SWEEP, f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    return lambda job: launched(argv, job)


def test_a_job_that_raises_what_nothing_expected_fails_and_the_next_job_starts(
    tmp_path: Path, sweep: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    ran: list[str] = []

    def job(cfg: DictConfig) -> None:
        launch.launch_job(cfg)
        ran.append(str(cfg.run.dir))
        if len(ran) == 2:
            raise RuntimeError("a bug in the driver")

    assert sweep(job) == EXIT_RUN_FAILED
    sweep_dir = tmp_path / "sweep"
    assert ran == [str(sweep_dir / str(n)) for n in range(3)]  # the sweep went on
    assert [status for _, status, _ in saved(sweep_dir)] == [
        "plan printed", "failed", "plan printed"
    ]  # fmt: skip
    log = sweep_dir / "1" / "logs" / FAILURES_LOG
    assert "Traceback" in log.read_text() and "RuntimeError: a bug in the driver" in log.read_text()
    err = capsys.readouterr().err
    assert "rlpost: the run failed: RuntimeError: a bug in the driver" in err
    assert "Traceback" not in err
    job_1 = json.loads((sweep_dir / "summary.json").read_text())[1]
    assert (job_1["reason"], job_1["logs"]) == ("RuntimeError: a bug in the driver", str(log))


def test_ctrl_c_ends_a_single_launch_with_130_and_no_traceback(
    tmp_path: Path, launched: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run.seed=3", f"hydra.run.dir={tmp_path / 'run'}"]

    def starting(cfg: DictConfig) -> None:
        raise KeyboardInterrupt  # while the launch plans, checks or starts its run

    assert launched(argv, starting) == EXIT_INTERRUPTED
    assert capsys.readouterr().err == "rlpost: interrupted (Ctrl-C) before the run started\n"

    def training(cfg: DictConfig) -> None:
        raise interrupted(tmp_path / "run", 0)  # what the run raises on KeyboardInterrupt

    assert launched(argv, training) == EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert "rlpost: the run stopped: interrupted (Ctrl-C)" in err
    assert FAILURES_LOG not in err  # nothing failed: no traceback was written to point at


def test_a_failed_fork_that_saved_its_own_checkpoint_says_a_command_that_continues_it(
    tmp_path: Path, launched: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    """A fork (run.resume=<another run's checkpoint>) fails after its own first save: it
    continues with run.resume=auto, and adding that to its command would be refused as
    run.resume given two values. The message gives the whole command with run.resume
    replaced, and that command launches as printed."""
    forked = tmp_path / "exp1" / "ckpt" / "rollout_40"
    fork = tmp_path / "fork"
    argv = ["run.seed=3", f"run.dir={fork}", f"run.resume={forked}", "recipe.optim.lr=1e-5"]
    argv.append(f"hydra.run.dir={tmp_path / 'hydra'}")

    def failing(cfg: DictConfig) -> None:
        raise RunFailed("a train rank died", fork, fork / "ckpt" / "rollout_42")

    assert launched(argv, failing) == EXIT_RUN_FAILED
    err = capsys.readouterr().err
    (hint,) = [line for line in err.splitlines() if "to continue:" in line]
    printed = shlex.split(hint.split("to continue: ", 1)[1])
    assert printed == [
        "python", "launch.py", "run.seed=3", "recipe.optim.lr=1e-5",
        f"hydra.run.dir={tmp_path / 'hydra'}", f"run.dir={fork}", "run.resume=auto",
    ]  # fmt: skip
    resumed: list[str] = []
    assert launched(printed[2:], lambda cfg: resumed.append(cfg.run.resume)) == 0
    assert resumed == ["auto"]


def test_ctrl_c_while_a_job_starts_ends_the_sweep_saying_what_ran_and_how_to_run_the_rest(
    tmp_path: Path,
    sweep: Callable[..., int],
    launched: Callable[..., int],
    capsys: pytest.CaptureFixture[str],
) -> None:
    def job(cfg: DictConfig) -> None:
        if cfg.recipe.optim.lr == 1e-5:
            raise KeyboardInterrupt  # while job 1 plans, checks or starts its run
        launch.launch_job(cfg)

    assert sweep(job) == EXIT_INTERRUPTED
    sweep_dir = tmp_path / "sweep"
    assert [status for _, status, _ in saved(sweep_dir)] == [
        "plan printed", "interrupted", "not run"
    ]  # fmt: skip
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert err.endswith("rlpost: sweep interrupted (Ctrl-C)\n")
    assert out.endswith(
        f"sweep summary: {sweep_dir / 'summary.txt'}\n"
        "the sweep ended before its last job\n"
        "finished, in their run directories:\n"
        f"  job 0: {sweep_dir / '0'}\n"
        "to run the rest, one launch each:\n"
        "  job 1 (interrupted): python launch.py mode=plan recipe.optim.lr=1e-5 run.seed=3 "
        f"hydra.run.dir={sweep_dir / '1'}\n"
        "  job 2 (not run): python launch.py mode=plan recipe.optim.lr=1e-4 run.seed=3 "
        f"hydra.run.dir={sweep_dir / '2'}\n"
    )
    # the launch printed for a job runs it where the sweep would have: in the sweep's folder
    # (the job's Hydra folder, which is a training job's run.dir)
    from hydra.core.hydra_config import HydraConfig

    printed = shlex.split(out.splitlines()[-1].split(": ", 1)[1])
    assert printed[:2] == ["python", "launch.py"]
    ran: list[str] = []

    def where(cfg: DictConfig) -> None:
        launch.launch_job(cfg)
        ran.append(HydraConfig.get().runtime.output_dir)

    assert launched(printed[2:], where) == 0
    assert ran == [str(sweep_dir / "2")]


def test_a_sigterm_while_a_job_starts_ends_the_sweep_saying_what_ran_and_how_to_run_the_rest(
    tmp_path: Path, sweep: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    """A scheduler's time limit (SIGTERM) between jobs: the sweep says what it did and did
    not do, as after a Ctrl-C, and exits 143."""

    def job(cfg: DictConfig) -> None:
        if cfg.recipe.optim.lr == 1e-5:
            raise Terminated  # what SIGTERM raises while job 1 plans, checks or starts its run
        launch.launch_job(cfg)

    assert sweep(job) == EXIT_STOPPED
    sweep_dir = tmp_path / "sweep"
    assert [status for _, status, _ in saved(sweep_dir)] == [
        "plan printed", "stopped", "not run"
    ]  # fmt: skip
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert err.endswith("rlpost: sweep stopped by SIGTERM\n")
    assert out.endswith(
        "to run the rest, one launch each:\n"
        "  job 1 (stopped): python launch.py mode=plan recipe.optim.lr=1e-5 run.seed=3 "
        f"hydra.run.dir={sweep_dir / '1'}\n"
        "  job 2 (not run): python launch.py mode=plan recipe.optim.lr=1e-4 run.seed=3 "
        f"hydra.run.dir={sweep_dir / '2'}\n"
    )


SIGNAL_ON_IMPORT = """\
import os
import signal

os.kill(os.getpid(), signal.{name})


def reward(sample):
    return 0.0
"""


@pytest.mark.parametrize(
    ("name", "status", "said"),
    [
        ("SIGTERM", EXIT_STOPPED, "stopped by SIGTERM"),
        ("SIGINT", EXIT_INTERRUPTED, "interrupted (Ctrl-C)"),
    ],
)
def test_a_signal_while_the_sweep_checks_its_jobs_ends_it_saying_that_no_job_ran(
    tmp_path: Path, name: str, status: int, said: str
) -> None:
    """SIGTERM or Ctrl-C before a sweep's first job begins (here while its jobs are checked:
    the reward hook, imported by the check, signals its own process) ends it there with the
    stopped launch's status, and says that it is the sweep that stopped, that no job ran and
    that the same command runs it, where it said "before the run started". The launch runs
    as a user's does, in a process of its own: Ctrl-C with a terminal's handler (a test
    process may hold SIGINT ignored, started in the background, or another's handler)."""
    module = f"signal_on_import_{name.lower()}"
    (tmp_path / f"{module}.py").write_text(SIGNAL_ON_IMPORT.format(name=name))
    sweep_dir = tmp_path / "sweep"
    command = [
        sys.executable, "-c",
        "import signal, sys, runpy; signal.signal(signal.SIGINT, signal.default_int_handler); "
        f"sys.argv = sys.argv[1:]; runpy.run_path({str(REPO / 'launch.py')!r}, "
        "run_name='__main__')",
        "launch.py", "-m", "mode=plan", *SWEEP,
        f"recipe.rollout.reward.custom_function={module}.reward",
        f"hydra.sweep.dir={sweep_dir}",
    ]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == status, done.stderr[-2000:]
    assert "Traceback" not in done.stdout + done.stderr
    assert done.stderr.endswith(
        f"rlpost: sweep {said} before its first job started: no job ran and nothing was "
        "written; the same command runs the whole sweep\n"
    ), done.stderr[-2000:]
    assert not sweep_dir.exists()


def test_ctrl_c_during_a_job_s_run_ends_the_sweep_and_the_rest_continues_it(
    tmp_path: Path, sweep: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    def job(cfg: DictConfig) -> None:
        launch.launch_job(cfg)
        if cfg.recipe.optim.lr == 1e-6:
            checkpoint = Path(cfg.run.dir) / "checkpoints" / "iter_0000002"
            raise RunInterrupted("interrupted (Ctrl-C)", Path(cfg.run.dir), checkpoint)

    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert sweep(job) == EXIT_INTERRUPTED
    # the job ended the sweep with Ctrl-C and SIGTERM held between jobs: they are not left so
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
    sweep_dir = tmp_path / "sweep"
    assert [status for _, status, _ in saved(sweep_dir)] == ["interrupted", "not run", "not run"]
    out, err = capsys.readouterr()
    assert "rlpost: the run stopped: interrupted (Ctrl-C)" in err
    assert "finished, in their run directories" not in out
    launch_0 = "python launch.py mode=plan recipe.optim.lr=1e-6 run.seed=3"
    resume = f"run.dir={sweep_dir / '0'} run.resume=auto hydra.run.dir={sweep_dir / '0'}"
    assert f"  job 0 (interrupted): {launch_0} {resume}\n" in out


def test_a_forked_job_stopped_before_its_first_save_continues_from_the_checkpoint_it_forked(
    tmp_path: Path, sweep: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    """A job resumed from another run's checkpoint and stopped before it saved one of its own:
    its launch continues from that checkpoint (run.resume=<it>), where run.resume=auto in the
    job's run.dir would find none and start at rollout 0."""
    forked = tmp_path / "exp1" / "ckpt" / "rollout_40"

    def job(cfg: DictConfig) -> None:
        launch.launch_job(cfg)
        if cfg.recipe.optim.lr == 1e-6:
            raise stopped(None, Path(cfg.run.dir), 0, resumed=forked)

    assert sweep(job) == EXIT_STOPPED
    sweep_dir = tmp_path / "sweep"
    out = capsys.readouterr().out
    launch_0 = "python launch.py mode=plan recipe.optim.lr=1e-6 run.seed=3"
    resume = f"run.dir={sweep_dir / '0'} run.resume={forked} hydra.run.dir={sweep_dir / '0'}"
    assert f"  job 0 (stopped): {launch_0} {resume}\n" in out, out


def ctrl_c_at_its_default() -> None:
    """In a child before it starts: Ctrl-C at its default, as a terminal's command has it,
    whether or not these tests were started with it ignored (in the background, under
    nohup), which the child would inherit."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_between_the_jobs_of_a_launched_sweep(tmp_path: Path) -> None:
    # jobs that only print their plan follow each other quickly: the signal comes once the
    # first has ended, while a later one starts or runs
    sweep_dir = tmp_path / "sweep"
    lrs = ",".join(f"{n}e-6" for n in range(1, 13))
    argv = ["-m", "mode=plan", f"recipe.optim.lr={lrs}", f"hydra.sweep.dir={sweep_dir}"]
    launched = subprocess.Popen(
        [sys.executable, str(REPO / "launch.py"), *argv],
        cwd=tmp_path,
        preexec_fn=ctrl_c_at_its_default,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (sweep_dir / "summary.json").is_file() and launched.poll() is None:
        assert time.monotonic() < deadline, "the sweep's first job did not end"
        time.sleep(0.01)
    launched.send_signal(signal.SIGINT)
    out, err = launched.communicate(timeout=60)
    assert launched.returncode == EXIT_INTERRUPTED, err[-3000:]
    assert "Traceback" not in out + err
    assert "rlpost: sweep interrupted (Ctrl-C)" in err
    statuses = [status for _, status, _ in saved(sweep_dir)]
    done = statuses.count("plan printed")
    interrupted = statuses.count("interrupted")
    assert done >= 1 and interrupted <= 1 and statuses[-1] == "not run"
    assert statuses == ["plan printed"] * done + ["interrupted"] * interrupted + ["not run"] * (
        12 - done - interrupted
    )
    assert f"  job 0: {sweep_dir / '0'}\n" in out
    assert "to run the rest, one launch each:\n" in out


@pytest.mark.parametrize(
    ("subdir", "folder"),
    [
        ("${hydra.job.num}", "a sweep, it's here/2"),
        ("job_${hydra.job.num}", "a sweep, it's here/job_2"),
        ("${hydra.job.override_dirname}", None),  # more than the job's number: not guessed
    ],
)
def test_the_launch_printed_for_a_job_not_run_lands_in_its_folder_of_the_sweep(
    tmp_path: Path, subdir: str, folder: str | None
) -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    summary = SweepSummary()
    sweep_dir = tmp_path / "a sweep, it's here"
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep_dir), "subdir": subdir}}})
    config.hydra.overrides = {"task": SWEEP}
    summary.on_multirun_start(config)
    try:
        summary.finished = True  # nothing printed when the test ends
        command = summary._command(not_run(2, ""))
    finally:
        summary.signals.restore()
        SweepSummary.running = None
    placed = [o for o in command if o.startswith("hydra.run.dir=")]
    if folder is None:
        assert placed == []
        return
    # Hydra reads the quoted folder back as it is, spaces, comma and quote included
    (override,) = OverridesParser.create().parse_overrides(placed)
    assert override.value() == str(tmp_path / folder)
