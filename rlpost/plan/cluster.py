"""Which Ray cluster a run uses, and which of its nodes become the plan's nodes.

Light (no Ray import): the launcher's preflight decides here whether the run starts Ray on
this machine or joins a running cluster, and the runtime hands the cluster's node list to
`choose_nodes` before it asks for a single placement group, so a cluster that cannot hold
the hardware profile is refused in seconds with what is missing, never after a long wait.
"""

from __future__ import annotations

import ipaddress
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel

from rlpost.errors import Issue, Location, UserError
from rlpost.schema import HardwareConfig, RunConfig
from rlpost.schema.base import local_path_keys, ray_address_problem

RAY_ADDRESS_ENV = "RAY_ADDRESS"
M = TypeVar("M", bound=BaseModel)


def ray_address(cfg: RunConfig, environ: Mapping[str, str] | None = None) -> str | None:
    """The cluster to join (auto, or host:port), or None to start Ray on this machine."""
    env = os.environ if environ is None else environ
    return cfg.run.ray_address or env.get(RAY_ADDRESS_ENV) or None


def address_key(cfg: RunConfig) -> tuple[str, Location | None]:
    """Where the address of the cluster to join was given: run.ray_address (its location is
    the config's), else RAY_ADDRESS in the environment (no config file or override set it)."""
    if cfg.run.ray_address:
        return "run.ray_address", None
    return RAY_ADDRESS_ENV, Location(file="the environment")


def paths_for_the_cluster(
    cfg: RunConfig, cwd: str, environ: Mapping[str, str] | None = None
) -> RunConfig:
    """`cfg` with its relative file and folder paths (model.hf_checkpoint, run.resume, ...)
    made absolute from `cwd`, the folder the launch runs in, when the launch joins a
    cluster. Train ranks and engines read those paths in Ray workers, and a worker runs in
    the folder its node's `ray start` ran in (ssh's home, the scheduler's submit folder), not
    the launch's: `model.hf_checkpoint=models/qwen3-4b`, which the preflight found here,
    would name another folder, or none, on every node but a Ray started by the launch."""
    if ray_address(cfg, environ) is None:
        return cfg
    absolute: RunConfig = cfg
    for key in local_path_keys(RunConfig):
        value = _get(cfg, key)
        if isinstance(value, str) and value != "auto" and not os.path.isabs(value):
            absolute = _with(absolute, key.split("."), os.path.normpath(os.path.join(cwd, value)))
    return absolute


def _get(model: BaseModel, key: str) -> object:
    value: object = model
    for part in key.split("."):
        value = getattr(value, part)
    return value


def _with(model: M, parts: Sequence[str], value: str) -> M:
    """A copy of the frozen `model` with the field at `parts` set to `value`."""
    head, *rest = parts
    new = value if not rest else _with(getattr(model, head), rest, value)
    return model.model_copy(update={head: new})


def check_cluster_source(cfg: RunConfig, environ: Mapping[str, str] | None = None) -> list[Issue]:
    """A multi-node profile needs a cluster to join: a Ray started here has one node."""
    hw = cfg.hardware
    joins = ray_address(cfg, environ)
    # run.ray_address is checked as the config validates; RAY_ADDRESS only here
    why = ray_address_problem(joins) if joins and not cfg.run.ray_address else None
    if why is not None:
        return [
            Issue(
                RAY_ADDRESS_ENV,
                f"the launch joins the cluster RAY_ADDRESS names (run.ray_address is null): {why}",
                "unset RAY_ADDRESS, or set it to the head's GCS host:port (e.g. "
                "10.0.0.1:6379), and launch on a node of the cluster (the head, where `ray job "
                "submit` runs its entrypoint)",
                value=joins,
                location=Location(file="the environment"),
            )
        ]
    if cfg.run.node_address and not joins:
        return [
            Issue(
                "run.node_address",
                "it names this machine's address in a Ray cluster the run joins, and this "
                "launch joins none (it starts Ray on this machine)",
                "set run.ray_address (or RAY_ADDRESS) too, or remove run.node_address",
                value=cfg.run.node_address,
            )
        ]
    if hw.num_nodes == 1 or joins:
        return []
    unit = "GPUs" if hw.kind == "gpu" else "CPU slots"
    return [
        Issue(
            "run.ray_address",
            f"hardware={hw.name} has {hw.num_nodes} nodes x {hw.gpus_per_node} {unit}, and "
            "with no cluster to join this launch would start Ray on this machine alone",
            "bring the cluster up (rlpost cluster up --hostfile FILE, or your scheduler: "
            "rlpost slurm / rlpost kuberay) and launch on its head with run.ray_address=auto "
            "(or the head's host:port, or RAY_ADDRESS)",
            value=None,
        )
    ]


@dataclass(frozen=True)
class NodeInfo:
    """One live node of a Ray cluster, as the cluster reports it."""

    address: str
    gpus: int
    cpus: int


def nodes_from_ray(entries: Sequence[Mapping[str, object]]) -> list[NodeInfo]:
    """`ray.nodes()` -> the live nodes."""
    nodes = []
    for entry in entries:
        if not entry.get("Alive"):
            continue
        resources = entry.get("Resources") or {}
        assert isinstance(resources, Mapping)
        nodes.append(
            NodeInfo(
                address=str(entry["NodeManagerAddress"]),
                gpus=int(resources.get("GPU", 0)),
                cpus=int(resources.get("CPU", 0)),
            )
        )
    return nodes


def _capacity(hw: HardwareConfig, node: NodeInfo) -> int:
    return node.gpus if hw.kind == "gpu" else node.cpus


def _short_of_cpus(hw: HardwareConfig, node: NodeInfo, per_node: int) -> bool:
    """A GPU node with the GPUs but fewer Ray CPUs: each GPU's bundle reserves a CPU too."""
    return hw.kind == "gpu" and node.gpus >= per_node > node.cpus


def _holds(hw: HardwareConfig, node: NodeInfo, per_node: int) -> bool:
    return _capacity(hw, node) >= per_node and not _short_of_cpus(hw, node, per_node)


def _cpu_note(hw: HardwareConfig, nodes: Sequence[NodeInfo], per_node: int) -> tuple[str, str]:
    """(what, fix) for the GPU nodes whose Ray CPUs are fewer than their GPU slots, or ''."""
    short = [n for n in nodes if _short_of_cpus(hw, n, per_node)]
    if not short:
        return "", ""
    listed = ", ".join(f"{n.address} ({n.cpus})" for n in short)
    return (
        f"; node(s) {listed} have the GPUs but fewer CPUs in Ray than {per_node}, and each "
        "GPU slot reserves one CPU with it",
        f"; start Ray on those nodes with --num-cpus of at least {per_node}",
    )


def _address_key(address: str) -> tuple[int, int | str]:
    try:
        return (0, int(ipaddress.ip_address(address)))
    except ValueError:
        return (1, address)


def describe_nodes(hw: HardwareConfig, nodes: Sequence[NodeInfo]) -> str:
    """'1 node with 8 GPUs', '3 nodes (2 with 8 GPUs, 1 with 4 GPUs)'."""
    unit = "GPUs" if hw.kind == "gpu" else "CPUs"
    if not nodes:
        return "no live node"
    counts = Counter(_capacity(hw, n) for n in nodes)
    if len(counts) == 1:
        (size,) = counts
        return f"{len(nodes)} node{'s' if len(nodes) > 1 else ''} with {size} {unit}"
    parts = ", ".join(f"{c} with {size} {unit}" for size, c in sorted(counts.items(), reverse=True))
    return f"{len(nodes)} nodes ({parts})"


def choose_nodes(
    hw: HardwareConfig, nodes: Sequence[NodeInfo], driver: str, slots: int
) -> list[NodeInfo]:
    """The cluster nodes that become plan nodes 0, 1, ...: the node this launch runs on
    first (the router and the driver are on plan node 0), then the others that can hold a
    node's worth of slots, by address. `slots` is how many device slots the run uses, node
    by node. Raises a UserError naming what the cluster lacks."""
    per_node = hw.gpus_per_node
    needed_nodes = -(-slots // per_node)
    unit = "GPUs" if hw.kind == "gpu" else "CPUs"
    fits = [n for n in nodes if _holds(hw, n, per_node)]
    here = next((n for n in nodes if n.address == driver), None)
    have = describe_nodes(hw, nodes)
    need = f"needs {needed_nodes} node{'s' if needed_nodes > 1 else ''} x {per_node} {unit}"
    if here is None:
        raise _mismatch(
            hw,
            f"this launch runs at {driver}, which is not a node of the cluster "
            f"({have}: {', '.join(n.address for n in nodes)})",
            "set run.node_address to this machine's address in the cluster (the one its "
            "`ray start --node-ip-address` used), or launch on a node of the cluster",
        )
    if not _holds(hw, here, per_node):
        what, fix = _cpu_note(hw, [here], per_node)
        raise _mismatch(
            hw,
            f"the launch runs on node {driver} with {_capacity(hw, here)} {unit}, and plan "
            f"node 0 (router, driver, train rank 0) is that node; hardware={hw.name} {need}" + what,
            f"launch on a node with {per_node} {unit} (the head, as `ray job submit` does), "
            f"or give this node its {unit}" + fix,
        )
    check_capacity(hw, nodes, slots)  # `here` holds a node's worth: it is one of them
    others = sorted((n for n in fits if n is not here), key=lambda n: _address_key(n.address))
    return [here, *others][:needed_nodes]


def check_capacity(hw: HardwareConfig, nodes: Sequence[NodeInfo], slots: int) -> None:
    """UserError when the cluster has fewer nodes that hold a node's worth of slots than the
    run needs, wherever it is launched from (the preflight checks this before the launch
    joins the cluster)."""
    per_node = hw.gpus_per_node
    needed_nodes = -(-slots // per_node)
    unit = "GPUs" if hw.kind == "gpu" else "CPUs"
    fits = [n for n in nodes if _holds(hw, n, per_node)]
    if len(fits) < needed_nodes:
        need = f"needs {needed_nodes} node{'s' if needed_nodes > 1 else ''} x {per_node} {unit}"
        what, fix = _cpu_note(hw, nodes, per_node)
        raise _mismatch(
            hw,
            f"the cluster has {describe_nodes(hw, nodes)}; hardware={hw.name} {need}" + what,
            f"add {needed_nodes - len(fits)} node(s) with {per_node} {unit} (rlpost cluster "
            "up --hostfile FILE, or ray start --address HEAD on each), or pick the hardware "
            "profile this cluster matches" + fix,
        )


def _mismatch(hw: HardwareConfig, message: str, fix: str) -> UserError:
    return UserError(
        [Issue("hardware", message, fix, value=hw.name)], title="cluster does not match"
    )
