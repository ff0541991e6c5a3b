"""What a train step logs to metrics.jsonl: no evaluation overwrites another."""

from __future__ import annotations

import numpy as np
import torch

from rlpost.runtime.loop import Unfinished, step_records
from rlpost.runtime.run_state import LoopState

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


def test_a_record_that_waits_for_its_evaluation_survives_the_checkpoints_json() -> None:
    """A SIGTERM's save (or a failed evaluation's) keeps the trained rollout's record in
    loop.json (`Unfinished`), with what left it: its numbers, whatever computed them, come
    back as metrics.jsonl would have held them."""
    waiting = Unfinished(
        3,
        metrics={
            "train/loss": torch.tensor(0.25),  # a tensor's number
            "rollout/response_tokens": np.int64(96),  # NumPy's
            "train/grad_norm": float("nan"),  # not finite: null, as in metrics.jsonl
            "rollout/reward_mean": np.float32(0.5),
        },
        before_training={"eval/arith/accuracy": 0.125},
        groups={"trained": [12, 13], "outstanding": [14]},
        left_by="evaluation",
    )
    state = LoopState(rollouts_done=4, data={}, unfinished=waiting.to_state())
    back = Unfinished.from_state(LoopState.from_json(state.to_json()))
    assert back == Unfinished(
        3,
        metrics={
            "train/loss": 0.25,
            "rollout/response_tokens": 96,
            "train/grad_norm": None,  # type: ignore[dict-item]
            "rollout/reward_mean": 0.5,
        },
        before_training={"eval/arith/accuracy": 0.125},
        groups={"trained": [12, 13], "outstanding": [14]},
        left_by="evaluation",
    )
    assert Unfinished.from_state(LoopState(rollouts_done=4, data={})) is None  # older checkpoints
