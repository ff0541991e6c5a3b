"""A running Ray cluster's nodes, read from its GCS without joining it as a driver.

Joining (`ray.init`) takes seconds; the GCS answers in milliseconds, so the preflight can
compare the cluster with the hardware profile before anything heavy starts, and `rlpost
cluster` can poll it. Imports only Ray's GCS client (no torch, no Ray worker).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

GCS_TIMEOUT_S = 5.0
ALIVE = 0  # GcsNodeInfo.GcsNodeState.ALIVE


@dataclass(frozen=True)
class GcsNode:
    address: str
    alive: bool
    gpus: float
    cpus: float


def gcs_address(address: str) -> str:
    """host:port of the cluster's GCS; `auto` is the cluster started on this machine."""
    if address != "auto":
        return address
    from ray._private.services import canonicalize_bootstrap_address_or_die

    return str(canonicalize_bootstrap_address_or_die("auto"))


def read_gcs_nodes(address: str) -> list[GcsNode]:
    """Every node the cluster's GCS knows, with its state and resources. Raises
    ConnectionError when the GCS does not answer (or refuses this machine's token)."""
    from ray._private.authentication.authentication_token_setup import (
        maybe_enable_token_auth_if_token_available,
    )
    from ray._raylet import GcsClient  # type: ignore[attr-defined]

    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(
        logging.ERROR
    )
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    try:
        client = GcsClient(address=gcs_address(address))
        infos = client.get_all_node_info(timeout=GCS_TIMEOUT_S)
    except Exception as exc:  # Ray raises its own RPC, auth and timeout errors
        raise ConnectionError(f"the Ray GCS at {address} did not answer: {exc}") from exc
    return [
        GcsNode(
            address=str(info.node_manager_address),
            alive=info.state == ALIVE,
            gpus=float(info.resources_total.get("GPU", 0)),
            cpus=float(info.resources_total.get("CPU", 0)),
        )
        for info in infos.values()
    ]
