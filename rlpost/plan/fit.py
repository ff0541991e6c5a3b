"""The plan's memory verdict as issues a training launch stops on (plan.memory_check)."""

from __future__ import annotations

from rlpost.errors import Issue
from rlpost.plan.fsdp import FsdpTrainMemory
from rlpost.plan.plan import Plan

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
