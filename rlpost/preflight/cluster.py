"""The Ray cluster a launch joins: a head given as host:port answers, and the cluster has the
nodes the profile needs, read from its GCS (rlpost.runtime.gcs) before the launch joins it.
"""

from __future__ import annotations

import socket

from rlpost.errors import Issue, UserError
from rlpost.plan.cluster import address_key, check_cluster_source, ray_address
from rlpost.plan.plan import Plan
from rlpost.schema import RunConfig

HEAD_CONNECT_TIMEOUT_S = 3.0


def check_cluster(cfg: RunConfig, plan: Plan) -> list[Issue]:
    """A multi-node profile has a cluster to join, a head given as host:port answers, and
    the cluster has the nodes the profile needs (read from its GCS in well under a second,
    before the launch joins it)."""
    issues = check_cluster_source(cfg)
    address = ray_address(cfg)
    if not address or "://" in address:
        return issues
    key, where = address_key(cfg)
    if address != "auto" and ":" in address:
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=HEAD_CONNECT_TIMEOUT_S).close()
        except (OSError, ValueError) as exc:
            issues.append(
                Issue(
                    key,
                    f"no Ray head answers at {address} ({exc})",
                    "start the cluster first (rlpost cluster up --hostfile FILE, or ray start "
                    "--head on the head node) or correct the address" + _or_start_here(cfg),
                    value=address,
                    location=where,
                )
            )
            return issues
    issues += _cluster_capacity(cfg, plan, address)
    return issues


def _or_start_here(cfg: RunConfig) -> str:
    """For an address from the environment on a one-node profile: the launch can start
    its own Ray (a RAY_ADDRESS left exported from a cluster's shell joins that cluster)."""
    if cfg.run.ray_address or cfg.hardware.num_nodes > 1:
        return ""
    return (
        f"; or unset RAY_ADDRESS: hardware={cfg.hardware.name} is one node, and without it "
        "the launch starts Ray on this machine"
    )


def _cluster_capacity(cfg: RunConfig, plan: Plan, address: str) -> list[Issue]:
    from rlpost.plan.cluster import NodeInfo, check_capacity
    from rlpost.runtime.gcs import gcs_address, read_gcs_nodes

    if address == "auto":
        try:
            gcs_address(address)
        except ConnectionError as exc:  # none runs here, or several: joining would fail
            key, where = address_key(cfg)
            ray_says = str(exc).strip().split(". ")[0].rstrip(".")
            return [
                Issue(
                    key,
                    "auto joins the Ray cluster this machine is a node of, and Ray finds no "
                    f"single one here ({ray_says})",
                    "bring the cluster up first (rlpost cluster up --hostfile FILE, or ray "
                    "start on this machine) and launch on one of its nodes, or give the "
                    "head's host:port" + _or_start_here(cfg),
                    value=address,
                    location=where,
                )
            ]
    try:
        found = read_gcs_nodes(address)
    except (ConnectionError, RuntimeError, ValueError):
        return []  # joining reports it, with Ray's own words
    nodes = [NodeInfo(n.address, int(n.gpus), int(n.cpus)) for n in found if n.alive]
    try:
        check_capacity(cfg.hardware, nodes, plan.placement.slots_in_use)
    except UserError as exc:
        return list(exc.issues)
    return []
