"""What this launch needs of its environment: the packages it will need (SGLang), the
credentials (wandb), rlpost's environment switches (rlpost.switches), and, where the run's GPUs
are this node's, the machine itself (rlpost.preflight.machine).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from rlpost.errors import Issue, Location
from rlpost.plan.cluster import ray_address
from rlpost.plan.plan import Plan
from rlpost.preflight.machine import (
    VISIBLE_DEVICES,
    cpu_memory_issues,
    host_memory_gib,
    host_memory_issues,
    installed_torch_version,
    local_gpu_issues,
    nvidia_smi,
    shared_memory_bytes,
    shared_memory_issues,
    torch_build_issues,
    visible_gpu_issues,
)
from rlpost.schema import RunConfig
from rlpost.switches import bad_switches

NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")


def check_environment(cfg: RunConfig, plan: Plan) -> list[Issue]:
    issues = []
    if plan.runtime.engine_backend == "sglang" and importlib.util.find_spec("sglang") is None:
        issues.append(
            Issue(
                "engine.backend",
                "SGLang serves this run and is not installed in this environment",
                "install the GPU extra (pip install -c constraints.txt -e '.[gpu]') on the "
                "GPU machine, or use engine.backend=cpu",
                value=cfg.engine.backend,
            )
        )
    joins_cluster = ray_address(cfg) is not None
    if cfg.hardware.kind == "gpu" and not joins_cluster:
        found = _local_gpus()
        needed = cfg.hardware.gpus_per_node
        if found < needed:
            issues.append(
                Issue(
                    "hardware",
                    f"hardware {cfg.hardware.name} needs {needed} GPUs on this node and this "
                    f"machine has {found}",
                    "run on a machine with those GPUs (or join a Ray cluster that has them: "
                    "run.ray_address), or pick a hardware profile that matches this one "
                    "(`rlpost new hardware NAME` writes one from it; hardware=cpu on a machine "
                    "without GPUs)",
                    value=cfg.hardware.name,
                )
            )
        else:
            issues += visible_gpu_issues(cfg, os.environ.get(VISIBLE_DEVICES))
            gpus, driver = nvidia_smi()
            issues += local_gpu_issues(cfg, gpus)
            issues += torch_build_issues(cfg, installed_torch_version(), driver)
            issues += shared_memory_issues(cfg, shared_memory_bytes(), os.environ)
            if plan.starts_train_ranks:  # the host need is the trainers' (offload, reference)
                issues += host_memory_issues(cfg, plan, host_memory_gib())
    elif cfg.hardware.kind == "cpu" and not joins_cluster and plan.starts_train_ranks:
        issues += cpu_memory_issues(cfg, plan, host_memory_gib())
    wandb = cfg.tracking.wandb
    if wandb.enabled and wandb.mode == "online" and not _has_wandb_key():
        issues.append(
            Issue(
                "tracking.wandb.mode",
                "online wandb logging needs an API key, and neither WANDB_API_KEY nor a "
                "wandb login (~/.netrc) is present",
                "run `wandb login` or export WANDB_API_KEY, or set tracking.wandb.mode=offline",
                value="online",
            )
        )
    return issues


def check_switches(cfg: RunConfig, plan: Plan) -> list[Issue]:
    """rlpost's environment switches (rlpost.switches) set to a value they do not take."""
    return [
        Issue(switch.name, f"the environment switch {switch.problem()}", switch.meaning
              + f"; unset it or set {' or '.join(switch.choices)}", value=value,
              location=Location(file="the environment"))
        for switch, value in bad_switches()
    ]  # fmt: skip


def _local_gpus() -> int:
    try:
        return sum(1 for _ in NVIDIA_GPUS.iterdir())
    except OSError:
        return 0


def _has_wandb_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return "api.wandb.ai" in netrc.read_text(encoding="utf-8")
    except OSError:
        return False
