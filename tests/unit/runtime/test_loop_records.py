"""What a train step logs to metrics.jsonl: no evaluation overwrites another."""

from __future__ import annotations

from rlpost.runtime.loop import step_records

BEFORE = {"eval/weight_version": 0.0, "eval/arith/accuracy": 0.25}
AFTER_ROLLOUT_1 = {"eval/weight_version": 1.0, "eval/arith/accuracy": 0.5}
STEP = {"rollout/reward_mean": 0.3, "train/loss": 0.1}


def test_the_evaluation_before_training_shares_rollout_0s_record() -> None:
    assert step_records(BEFORE, STEP) == [{**BEFORE, **STEP}]
    assert step_records({}, {**STEP, **AFTER_ROLLOUT_1}) == [{**STEP, **AFTER_ROLLOUT_1}]


def test_with_an_evaluation_after_rollout_1_both_keep_a_record() -> None:
    """eval.interval=1: rollout 0's step evaluates too; the evaluation before training
    comes first, in a record of its own."""
    records = step_records(BEFORE, {**STEP, **AFTER_ROLLOUT_1})
    assert records == [BEFORE, {**STEP, **AFTER_ROLLOUT_1}]
