"""A reward model class that cannot be built stops the launch before the engines serve, from
either placement: in an actor of its own (built and checked before the engines start) and in
the driver (built with the run's inputs, before any actor starts). The failure names the class
and its settings; nothing waits for engines or train ranks first."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
HOOKS = ROOT / "tests" / "hooks_fixtures"
MODEL = "rlpost_test_hooks.ModelWithoutWeights"
PLACEMENTS = {"actor": ("hardware.gpus_per_node=3",), "driver": ()}


Launch = tuple[Path, subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Launch]:
    """Both placements' launches, started at once: placement -> (the missing weights'
    folder, the finished launch)."""
    env = {**os.environ, "PYTHONPATH": str(HOOKS)}
    started: dict[str, tuple[Path, subprocess.Popen[str]]] = {}
    for placement, extra in PLACEMENTS.items():
        folder = tmp_path_factory.mktemp(placement)
        command = [
            sys.executable, str(ROOT / "launch.py"), f"run.dir={folder / 'run'}",
            f"hydra.run.dir={folder / 'hydra'}", "run.progress=false",
            "recipe.rollout.num_rollout=1", "recipe.eval.interval=null",
            "recipe.eval.datasets=[]", "recipe.rollout.reward.type=model",
            f"recipe.rollout.reward.model={MODEL}",
            f"recipe.rollout.reward.model_settings={{path: '{folder / 'rm'}'}}",
            f"recipe.rollout.reward.model_placement={placement}", *extra,
        ]  # fmt: skip
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        started[placement] = (folder / "rm", process)
    done: dict[str, Launch] = {}
    try:
        for placement, (weights, process) in started.items():
            out, err = process.communicate(timeout=300)
            finished = subprocess.CompletedProcess(process.args, process.returncode, out, err)
            done[placement] = (weights, finished)
    finally:
        for _, process in started.values():
            if process.poll() is None:
                process.terminate()
                process.communicate(timeout=60)
    return done


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
def test_a_reward_model_that_cannot_be_built_stops_the_run_before_the_engines_serve(
    launches: dict[str, Launch], placement: str
) -> None:
    weights, done = launches[placement]
    assert done.returncode == 3, done.stderr[-3000:]
    assert (
        f"reward model '{MODEL}' could not be built: ModelWithoutWeights(ctx) raised "
        f"FileNotFoundError: {weights} holds no config.json"
    ) in done.stderr + done.stdout
    assert "Traceback" not in done.stderr
    # Ray had started; the engines never came to serve, nor the train ranks to be ready
    assert "[rlpost] ray: " in done.stdout, done.stdout
    assert "[rlpost] engines: " not in done.stdout, done.stdout
    assert "[rlpost] trainers: " not in done.stdout, done.stdout
