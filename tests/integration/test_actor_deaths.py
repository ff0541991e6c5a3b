"""What the launch says when one of the run's actors dies (SIGKILLed, as the OOM killer would
end it) while the run starts or later: one line that names the actor, its process and why,
and the log to read where it writes one under the run's logs; never Ray's own text of a dozen
lines (the actor's ids, its namespace, Ray's list of common causes), which stays in
logs/failures.log. Real actors on a local Ray, no launch around them."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from rlpost.backends.sglang.launch import EngineSpec
from rlpost.config.loader import compose_run_config
from rlpost.plan import build_plan
from rlpost.runtime.actor_log import train_rank_log
from rlpost.runtime.actors import EngineActor, TrainActor
from rlpost.runtime.engine_pool import EnginePool, HealthSettings, RayEngine
from rlpost.runtime.failures import (
    RunFault,
    death_cause,
    describe,
    is_fault,
    killed_while_starting,
)
from rlpost.runtime.rank_calls import await_ranks
from rlpost.runtime.session import Session
from rlpost.runtime.trainers import trainer_spec
from rlpost.runtime.weight_sync import WEIGHT_SYNCS, SyncContext

pytestmark = pytest.mark.integration

GONE = "ended without a word: killed (SIGKILL, the OOM killer) or crashed"


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    if ray.is_initialized():  # another test's cluster would be joined instead
        ray.shutdown()
    mp = pytest.MonkeyPatch()
    mp.setenv("RAY_enable_worker_prestart", "0")
    try:
        ray.init(
            address="local", num_cpus=2, include_dashboard=False, logging_level=logging.WARNING
        )
        yield
    finally:
        ray.shutdown()
        mp.undo()


def spec(log: Path, backend: str = "cpu") -> EngineSpec:
    """An engine's server, never started here: its actor dies first."""
    return EngineSpec(
        index=0, backend=backend, model_path="unused", host="127.0.0.1", port=1, seed=0,
        log_path=str(log), startup_timeout_s=60,
    )  # fmt: skip


def killed(actor: ray.actor.ActorHandle[EngineActor], by_ray: bool = False) -> str:
    """SIGKILL the actor's process (`by_ray`: ray.kill it), and wait until Ray has seen it
    die (either lands a moment later); what Ray then says of it: "pid <pid> on <address>"."""
    where = ray.get(actor.where.remote())
    if by_ray:
        ray.kill(actor)
    else:
        os.kill(int(where["pid"]), signal.SIGKILL)
    for _ in range(600):
        try:
            ray.get(actor.pid.remote())
        except ray.exceptions.RayActorError:
            return f"pid {where['pid']} on {where['address']}"
        time.sleep(0.1)
    raise AssertionError(f"the actor in {where} still answers a minute after its kill")


def engine_actor(log: Path) -> ray.actor.ActorHandle[EngineActor]:
    return EngineActor.options(num_cpus=0).remote(spec(log))  # type: ignore[attr-defined,no-any-return]


def test_a_train_rank_killed_while_starting_is_one_line_naming_its_process(
    local_ray: None, tmp_path: Path
) -> None:
    """As `Session.on_ranks` awaits the ranks' start (any actor stands in for a rank)."""
    actor = engine_actor(tmp_path / "engine_0.log")
    process = killed(actor)
    with pytest.raises(RuntimeError) as fault:
        asyncio.run(await_ranks("start", [actor.start.remote()], 60))
    said = f"train rank(s) [0] died during start (its process ({process}) {GONE})"
    assert str(fault.value) == said
    assert describe(fault.value) == f"RunFault: {said}"  # and not Ray's text as its cause
    assert is_fault(fault.value)


def test_an_engine_actor_killed_while_starting_is_one_line_naming_it_and_its_log(
    local_ray: None, tmp_path: Path
) -> None:
    """Ray's own word, as the engine pool's start raises it, and what the session makes of
    it while starting and later; the server's log is named once there is one."""
    run_dir = tmp_path / "run"
    cfg, _ = compose_run_config([f"run.dir={run_dir}"])
    session = Session(cfg, build_plan(cfg), run_dir)
    log = run_dir / "logs" / "engine_0.log"
    engine = RayEngine([spec(log)], lambda s: engine_actor(Path(s.log_path)))
    engine.actors = [engine_actor(log)]
    session.pool = EnginePool([engine], HealthSettings())
    process = killed(engine.actors[0])
    with pytest.raises(ray.exceptions.RayActorError) as died:
        ray.get(engine.actors[0].start.remote())
    assert describe(died.value) == f"ActorDiedError: its process ({process}) {GONE}"

    fault = asyncio.run(session.fault_behind(died.value, starting=True))
    assert fault is not None and fault.component == "engine" and is_fault(fault)
    assert str(fault) == f"the engine 0 died while starting (its process ({process}) {GONE})"
    log.parent.mkdir(parents=True)
    log.write_text("loading\n")
    fault = asyncio.run(session.fault_behind(died.value))
    assert fault is not None
    assert str(fault) == f"the engine 0 died (its process ({process}) {GONE}); its log: {log}"


def test_an_actor_stopped_or_whose_constructor_raised_is_said_in_one_line(
    local_ray: None, tmp_path: Path
) -> None:
    stopped = engine_actor(tmp_path / "engine_0.log")
    process = killed(stopped, by_ray=True)
    with pytest.raises(ray.exceptions.RayActorError) as died:
        ray.get(stopped.pid.remote())
    assert death_cause(died.value) == f"it was killed by `ray.kill` ({process})"
    assert is_fault(died.value) and killed_while_starting(died.value) == "engine"

    unbuilt = EngineActor.options(num_cpus=0).remote(spec(tmp_path / "e.log", "no-such-engine"))  # type: ignore[attr-defined]
    with pytest.raises(ray.exceptions.RayActorError) as died:
        ray.get(unbuilt.pid.remote())
    cause = death_cause(died.value)
    assert cause.startswith("its constructor raised ") and "no-such-engine" in cause, cause
    assert "\n" not in cause
    # it raises the same way again: no fault that a restart mends, no engine killed starting
    assert not is_fault(died.value) and killed_while_starting(died.value) is None
    with pytest.raises(ray.exceptions.RayActorError) as raised:  # as a rank's, not a RunFault
        asyncio.run(await_ranks("start", [unbuilt.start.remote()], 60))
    assert not is_fault(raised.value) and "no-such-engine" in describe(raised.value)


@pytest.mark.parametrize("fault_tolerance", [False, True])
def test_an_engine_whose_actor_died_is_started_again_only_with_fault_tolerance(
    local_ray: None, tmp_path: Path, fault_tolerance: bool
) -> None:
    """Without engine.fault_tolerance the death is raised as it is (the launch says it and
    restarts the run under run.max_restarts); with it, the pool starts the engine once more
    from a new actor (here one that cannot build, so nothing loads) and gives up after
    max_restarts."""
    made: list[ray.actor.ActorHandle[EngineActor]] = []

    def make(s: EngineSpec) -> ray.actor.ActorHandle[EngineActor]:
        backend = "cpu" if not made else "no-such-engine"
        made.append(EngineActor.options(num_cpus=0).remote(spec(Path(s.log_path), backend)))  # type: ignore[attr-defined]
        return made[-1]

    engine = RayEngine([spec(tmp_path / "engine_0.log")], make)
    engine.actors = [make(engine.specs[0])]
    killed(engine.actors[0])
    pool = EnginePool([engine], HealthSettings(enabled=fault_tolerance, max_restarts=1))
    with pytest.raises(ray.exceptions.RayActorError):
        asyncio.run(pool.start())
    assert len(made) == (2 if fault_tolerance else 1)
    assert asyncio.run(engine.alive()) is False


def test_a_train_rank_writes_its_log_under_the_run_dir_which_keeps_its_fatal_stack(
    local_ray: None, tmp_path: Path
) -> None:
    """What a train rank prints and logs goes to logs/train_rank_<r>.log as well as to Ray's
    worker log (the terminal's source); a fatal signal (os.abort, as a crash in a native
    library ends a rank) leaves the rank's Python stack there, and the fault names the file.
    A rank started again in the same run directory adds to it."""
    run_dir = tmp_path / "run"
    cfg, _ = compose_run_config([f"run.dir={run_dir}"])
    plan = build_plan(cfg)
    session = Session(cfg, plan, run_dir)
    spec = trainer_spec(cfg, plan, master_addr="127.0.0.1", master_port=0, num_threads=1)
    log = train_rank_log(run_dir, 0)

    def rank() -> ray.actor.ActorHandle[TrainActor]:
        return TrainActor.options(num_cpus=0).remote(spec, 0, {}, None, str(log))  # type: ignore[attr-defined,no-any-return]

    def say(actor: object) -> None:
        print("printed by the rank")
        print("printed to stderr", file=sys.stderr)
        logging.getLogger("rlpost.backends.torch_trainer").info("rlpost's note")
        logging.getLogger("torch.distributed").warning("a library's warning")
        logging.getLogger("torch.distributed").info("a library's info")

    def a_train_step_that_aborts(actor: object) -> None:
        os.abort()

    session.trainers = [rank()]
    pid = ray.get(session.trainers[0].where.remote())["pid"]
    ray.get(session.trainers[0].__ray_call__.remote(say))
    with pytest.raises(ray.exceptions.RayActorError) as died:
        ray.get(session.trainers[0].__ray_call__.remote(a_train_step_that_aborts))

    text = log.read_text()
    assert f"train rank 0 starts (pid {pid} on " in text
    for line in (
        "printed by the rank",
        "printed to stderr",
        "[rlpost] rlpost.backends.torch_trainer: rlpost's note",
        "a library's warning",
        "Fatal Python error: Aborted",
        "in a_train_step_that_aborts\n",
    ):
        assert line in text, text
    assert "a library's info" not in text  # libraries log at WARNING, as on the terminal
    # what the rank printed still reaches Ray's worker log, which the terminal shows
    ray_logs = Path(ray._private.worker._global_node.get_logs_dir_path())
    printed = "".join(p.read_text() for p in ray_logs.glob(f"worker-*-{pid}.out"))
    assert "printed by the rank" in printed

    fault = asyncio.run(session.fault_behind(died.value))
    assert fault is not None and fault.component == "train rank"
    assert str(fault).startswith("the train rank 0 died (") and str(fault).endswith(
        f"; its log: {log}"
    ), fault
    with pytest.raises(RunFault) as during:
        asyncio.run(session.on_ranks("a train step", [session.trainers[0].where.remote()]))
    assert str(during.value).startswith("train rank(s) [0] died during a train step (")
    assert str(during.value).endswith(f"; its log: {log}"), during.value
    # and as a weight update's call on every rank says it
    context = SyncContext(
        client=None,  # type: ignore[arg-type]  # the ranks are called first, and fail
        call=session.call_trainer, num_ranks=1, weights_dir=run_dir / "weights",
        bucket_bytes=1 << 20, gpus_per_engine=1, engine_ranks=lambda url: [0], on_gpu=False,
        multi_node=False, ranks=session._train_ranks(),
    )  # fmt: skip
    with pytest.raises(RunFault) as pushing:
        asyncio.run(WEIGHT_SYNCS["disk"](context).push(1, []))
    assert str(pushing.value).startswith("train rank(s) [0] died during the export of weight")
    assert str(pushing.value).endswith(f"; its log: {log}"), pushing.value

    again = rank()  # a restart in place, or a resume, in the same run directory
    assert ray.get(again.where.remote())["pid"] != pid
    text = log.read_text()
    assert text.count("train rank 0 starts (pid ") == 2 and "Fatal Python error" in text
    ray.kill(again)
