"""Hardware profiles: what a cluster offers, independent of any run."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from rlpost.schema.base import InvariantError, Section

HardwareKind = Literal["gpu", "cpu"]


def device_word(kind: str, count: int = 1) -> str:
    """What a profile of hardware kind `kind` calls one of its devices in all that rlpost
    prints: a GPU, or on kind cpu a device slot (a placement-group bundle of CPU cores and a
    nominal share of host memory, which is no GPU); the plural for a `count` other than 1."""
    word = "GPU" if kind == "gpu" else "device slot"
    return word if count == 1 else f"{word}s"


class HardwareConfig(Section):
    """A homogeneous cluster: `num_nodes` nodes of `gpus_per_node` accelerators each.

    On `kind: cpu` a "GPU" is a device slot: one placement-group bundle of CPU cores that a
    train rank or an engine occupies, so the same placement code runs on a laptop.
    """

    name: str
    description: str = ""
    kind: HardwareKind = "gpu"
    gpu_name: str = ""
    num_nodes: PositiveInt = 1
    gpus_per_node: PositiveInt = 8
    gpu_memory_gib: PositiveFloat = Field(description="usable memory per accelerator")
    peak_bf16_tflops: PositiveFloat = Field(description="dense bf16 peak per accelerator")
    host_memory_gib: PositiveFloat = Field(description="host memory per node")
    cpus_per_node: PositiveInt = 64
    nvlink_within_node: bool = True
    # Bandwidths the layout search's cost model (rlpost.plan.cost) reads; the defaults are an
    # H100 SXM node's published figures.
    memory_bandwidth_gbps: PositiveFloat = Field(
        3350.0, description="accelerator memory bandwidth, GB/s (H100 SXM: 3350; H200: 4800)"
    )
    intra_node_gbps: PositiveFloat = Field(
        450.0,
        description="one accelerator's bandwidth to the others of its node, one direction, "
        "GB/s (NVLink 4: 450)",
    )
    inter_node_gbps: PositiveFloat = Field(
        50.0,
        description="one accelerator's network bandwidth to other nodes, GB/s (a 400 Gb/s "
        "NIC per GPU: 50)",
    )
    pcie_gbps: PositiveFloat = Field(
        50.0,
        description="host <-> accelerator copies, GB/s (PCIe 5 x16: 64 nominal, about 50 "
        "pinned in practice)",
    )
    host_memory_bandwidth_gbps: PositiveFloat = Field(
        400.0, description="a node's host memory bandwidth, GB/s (two DDR5 sockets)"
    )
    socket_ifname: str | None = Field(
        None,
        description="network interface the collectives use between nodes (NCCL_SOCKET_IFNAME "
        "and GLOO_SOCKET_IFNAME, e.g. eth0 or ib0); null: on each node, the interface that "
        "carries the node's cluster address",
    )

    @model_validator(mode="after")
    def check_socket_ifname(self) -> HardwareConfig:
        if self.socket_ifname and self.num_nodes == 1:
            raise InvariantError(
                f"socket_ifname={self.socket_ifname!r} has no effect: on one node every "
                "collective stays on loopback",
                fields=("socket_ifname",),
                fix="remove it, or use it in a profile with num_nodes > 1",
            )
        return self

    @property
    def total_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node
