"""This machine against the hardware profile: its GPUs (as many, with as much memory, bf16:
`nvidia-smi`, before any CUDA context), CUDA_VISIBLE_DEVICES, the torch build against the
driver, host memory and /dev/shm. torch itself is not imported.
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import re
import shutil
import subprocess
import typing
from dataclasses import dataclass
from pathlib import Path

from rlpost.errors import Issue, Location
from rlpost.plan.plan import Plan
from rlpost.schema import RunConfig

GPU_MEMORY_TOLERANCE = 0.02
"""A GPU this much under the profile's gpu_memory_gib still is the profile's card: profiles give
the usable memory, a little under what the driver reports (H200: 139.8 GiB of 140.4)."""
GPU_FIELDS = ("name", "memory.total", "compute_cap")
BF16_COMPUTE_CAPABILITY = (8, 0)
"""The first GPUs with bf16 arithmetic (Ampere): a V100 (7.0) or T4 (7.5) has none."""


@dataclass(frozen=True)
class LocalGpu:
    name: str
    memory_gib: float
    compute_capability: tuple[int, int] | None  # None: a driver too old to report it


def nvidia_smi() -> tuple[list[LocalGpu], str | None]:
    """This machine's GPUs and the NVIDIA driver's version (580.159.04), from one call of
    `nvidia-smi` (what the driver reports, before any CUDA context); a driver without the
    compute_cap field is asked again without it; nothing where nvidia-smi is missing or
    fails."""
    command = shutil.which("nvidia-smi")
    if command is None:
        return [], None
    for fields in (GPU_FIELDS, GPU_FIELDS[:2]):
        # the driver's version first: it holds no comma, a GPU's name may
        query = [f"--query-gpu=driver_version,{','.join(fields)}", "--format=csv,noheader,nounits"]
        try:
            done = subprocess.run(
                [command, *query], capture_output=True, text=True, timeout=10, check=True
            )
        except (OSError, subprocess.SubprocessError):
            continue
        drivers, rest = [], []
        for line in done.stdout.splitlines():
            driver, _, gpu = line.partition(",")
            drivers.append(driver.strip())
            rest.append(gpu)
        gpus = parse_gpus("\n".join(rest), with_compute_capability=len(fields) == 3)
        return gpus, next((d for d in drivers if d), None)
    return [], None


def local_gpus() -> list[LocalGpu]:
    """This machine's GPUs (`nvidia_smi`); empty where nvidia-smi is missing or fails."""
    return nvidia_smi()[0]


def parse_gpus(text: str, *, with_compute_capability: bool = True) -> list[LocalGpu]:
    """`nvidia-smi --query-gpu=name,memory.total[,compute_cap] --format=csv,noheader,nounits`
    lines ("NVIDIA H200, 143771, 9.0": MiB, major.minor) -> LocalGpu; a GPU's name may hold
    commas, so the figures are read from the right; lines it cannot read are left out."""
    gpus = []
    for line in text.splitlines():
        figures = 2 if with_compute_capability else 1
        name, *rest = (part.strip() for part in line.rsplit(",", figures))
        try:
            gib = float(rest[0]) / 1024
            capability = None
            if with_compute_capability:
                major, _, minor = rest[1].partition(".")
                capability = (int(major), int(minor or 0))
        except (ValueError, IndexError):
            continue
        if name:
            gpus.append(LocalGpu(name, gib, capability))
    return gpus


def local_gpu_issues(cfg: RunConfig, gpus: list[LocalGpu]) -> list[Issue]:
    """This node's GPUs against the hardware profile and the model's dtype (`gpus`: from
    `local_gpus`; nothing to judge when empty)."""
    return gpu_memory_issues(cfg, gpus) + bf16_issues(cfg, gpus)


def gpu_memory_issues(cfg: RunConfig, gpus: list[LocalGpu]) -> list[Issue]:
    """A profile that promises more memory per GPU than this machine's smallest GPU has: every
    memory verdict of the plan, its micro-batches and SGLang's memory fraction assume the
    profile's card, so the run would fit on paper and run out of memory on this one."""
    if not gpus:
        return []
    smallest = min(gpus, key=lambda gpu: gpu.memory_gib)
    wanted, gib = cfg.hardware.gpu_memory_gib, smallest.memory_gib
    if gib >= wanted * (1 - GPU_MEMORY_TOLERANCE):
        return []
    usable = math.floor(gib * 10) / 10
    card = cfg.hardware.gpu_name or "its GPU"
    return [
        Issue(
            "hardware.gpu_memory_gib",
            f"hardware {cfg.hardware.name} plans each GPU as {card} with {wanted:g} GiB, and "
            f"this machine's {smallest.name} has {gib:.1f} GiB: the plan's memory verdicts, "
            "micro-batches and SGLang's memory fraction were judged for the larger card",
            f"plan for this machine's GPUs: hardware.gpu_memory_gib={usable:g} (with its "
            "peak_bf16_tflops and memory_bandwidth_gbps for the time estimates), or a profile "
            "of its own (`rlpost new hardware NAME` writes one from this machine)",
            value=wanted,
        )
    ]


def bf16_issues(cfg: RunConfig, gpus: list[LocalGpu]) -> list[Issue]:
    """model.params_dtype=bf16 on GPUs without bf16 arithmetic (before Ampere): the trainers'
    kernels and SGLang's fail on them, or crawl in emulation."""
    older = [
        gpu
        for gpu in gpus
        if gpu.compute_capability is not None and gpu.compute_capability < BF16_COMPUTE_CAPABILITY
    ]
    if cfg.model.params_dtype != "bf16" or not older:
        return []
    major, minor = older[0].compute_capability or (0, 0)
    return [
        Issue(
            "model.params_dtype",
            f"this machine's {older[0].name} (compute capability {major}.{minor}) has no bf16 "
            "arithmetic; bf16 needs compute capability 8.0 or later (A100, H100 and newer)",
            "set model.params_dtype: fp16 with trainer.backend=megatron (its optimizer scales "
            "the loss) or model.params_dtype: fp32, or run on GPUs with bf16",
            value="bf16",
        )
    ]


CUDA_MIN_DRIVER = {11: 450, 12: 525, 13: 580}
"""The oldest driver (major version) that runs each CUDA major version's builds (NVIDIA's minor
version compatibility table): a torch built for CUDA 13 needs a driver of 580 or later."""
TORCH_BUILD = re.compile(r"\+(cpu|cu(\d+)\d)$")  # 2.11.0+cu130: CUDA 13; 2.13.0+cpu


def installed_torch_version() -> str | None:
    """The installed torch's version, from its metadata (torch itself is not imported)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_build_issues(
    cfg: RunConfig, torch_version: str | None, driver: str | None
) -> list[Issue]:
    """The torch this run would train with, against the GPUs it is given: a CPU build (the CPU
    install on a GPU machine) sees no GPU at all, and a CUDA build newer than the driver fails
    at its first CUDA call, in a rank, after Ray and the engines have started."""
    build = TORCH_BUILD.search(torch_version or "")
    if build is None:  # no local version tag: the build cannot be told without importing it
        return []
    gpu_extra = "pip install torch from a CUDA index (https://download.pytorch.org/whl/cu1XX)"
    if build.group(1) == "cpu":
        return [
            Issue(
                "hardware",
                f"hardware {cfg.hardware.name} trains on GPUs, and this environment's torch "
                f"{torch_version} is the CPU build: no rank would see a GPU",
                f"{gpu_extra} matching this machine's driver, or hardware=cpu",
                value=cfg.hardware.name,
            )
        ]
    cuda = int(build.group(2))
    needed = CUDA_MIN_DRIVER.get(cuda)
    try:
        major = int((driver or "").split(".")[0])
    except ValueError:
        return []
    if needed is None or major >= needed:
        return []
    return [
        Issue(
            "hardware",
            f"this environment's torch {torch_version} is built for CUDA {cuda}, which needs an "
            f"NVIDIA driver of {needed} or later, and this machine's is {driver}: the first "
            "CUDA call of a rank would fail",
            f"{gpu_extra} for a CUDA version this driver runs, or update the driver",
            value=cfg.hardware.name,
        )
    ]


MEMINFO = Path("/proc/meminfo")


def host_memory_gib() -> float | None:
    """This machine's memory (MemTotal), None where /proc/meminfo does not say."""
    try:
        for line in MEMINFO.read_text(encoding="utf-8").splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024**2  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def host_memory_issues(cfg: RunConfig, plan: Plan, total_gib: float | None) -> list[Issue]:
    """A node whose memory is less than the plan's host need (offloaded optimizer state and
    reference weights, the processes): the plan judged it against the profile's
    host_memory_gib, and the run would be killed by the kernel's OOM killer mid-step."""
    host = plan.memory.host
    if total_gib is None or host.total_gib <= total_gib:
        return []
    return [
        Issue(
            "hardware.host_memory_gib",
            f"the run needs {host.total_gib:,.1f} GiB of host memory on a node (offloaded "
            f"state {host.optimizer_gib:,.1f}, reference weights "
            f"{host.reference_weights_gib:,.1f}, processes {host.processes_gib:,.1f}), and "
            f"this machine has {total_gib:,.1f} GiB; the plan judged it against the "
            f"profile's {cfg.hardware.host_memory_gib:g}",
            f"plan for this machine: hardware.host_memory_gib={math.floor(total_gib):d} (the "
            "plan then offers what fits), or run on nodes with more memory",
            value=cfg.hardware.host_memory_gib,
        )
    ]


def cpu_memory_issues(cfg: RunConfig, plan: Plan, total_gib: float | None) -> list[Issue]:
    """A CPU profile's device slots are processes in this machine's memory: the train ranks
    of a node at the plan's training peak, with the host's offloaded state and reference
    weights, must fit in it, or the kernel's OOM killer ends the run mid-step. (The profile's
    nominal figure for the processes themselves is left out: a floor, not a forecast.)"""
    if total_gib is None:
        return []
    memory, host = plan.memory, plan.memory.host
    per_rank = max(memory.train.total_gib, memory.weight_sync_gib)
    ranks = min(plan.placement.train_gpus, cfg.hardware.gpus_per_node)
    held = host.optimizer_gib + host.reference_weights_gib
    need = ranks * per_rank + held
    if need <= total_gib:
        return []
    return [
        Issue(
            "hardware",
            f"the plan's training takes {per_rank:,.1f} GiB in each of {ranks} train rank(s) "
            f"on a node, {need:,.1f} GiB with {held:,.1f} GiB of offloaded state and "
            f"reference weights, and this machine has {total_gib:,.1f} GiB: the OOM killer "
            "would end the run mid-step",
            "lower recipe.train.max_tokens_per_gpu (the activations), train fewer ranks "
            "(layout.train.num_gpus), or use a smaller model",
            value=cfg.hardware.name,
        )
    ]


SHM = Path("/dev/shm")
SHM_MIN_BYTES = 1 << 30
"""/dev/shm a node with several GPUs needs at least: NCCL's intra-node transport makes its
segments there (several MB each, per peer and channel), and a container's default of 64 MB
fails the first collective ("Error while creating shared memory segment")."""


def shared_memory_bytes() -> int | None:
    """The size of /dev/shm on this machine, None where there is none."""
    try:
        stats = os.statvfs(SHM)
    except OSError:
        return None
    return stats.f_blocks * stats.f_frsize


def shared_memory_issues(
    cfg: RunConfig, size: int | None, environ: typing.Mapping[str, str]
) -> list[Issue]:
    """A node of several GPUs whose /dev/shm is too small for NCCL (a container's default),
    unless NCCL's shared-memory transport is off (NCCL_SHM_DISABLE=1)."""
    if cfg.hardware.gpus_per_node < 2 or size is None or size >= SHM_MIN_BYTES:
        return []
    if environ.get("NCCL_SHM_DISABLE") == "1":
        return []
    return [
        Issue(
            "hardware",
            f"/dev/shm on this node holds {size / 2**20:,.0f} MiB, and NCCL between its "
            f"{cfg.hardware.gpus_per_node} GPUs makes its shared-memory segments there: the "
            "first collective of the train ranks or a multi-GPU engine would fail",
            "give it at least 1 GiB (docker run --shm-size=16g; on Kubernetes an emptyDir "
            "with medium: Memory mounted at /dev/shm), or NCCL_SHM_DISABLE=1 (slower "
            "transfers within the node)",
            value=cfg.hardware.name,
            location=Location(file="this machine"),
        )
    ]


VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


def visible_gpu_issues(cfg: RunConfig, visible: str | None) -> list[Issue]:
    """CUDA_VISIBLE_DEVICES (`visible`) hiding GPUs the profile counts on: Ray and CUDA see only
    the listed ones, so the placement would wait for GPUs that never come."""
    if visible is None:
        return []
    listed = [d for d in (part.strip() for part in visible.split(",")) if d]
    # CUDA stops at the first invalid entry, such as -1
    count = next((i for i, d in enumerate(listed) if d.startswith("-")), len(listed))
    named = [d for d in listed[:count] if not d.isdigit()]
    if named:
        return [
            Issue(
                VISIBLE_DEVICES,
                f"it names GPUs by UUID or MIG id ({named[0]}), and the run places its "
                "engines and train ranks by GPU index (Ray hands out these names as the ids)",
                "list the GPUs by index (`nvidia-smi -L` shows which index is which UUID), "
                f"or unset {VISIBLE_DEVICES}",
                value=visible,
                location=Location(file="the environment"),
            )
        ]
    needed = cfg.hardware.gpus_per_node
    if count >= needed:
        return []
    return [
        Issue(
            VISIBLE_DEVICES,
            f"it shows {count} GPU(s) to this launch, and hardware {cfg.hardware.name} "
            f"places the run on {needed} per node",
            f"unset {VISIBLE_DEVICES}, or list {needed} GPUs in it, or pick a hardware profile "
            f"of {count} GPU(s) (hardware.gpus_per_node={count}, or `rlpost new hardware NAME`)",
            value=visible,
            location=Location(file="the environment"),
        )
    ]
