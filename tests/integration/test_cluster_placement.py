"""Seed 002's run (GLM-4.5 355B on 64 H100s in 8 nodes) placed on a real Ray cluster of 8
nodes x 8 fake GPUs on this machine: a raylet per node at its own loopback address
(127.0.0.2-127.0.0.9), GPUs that Ray counts with no device behind them.

The run's own Cluster joins it, reserves the placement group and probes it. Then every train
rank and every engine server process is scheduled the way the session schedules its actors
(same bundle, same share of the device) and reports where it landed. Nothing is built: no
model, no engine."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster as RayTestCluster

from rlpost.backends.sglang.launch import engine_commands, engine_specs
from rlpost.config.loader import compose_run_config
from rlpost.plan import build_plan
from rlpost.runtime.cluster import ENGINE_SHARE, TRAIN_SHARE, Cluster, one_per_node_at_a_time
from rlpost.runtime.engine_pool import server_slot

pytestmark = pytest.mark.integration

NODES = [f"127.0.0.{i}" for i in range(2, 10)]


@pytest.fixture(scope="module")
def fake_cluster() -> Iterator[str]:
    """8 raylets, 8 fake GPUs and 16 CPUs each (a GPU's bundle reserves a CPU too)."""
    if ray.is_initialized():  # a driver of another test's cluster would be joined instead
        ray.shutdown()
    mp = pytest.MonkeyPatch()
    # the processes Ray starts in advance would be 16 per node on a 2-core machine
    mp.setenv("RAY_enable_worker_prestart", "0")
    mp.setenv("RAY_prestart_worker_first_driver", "0")
    node = {"num_cpus": 16, "num_gpus": 8}
    cluster = RayTestCluster(
        initialize_head=True,
        head_node_args={"node_ip_address": NODES[0], "include_dashboard": False, **node},
    )
    try:
        for address in NODES[1:]:
            cluster.add_node(node_ip_address=address, wait=False, **node)
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
        mp.undo()


@ray.remote(num_cpus=0, max_calls=0)
def _landed() -> tuple[str, list[int]]:
    return ray.util.get_node_ip_address(), [int(g) for g in ray.get_gpu_ids()]


def land(cluster: Cluster, jobs: Sequence[tuple[int, float]]) -> list[tuple[str, list[int]]]:
    """Where a task lands for each (slot index, share of its device)."""
    per_node = cluster.hardware.gpus_per_node
    return one_per_node_at_a_time(
        [
            (
                index // per_node,
                lambda index=index, share=share: _landed.options(
                    scheduling_strategy=cluster.strategy(index), **cluster.share(share)
                ).remote(),
            )
            for index, share in jobs
        ]
    )


def test_seed_002_lands_every_rank_on_the_node_and_gpu_the_plan_gives(
    fake_cluster: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    cfg, _ = compose_run_config(
        [
            "model=glm4.5-355b-a32b", "recipe=grpo_dapo", "hardware=h100x64",
            f"run.ray_address={fake_cluster}", f"run.node_address={NODES[0]}",
        ]
    )  # fmt: skip
    plan = build_plan(cfg)
    placement = plan.placement
    assert placement.colocate and placement.train_gpus == 64 and placement.num_engines == 2
    cluster = Cluster(cfg.hardware, placement.slots_in_use, cfg)
    try:
        cluster.start()
        assert cluster.node_addresses == NODES  # the launch node first, then by address
        reserved = time.monotonic() - started

        train = land(cluster, [(placement.index(s), TRAIN_SHARE) for s in placement.train_slots])
        for rank, (slot, (address, gpus)) in enumerate(
            zip(placement.train_slots, train, strict=True)
        ):
            assert (address, gpus) == (NODES[slot.node], [slot.gpu]), f"train rank {rank}"

        specs = engine_specs(
            cfg,
            plan,
            backend="sglang",
            node_addresses=cluster.node_addresses,
            log_dir=str(tmp_path),
            gpu_ids=cluster.gpu_ids(placement),
        )
        servers = [spec for per_engine in specs for spec in per_engine]
        assert [(s.index, s.node_rank) for s in servers] == [
            (e, r) for e in (0, 1) for r in range(4)
        ]
        landed = land(cluster, [(server_slot(placement, s), ENGINE_SHARE) for s in servers])
        for spec, (address, gpus) in zip(servers, landed, strict=True):
            engine = placement.engines[spec.index]
            node = engine.node_slots[spec.node_rank].node
            # engine e spans plan nodes 4e..4e+3, one server process per node, GPUs 0-7 each
            assert node == 4 * spec.index + spec.node_rank
            assert (address, gpus) == (NODES[node], [spec.base_gpu_id]) == (spec.host, [0])
            assert spec.nnodes == 4 and spec.gpus_per_engine == 32
            assert spec.dist_init_addr == f"{NODES[engine.head_node]}:{engine.dist_init_port}"
        for per_engine in engine_commands(specs):
            for rank, command in enumerate(per_engine):
                text = " ".join(command)
                assert f"--nnodes 4 --node-rank {rank}" in text, text
                assert "--tp-size 32" in text and "--dist-init-addr" in text
        elapsed = time.monotonic() - started
        print(f"reserved and probed in {reserved:.1f} s; every rank placed in {elapsed:.1f} s")
        assert elapsed < 60  # the bound; about 8 s on an idle 2-core machine
    finally:
        cluster.shutdown()
