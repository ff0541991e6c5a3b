"""A Ray the run starts takes 127.0.0.1 as its node's address (rlpost.runtime.cluster)."""

from __future__ import annotations

import os

import pytest
from ray._private import ray_constants, services

from rlpost.errors import UserError
from rlpost.runtime.cluster import (
    CLUSTER_SWITCH,
    RAY_LOOPBACK_VERSIONS,
    gpu_index,
    loopback_node_address,
)


def test_inside_ray_finds_loopback_and_outside_its_own_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(CLUSTER_SWITCH, raising=False)
    monkeypatch.setattr(
        services, "node_ip_address_from_perspective", lambda address=None: "10.9.8.7"
    )
    assert services.resolve_ip_for_localhost("127.0.0.1") == "10.9.8.7"  # what ray.init does
    with loopback_node_address():
        assert services.get_node_ip_address() == "127.0.0.1"
        assert services.resolve_ip_for_localhost("127.0.0.1") == "127.0.0.1"
        assert os.environ[CLUSTER_SWITCH] == "0"  # for the servers and workers it spawns
    assert ray_constants.ENABLE_RAY_CLUSTER
    assert CLUSTER_SWITCH not in os.environ
    assert services.get_node_ip_address() == "10.9.8.7"  # joining a cluster later


def test_the_pinned_ray_is_the_one_measured() -> None:
    import ray

    assert ray.__version__.startswith(RAY_LOOPBACK_VERSIONS), (
        f"Ray {ray.__version__}: measure tests/integration/test_cpu_loop.py again, then "
        "extend RAY_LOOPBACK_VERSIONS (or drop loopback_node_address if ray.init keeps a "
        "loopback _node_ip_address)"
    )


def test_ray_gpu_ids_become_gpu_indices_and_uuids_are_refused() -> None:
    """Ray hands out the ids CUDA_VISIBLE_DEVICES held when its node started: indices place
    the run, a UUID is refused naming the node (before, int() of it failed in the driver)."""
    assert (gpu_index("10.0.0.2", "6"), gpu_index("10.0.0.2", "")) == (6, -1)
    with pytest.raises(UserError) as caught:
        gpu_index("10.0.0.2", "GPU-5a1f0c")
    (issue,) = caught.value.issues
    assert issue.key == "CUDA_VISIBLE_DEVICES" and issue.value == "GPU-5a1f0c"
    assert "Ray on node 10.0.0.2 names its GPUs by UUID" in issue.message
    assert "nvidia-smi -L" in issue.fix
