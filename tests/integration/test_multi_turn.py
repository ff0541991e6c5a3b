"""Multi-turn tool use through the real loop: the shipped calculator recipe learns, its tool
tokens are masked, a reward model class scores in an actor of its own (its dicts' extras
logged), and a generate function that returns something the loop cannot train stops the run
with a clear error."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
HOOKS = ROOT / "tests" / "hooks_fixtures"
NUM_ROLLOUT = 20


def start(run_dir: Path, *overrides: str) -> subprocess.Popen[str]:
    command = [
        sys.executable, str(ROOT / "launch.py"), "recipe=grpo_tiny_calculator",
        f"run.dir={run_dir}", f"hydra.run.dir={run_dir.parent / 'hydra'}",
        "run.progress=false", *overrides,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(HOOKS)}
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    return subprocess.Popen(command, cwd=ROOT, env=env, text=True, **pipes)


def finish(process: subprocess.Popen[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both launches of this file, started at once (each spends much of its start waiting on
    Ray, engines and ranks): the calculator recipe's run, and the run whose generate function
    returns a sample the loop cannot train. Name -> (the finished launch, its folder)."""
    learns, malformed = tmp_path_factory.mktemp("learns"), tmp_path_factory.mktemp("malformed")
    calls = learns / "calls"
    calls.mkdir()
    processes = {
        "learns": start(
            learns / "run",
            f"recipe.rollout.num_rollout={NUM_ROLLOUT}",
            f"recipe.eval.interval={NUM_ROLLOUT}",
            "recipe.save.interval=null",
            # the episode through a function of the user's that returns a new Sample object
            "recipe.rollout.generate_function=rlpost_test_hooks.calculator_on_a_copy",
            # rewards from a reward model class, in a Ray actor on a device slot of its own,
            # as dicts whose other keys come back from the actor as the samples' extras
            "recipe.rollout.reward.type=model",
            "recipe.rollout.reward.model=rlpost_test_hooks.BoxedAnswerModelWithExtras",
            f"recipe.rollout.reward.model_settings={{log_dir: '{calls}'}}",
            "recipe.rollout.reward.model_placement=actor",
            "hardware.gpus_per_node=3",
        ),
        "malformed": start(
            malformed / "run",
            "recipe.rollout.num_rollout=2",
            "recipe.eval.interval=null",
            "recipe.eval.datasets=[]",
            "recipe.rollout.generate_function=rlpost_test_hooks.drops_a_logprob",
            "layout.train.num_gpus=1",
            "hardware.gpus_per_node=2",
            "layout.colocate=false",
            "layout.rollout.num_gpus=1",
        ),
    }
    try:  # the malformed run stops after its first rollout: waited for first
        stopped = finish(processes["malformed"], timeout_s=240)
        return {
            "malformed": (stopped, malformed),
            "learns": (finish(processes["learns"], timeout_s=420), learns),
        }
    finally:  # a launch left running when the other's wait failed: stopped as a user would
        for process in processes.values():
            if process.poll() is None:
                process.terminate()
                process.communicate(timeout=60)


def test_the_calculator_recipe_learns_with_masked_tool_turns_and_a_reward_model_actor(
    launches: dict[str, Any],
) -> None:
    done, folder = launches["learns"]
    run_dir, calls = folder / "run", folder / "calls"
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == NUM_ROLLOUT
    rewards = [r["rollout/reward_mean"] for r in records]
    first, last = statistics.fmean(rewards[:5]), statistics.fmean(rewards[-5:])
    assert last > first + 0.1, rewards
    evals = [r["eval/calc/accuracy"] for r in records if "eval/calc/accuracy" in r]
    assert len(evals) == 2 and evals[1] > evals[0], evals
    # more and more samples call the calculator and answer: two policy turns around a tool
    # turn of about 16 tokens, which the policy did not write and nothing trained on
    turns = [r["rollout/turns_mean"] for r in records]
    assert statistics.fmean(turns[-5:]) > statistics.fmean(turns[:5]) and turns[-1] > 1.3, turns
    for r in records:
        second_turns = (r["rollout/turns_mean"] - 1) * r["rollout/num_samples"]
        assert r["rollout/inserted_tokens"] >= 10 * second_turns > 0
        policy_per_sample = r["rollout/response_tokens"] / r["rollout/num_samples"]
        assert policy_per_sample == pytest.approx(r["rollout/response_len_mean"])
    # the reward model was built once, in its actor (not the launching process), and scored
    # every sample of every rollout and eval
    logged = [line.split() for line in (calls / "calls.txt").read_text().splitlines()]
    processes = json.loads((run_dir / "placement.json").read_text())["processes"]
    actor = [p["pid"] for p in processes if p["role"] == "reward model"]
    assert {int(pid) for pid, _ in logged} == set(actor) and len(actor) == 1
    scored = sum(int(n) for _, n in logged)
    trained = sum(int(r["rollout/num_samples"]) for r in records)
    assert scored >= trained + 2 * 128
    # what the actor's model returned beside each reward reached the driver's metrics: the
    # share of responses with a box, which the reward (1 for a right boxed answer) never tops
    for r in records:
        assert r["rollout/reward_mean"] <= r["rollout/reward_extra/boxed"] <= 1.0, r
    evaluated = [r for r in records if "eval/calc/accuracy" in r]
    assert all(r["eval/calc/reward_extra/boxed"] >= r["eval/calc/accuracy"] for r in evaluated)


def test_a_generate_function_returning_a_malformed_sample_stops_the_run_naming_it(
    launches: dict[str, Any],
) -> None:
    done, _ = launches["malformed"]
    assert done.returncode == 3, done.stderr[-3000:]
    message = done.stderr + done.stdout
    assert "generate function 'rlpost_test_hooks.drops_a_logprob'" in message
    assert "rollout_logprobs" in message and "Traceback" not in done.stderr
