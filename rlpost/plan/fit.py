"""The plan's verdicts as issues a training launch stops on: its memory (plan.memory_check),
and its training time against the timeout a train call is held to."""

from __future__ import annotations

import math

from rlpost.errors import Issue
from rlpost.plan.fsdp import FsdpTrainMemory
from rlpost.plan.plan import Plan
from rlpost.schema import RunConfig

ANYWAY = "; or set plan.memory_check=warn to launch anyway"


def memory_issues(plan: Plan) -> list[Issue]:
    """One Issue per part of the run (training, rollout, host) that does not fit."""
    m = plan.memory
    issues = []
    if not m.train_fits:
        fix = (
            "split the model further (tp, pp, cp, ep), turn on layout.train.recompute, "
            "lower recipe.train.max_tokens_per_gpu or offload the optimizer"
        )
        if isinstance(m.train, FsdpTrainMemory):
            fix = (
                "set layout.train.recompute.granularity: full or layout.train.fsdp.cpu_offload: "
                "true"
                + (
                    ""
                    if m.train.reshard_after_forward
                    else " or layout.train.fsdp.reshard_after_forward: true"
                )
                + ", lower recipe.train.max_tokens_per_gpu, or use more GPUs (the torch "
                "trainer's shards shrink as 1/DP)"
            )
        issues.append(
            Issue(
                "layout.train",
                f"training needs {m.train.total_gib:.2f} GiB per GPU and {plan.hardware} has "
                f"{m.gpu_gib:.2f} (short by {-m.train_margin_gib:.2f} GiB; see mode=plan)",
                fix + ANYWAY,
            )
        )
    if not m.rollout_fits:
        issues.append(
            Issue(
                "layout.rollout",
                f"an engine GPU needs {m.rollout.total_gib:.2f} GiB and has {m.gpu_gib:.2f}, or "
                "its KV cache cannot hold one sample (see mode=plan)",
                "use more GPUs per engine (layout.rollout.gpus_per_engine), raise "
                "mem_fraction_static or shorten recipe.rollout.max_response_len" + ANYWAY,
            )
        )
    if not m.host_fits:
        issues.append(
            Issue(
                "hardware.host_memory_gib",
                f"each node needs {m.host.total_gib:.2f} GiB of host memory and has "
                f"{m.host.host_gib:.2f} (short by {-m.host_margin_gib:.2f} GiB)",
                "use more nodes, or a machine with more host memory" + ANYWAY,
            )
        )
    return issues


TIMEOUT_HEADROOM = 2.0
"""How many times the cost model's training seconds per rollout trainer.collective_timeout_s
must allow: the model is calibrated on few runs, and a first step compiles and autotunes."""


def timeout_issues(cfg: RunConfig, plan: Plan) -> list[Issue]:
    """trainer.collective_timeout_s holds every call on the train ranks, a rollout's training
    included: one the cost model predicts near or past it would fail the run after its first
    rollout. GPU profiles only (on CPU the figures are nominal)."""
    timeout, train_s = cfg.trainer.collective_timeout_s, plan.prediction.train_s
    if plan.hardware_kind != "gpu" or train_s * TIMEOUT_HEADROOM <= timeout:
        return []
    enough = math.ceil(train_s * 3 / 60) * 60
    return [
        Issue(
            "trainer.collective_timeout_s",
            f"a rollout's training is predicted at {train_s:.0f} s (see mode=plan) and every "
            f"call on the train ranks fails past {timeout:g} s: the run would stop at its "
            f"first train step, or at a slow one (less than {TIMEOUT_HEADROOM:g}x headroom)",
            f"raise trainer.collective_timeout_s to {enough} or more, or train less per "
            "rollout (recipe.train.global_batch_size, max_response_len)",
            value=timeout,
        )
    ]
