"""The reward model's actor (reward.model_placement: actor) on a local Ray, with no launch
around it: the session's own calls on it (`_reward_model_ready` as the run starts,
`score_rewards` as rollouts are scored, `fault_behind` for what a start's failure says) when
the actor is killed (ray.kill, as an out-of-memory kill would end it), builds too slowly, or
its class cannot be built. A fault names the reward model actor and its class, never a train
rank or an engine; a class that cannot be built stays the user's error."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from rlpost.config.loader import compose_run_config
from rlpost.plan import build_plan
from rlpost.rewards.errors import RewardError
from rlpost.runtime.actor_log import reward_model_log
from rlpost.runtime.actors import RewardModelActor
from rlpost.runtime.failures import RunFault, is_fault, killed_while_starting
from rlpost.runtime.session import Session
from rlpost.types import Sample

pytestmark = pytest.mark.integration

HOOKS = Path(__file__).resolve().parents[1] / "hooks_fixtures"
SLOW = "rlpost_test_hooks.ModelSlowToBuild"
PART = "reward model actor"


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """Ray on this machine, whose workers import the test hooks."""
    if ray.is_initialized():  # another test's cluster would be joined instead
        ray.shutdown()
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(HOOKS))  # validation imports the class in the driver
    paths = [str(HOOKS), *filter(None, [os.environ.get("PYTHONPATH")])]
    mp.setenv("PYTHONPATH", os.pathsep.join(paths))  # the actor's worker builds it
    mp.setenv("RAY_enable_worker_prestart", "0")
    try:
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            logging_level=logging.WARNING,
        )
        yield
    finally:
        ray.shutdown()
        mp.undo()


def session_with_actor(
    run_dir: Path, model: str, settings: dict[str, object], *overrides: str
) -> Session:
    """A session (not started) of a run whose reward model is `model` in its actor, and
    that actor, started building the class."""
    listed = ", ".join(f"{k}: {v}" for k, v in settings.items())
    reward = "recipe.rollout.reward"
    cfg, _ = compose_run_config(
        [
            f"run.dir={run_dir}",
            "hardware.gpus_per_node=3",  # a slot for the reward model beside two for the run
            f"{reward}.type=model",
            f"{reward}.model={model}",
            f"{reward}.model_settings={{{listed}}}",
            f"{reward}.model_placement=actor",
            *overrides,
        ]
    )
    session = Session(cfg, build_plan(cfg), run_dir)
    session.reward_actor = RewardModelActor.options(num_cpus=0).remote(  # type: ignore[attr-defined]
        model, settings, False, {}, str(reward_model_log(run_dir))
    )
    return session


def answer(label: str, text: str) -> Sample:
    return Sample(0, 0, "2+2?", [1], label=label, response_text=text)


def test_a_reward_model_actor_killed_while_building_is_a_fault_named_as_itself(
    local_ray: None, tmp_path: Path
) -> None:
    session = session_with_actor(tmp_path / "run", SLOW, {"build_s": 120})
    assert session.reward_actor is not None
    ray.kill(session.reward_actor)
    with pytest.raises(RunFault) as fault:
        asyncio.run(session._reward_model_ready())
    assert fault.value.component == PART
    assert str(fault.value).startswith(f"the {PART} ({SLOW}) died during its start"), fault.value
    assert "train rank" not in str(fault.value)


def test_a_dead_reward_model_actor_at_the_start_is_not_called_an_engine(
    local_ray: None, tmp_path: Path
) -> None:
    """Ray's own word that the actor died, as a start's failure is read
    (`killed_while_starting`, which says which part of the run it was)."""
    session = session_with_actor(tmp_path / "run", SLOW, {"build_s": 120})
    assert session.reward_actor is not None
    ray.kill(session.reward_actor)
    with pytest.raises(ray.exceptions.RayActorError) as died:
        ray.get(session.reward_actor.where.remote())
    assert killed_while_starting(died.value, session._actor_parts()) == PART
    # an actor the session does not name otherwise is an engine's, as before
    assert killed_while_starting(died.value) == "engine"


def test_a_reward_model_actor_slow_to_build_is_cut_off_at_the_startup_timeout(
    local_ray: None, tmp_path: Path
) -> None:
    session = session_with_actor(
        tmp_path / "run", SLOW, {"build_s": 120}, "engine.startup_timeout_s=2"
    )
    assert session.reward_actor is not None
    start = time.monotonic()
    try:
        with pytest.raises(RunFault) as fault:
            asyncio.run(session._reward_model_ready())
    finally:
        ray.kill(session.reward_actor)
    assert time.monotonic() - start < 60  # not the class's 120 s
    assert fault.value.component == PART
    assert str(fault.value) == (
        f"the {PART} ({SLOW}) did not arrive: its start (building the class) did not finish "
        "within engine.startup_timeout_s=2 s; raise engine.startup_timeout_s if the model "
        "takes longer to load"
    )


def test_a_class_that_raises_while_building_stays_the_users_error(
    local_ray: None, tmp_path: Path
) -> None:
    model = "rlpost_test_hooks.ModelWithoutWeights"
    weights = tmp_path / "rm"
    session = session_with_actor(tmp_path / "run", model, {"path": str(weights)})
    assert session.reward_actor is not None
    try:
        with pytest.raises(RewardError, match=f"{weights} holds no config.json") as error:
            asyncio.run(session._reward_model_ready())
    finally:
        ray.kill(session.reward_actor)
    assert not is_fault(error.value)


def test_a_reward_model_actor_that_dies_mid_run_is_a_fault_a_restart_mends(
    local_ray: None, tmp_path: Path
) -> None:
    session = session_with_actor(tmp_path / "run", SLOW, {"build_s": 0})
    assert session.reward_actor is not None
    asyncio.run(session._reward_model_ready())
    samples = [answer("4", "\\boxed{4}"), answer("4", "\\boxed{5}")]
    scored = asyncio.run(session.score_rewards(samples))
    assert [one.reward for one in scored] == [1.0, 0.0]
    ray.kill(session.reward_actor)
    # the kill lands a moment later: a call sent before it would still be answered
    with pytest.raises(ray.exceptions.RayActorError):
        for _ in range(600):
            ray.get(session.reward_actor.where.remote())
            time.sleep(0.1)
    with pytest.raises(RunFault) as fault:
        asyncio.run(session.score_rewards(samples))
    assert fault.value.component == PART
    assert str(fault.value).startswith(f"the {PART} ({SLOW}) died while scoring 2 samples")
    assert is_fault(fault.value)
    # its log under the run's logs, which the fault names
    log = reward_model_log(session.run_dir)
    assert str(fault.value).endswith(f"; its log: {log}")
    assert f"the {PART} ({SLOW}) starts (pid " in log.read_text()
