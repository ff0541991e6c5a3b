"""Evaluation in the real loop is exact whatever the training recipe filters.

Every eval group is generated and scored once: a dynamic-sampling filter that drops groups
whose rewards are all equal (and so would drop every group of this eval set) must neither
touch evaluation nor keep it from returning. The reward function has verl's shape and
returns more than the score: its numbers are the records' `reward_extra` metrics, its strings
are in the dumped rollouts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
HOOKS = ROOT / "tests" / "hooks_fixtures"
SCORES = [1, 0, 1, 1, 0, 0, 1]  # one per eval prompt: 4 of 7 right
N_SAMPLES = 4


def test_evaluation_with_a_filter_on_groups_of_equal_rewards_returns_the_exact_accuracy(
    tmp_path: Path,
) -> None:
    eval_file = tmp_path / "scored.jsonl"
    lines = [
        {"prompt": f"What is {i}+{i}?", "label": str(2 * i), "metadata": {"score": score}}
        for i, score in enumerate(SCORES)
    ]
    eval_file.write_text("".join(json.dumps(line) + "\n" for line in lines))
    run_dir = tmp_path / "run"
    command = [
        sys.executable, str(ROOT / "launch.py"),
        "recipe.rollout.num_rollout=3",
        "recipe.rollout.over_sampling_batch_size=12",
        "recipe.rollout.dynamic_sampling_filter=rlpost.filters.check_reward_nonzero_std",
        # training prompts score their response's length (groups differ, the filter keeps
        # them); the eval prompts' score is in their line (every group's rewards are equal)
        "recipe.rollout.reward.custom_function=rlpost_test_hooks.verl_extras_or_length",
        "run.dump_rollouts=true",
        "recipe.eval.interval=1",
        f"recipe.eval.datasets=[{{name: scored, path: {eval_file}, "
        f"n_samples_per_prompt: {N_SAMPLES}}}]",
        "layout.train.num_gpus=1", "hardware.gpus_per_node=1",
        "run.progress=false", f"run.dir={run_dir}", f"hydra.run.dir={tmp_path / 'hydra'}",
    ]  # fmt: skip
    path = os.pathsep.join(p for p in (str(HOOKS), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        command, cwd=ROOT, env={**os.environ, "PYTHONPATH": path},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval/scored/accuracy" in r]
    # before training, then after every rollout (eval.interval=1): the first two both go with
    # rollout 0, the one before training in a record of its own, and neither overwrites the other
    assert [(r["rollout_id"], r["eval/weight_version"]) for r in evals] == [
        (0, 0.0), (0, 1.0), (1, 2.0), (2, 3.0)
    ]  # fmt: skip
    # each says the rollouts trained before it, as the table's "after rollout" does
    assert [r["eval/after_rollout"] for r in evals] == [0, 1, 2, 3]
    assert not any(k.startswith(("rollout/", "train/")) for k in records[0])
    exact = float(Fraction(sum(SCORES), len(SCORES)))
    for record in evals:
        assert record["eval/scored/accuracy"] == exact
        assert record["eval/scored/num_samples"] == len(SCORES) * N_SAMPLES
        assert record["eval/scored/reward_extra/scored"] == exact  # True where it scored 1
    trained = records[1:]
    assert [r["rollout_id"] for r in trained] == [0, 1, 2]
    assert all(r["rollout/num_samples"] == 64 for r in trained)  # training went on
    for record in trained:
        extras = sorted(k for k in record if k.startswith("rollout/reward_extra/"))
        assert extras == ["rollout/reward_extra/length", "rollout/reward_extra/scored"]
        # the score is the length here: their means are one
        assert record["rollout/reward_extra/length"] == record["rollout/reward_mean"]
    dumped = [json.loads(line) for line in (run_dir / "rollouts" / "rollout_2.jsonl").open()]
    assert len(dumped) == 64
    assert {"scored", "length", "first"} == set(dumped[0]["reward_extra"])
    assert "0.571" in done.stdout  # the eval table
