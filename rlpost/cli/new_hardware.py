"""`rlpost new hardware NAME`: a hardware profile of the machine it runs on.

    rlpost new hardware a100x8                            # -> conf/hardware/a100x8.yaml
    rlpost new hardware a100x16 --nodes 2 --inter-node-gbps 25
    rlpost new hardware l40sx4 --out -                    # print it

It reads this node's GPUs from nvidia-smi (how many, their name, memory and compute capability;
NVLink between them from `nvidia-smi topo -m`), the host's memory from /proc/meminfo and its
CPU count, and the GPU's dense bf16 peak and memory bandwidth from data-sheet figures
(`GPU_SHEETS`); a GPU that is not there needs --peak-bf16-tflops and --memory-bandwidth-gbps
from its own data sheet. Every node of the profile is taken to be this one (--nodes). The text
is validated by the schema before it is written, and the preflight of every GPU launch then
holds the node it runs on to the profile's count, memory and dtype.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from rlpost.cli.new_model import (
    add_output_arguments,
    check_name,
    output_path,
    use_line,
    write_text,
)
from rlpost.cli.yaml_text import block_lines
from rlpost.errors import Issue, UserError
from rlpost.preflight.machine import LocalGpu, host_memory_gib, local_gpus
from rlpost.schema import HardwareConfig

HELP = "write a hardware profile of this machine's GPUs"
NVLINK = re.compile(r"\bNV\d+\b")
HOPPER = (9, 0)
PCIE_GBPS = {True: 50.0, False: 25.0}
"""Host <-> GPU copies, pinned, GB/s: PCIe 5 x16 from Hopper on (True), PCIe 4 before."""


@dataclass(frozen=True)
class GpuSheet:
    """A GPU's data-sheet figures: dense bf16 TFLOP/s, memory GB/s, and NVLink GB/s one way
    to the other GPUs of its node (0: none, the GPUs talk over PCIe)."""

    pattern: str  # a regular expression over nvidia-smi's name, case-insensitive
    peak_bf16_tflops: float
    memory_bandwidth_gbps: float
    nvlink_gbps: float


GPU_SHEETS = (  # the first that matches: the specific variants before their family
    GpuSheet(r"\bB200\b", 2250, 8000, 900),
    GpuSheet(r"\bH200\b", 989, 4800, 450),
    GpuSheet(r"\bH100\b.*\bNVL\b", 835, 3900, 300),
    GpuSheet(r"\bH100\b.*\bPCIe\b", 756, 2000, 0),
    GpuSheet(r"\bH100\b", 989, 3350, 450),
    GpuSheet(r"\bH800\b", 989, 3350, 200),
    GpuSheet(r"\bH20\b", 148, 4000, 450),
    GpuSheet(r"\bA100\b.*80GB.*\bPCIe\b", 312, 1935, 0),
    GpuSheet(r"\bA100\b.*\bPCIe\b", 312, 1555, 0),
    GpuSheet(r"\bA100\b.*80GB", 312, 2039, 300),
    GpuSheet(r"\bA100\b", 312, 1555, 300),
    GpuSheet(r"\bA800\b", 312, 2039, 200),
    GpuSheet(r"\bL40S\b", 362, 864, 0),
)


@dataclass(frozen=True)
class Host:
    """What the profile says of a node besides its GPUs."""

    memory_gib: float
    cpus: int
    nvlink: bool  # NVLink between this node's GPUs (nvidia-smi topo -m)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="the profile's name (hardware=NAME)")
    parser.add_argument("--nodes", type=int, default=1, help="nodes like this one (default 1)")
    parser.add_argument(
        "--inter-node-gbps",
        type=float,
        help="one GPU's network bandwidth to other nodes, GB/s (default 50: a 400 Gb/s NIC)",
    )
    parser.add_argument(
        "--peak-bf16-tflops", type=float, help="dense bf16 peak per GPU (default: its data sheet)"
    )
    parser.add_argument(
        "--memory-bandwidth-gbps", type=float, help="GPU memory GB/s (default: its data sheet)"
    )
    parser.add_argument(
        "--host-memory-gib", type=float, help="a node's memory (default: /proc/meminfo's)"
    )
    add_output_arguments(parser, "hardware")


def sheet_for(gpu_name: str) -> GpuSheet | None:
    return next((s for s in GPU_SHEETS if re.search(s.pattern, gpu_name, re.IGNORECASE)), None)


def _refused(key: str, value: Any, message: str, fix: str) -> UserError:
    return UserError([Issue(key, message, fix, value=value)], title="command-line error")


def profile_fields(
    name: str,
    gpus: list[LocalGpu],
    host: Host,
    *,
    nodes: int = 1,
    inter_node_gbps: float | None = None,
    peak_bf16_tflops: float | None = None,
    memory_bandwidth_gbps: float | None = None,
) -> dict[str, Any]:
    """The profile's fields, in the shipped profiles' order, for `nodes` nodes of this one:
    `gpus` (one kind), `host`, and the data sheet of the GPU's name unless both figures are
    given."""
    if not gpus:
        raise _refused(
            "nvidia-smi",
            None,
            "this machine has no NVIDIA GPU that nvidia-smi lists",
            "run it on a node of the cluster the profile describes; CPU runs use hardware=cpu",
        )
    kinds = sorted({gpu.name for gpu in gpus})
    if len(kinds) > 1:
        raise _refused(
            "nvidia-smi",
            ", ".join(kinds),
            f"this node has GPUs of {len(kinds)} kinds, and a profile describes one",
            "run it on a node with one kind of GPU, or write the profile by hand from "
            "conf/hardware/h100x8.yaml",
        )
    gpu = min(gpus, key=lambda g: g.memory_gib)
    sheet = sheet_for(gpu.name)
    if sheet is None and (peak_bf16_tflops is None or memory_bandwidth_gbps is None):
        raise _refused(
            "--peak-bf16-tflops",
            gpu.name,
            f"{gpu.name} has no data-sheet figures here: the plan's time estimates need its "
            "dense bf16 peak and memory bandwidth",
            "pass --peak-bf16-tflops and --memory-bandwidth-gbps from its data sheet (dense, "
            "not the sparse figure)",
        )
    peak = peak_bf16_tflops or (sheet.peak_bf16_tflops if sheet else 0.0)
    bandwidth = memory_bandwidth_gbps or (sheet.memory_bandwidth_gbps if sheet else 0.0)
    hopper = gpu.compute_capability is not None and gpu.compute_capability >= HOPPER
    pcie = PCIE_GBPS[hopper]
    nvlink = host.nvlink and sheet is not None and sheet.nvlink_gbps > 0
    count = len(gpus)
    gib = math.floor(gpu.memory_gib * 10) / 10
    fields: dict[str, Any] = {
        "name": name,
        "description": f"{nodes} node(s) of {count} x {gpu.name} ({gib:g} GiB), "
        "drawn from one of them by rlpost new hardware",
        "kind": "gpu",
        "gpu_name": gpu.name,
        "num_nodes": nodes,
        "gpus_per_node": count,
        "gpu_memory_gib": gib,
        "peak_bf16_tflops": float(peak),
        "host_memory_gib": float(math.floor(host.memory_gib)),
        "cpus_per_node": host.cpus,
        "nvlink_within_node": nvlink,
        "memory_bandwidth_gbps": float(bandwidth),
        "intra_node_gbps": float(sheet.nvlink_gbps if nvlink and sheet else pcie),
        "pcie_gbps": pcie,
    }
    if nodes > 1 or inter_node_gbps is not None:
        # a one-node profile keeps a bandwidth given for it: `hardware.num_nodes=N` on a
        # command line spreads the same machine over N nodes
        fields["inter_node_gbps"] = float(inter_node_gbps or 50.0)
    return fields


def render_hardware_yaml(fields: dict[str, Any]) -> str:
    bandwidths = ("memory_bandwidth_gbps", "intra_node_gbps", "inter_node_gbps", "pcie_gbps")
    head = {k: v for k, v in fields.items() if k not in bandwidths}
    tail = {k: fields[k] for k in bandwidths if k in fields}
    lines = [
        "# Drawn by `rlpost new hardware` from nvidia-smi, /proc/meminfo and the GPU's data",
        "# sheet; the host's memory bandwidth is the schema's default (not measured).",
        *block_lines(head),
        "# bandwidths in GB/s, for the layout search's cost model",
        *block_lines(tail),
    ]
    return "\n".join(lines) + "\n"


def this_host() -> Host:
    return Host(host_memory_gib() or 0.0, os.cpu_count() or 1, _nvlink_between_gpus())


def _nvlink_between_gpus() -> bool:
    command = shutil.which("nvidia-smi")
    if command is None:
        return False
    try:
        done = subprocess.run(
            [command, "topo", "-m"], capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return bool(NVLINK.search(done.stdout))


def run(args: argparse.Namespace) -> int:
    name = check_name(args.name, "hardware")
    if args.nodes < 1:
        raise _refused("--nodes", args.nodes, "a profile has at least one node", "--nodes 1")
    host = this_host()
    if args.host_memory_gib is not None:
        host = dataclasses.replace(host, memory_gib=args.host_memory_gib)
    fields = profile_fields(
        name,
        local_gpus(),
        host,
        nodes=args.nodes,
        inter_node_gbps=args.inter_node_gbps,
        peak_bf16_tflops=args.peak_bf16_tflops,
        memory_bandwidth_gbps=args.memory_bandwidth_gbps,
    )
    try:
        HardwareConfig.model_validate(fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        key = ".".join(str(p) for p in error["loc"])
        flag = "--" + key.replace("_", "-")
        raise _refused(key, fields.get(key), error["msg"], f"pass {flag}") from None
    text = render_hardware_yaml(fields)
    path = output_path(args.out, args.config_dir, "hardware", name)
    write_text(path, text, args.force)
    if path is not None:
        print(f"wrote {path}: {fields['description']}")
        use = use_line(path, "hardware", "rlpost plan model=... recipe=...")
        print(f"plan a run on it: {use}")
    return 0
