"""Slots for train ranks and engines, node boundaries, and collision-free ports."""

from __future__ import annotations

import itertools

import pytest

from rlpost.plan.placement import (
    ENGINE_PORT_BASE,
    ROUTER_PORT,
    Slot,
    misplaced_engines,
    plan_placement,
)


def test_decoupled_engines_follow_the_train_ranks() -> None:
    p = plan_placement(False, 1, 8, train_gpus=4, rollout_gpus=4, gpus_per_engine=2)
    assert p.train_slots == tuple(Slot(0, g) for g in range(4))
    assert [e.slots for e in p.engines] == [(Slot(0, 4), Slot(0, 5)), (Slot(0, 6), Slot(0, 7))]
    assert [e.http_port for e in p.engines] == [ENGINE_PORT_BASE, ENGINE_PORT_BASE + 4]
    assert all(e.dist_init_port is None for e in p.engines)


def test_colocated_engines_start_at_slot_zero() -> None:
    p = plan_placement(True, 1, 8, train_gpus=8, rollout_gpus=8, gpus_per_engine=2)
    assert p.num_engines == 4
    assert p.engines[0].slots == (Slot(0, 0), Slot(0, 1))
    assert {s for e in p.engines for s in e.slots} == set(p.train_slots)


def test_multi_node_engines_get_a_dist_init_port_on_their_head_node() -> None:
    p = plan_placement(True, 8, 8, train_gpus=64, rollout_gpus=64, gpus_per_engine=32)
    first, second = p.engines
    assert (first.head_node, first.num_nodes) == (0, 4)
    assert (second.head_node, second.num_nodes) == (4, 4)
    assert first.dist_init_port is not None
    assert p.train_slots[8] == Slot(1, 0)


@pytest.mark.parametrize(
    ("offset", "size", "count", "per_node", "bad"),
    [
        (4, 2, 2, 8, []),
        (6, 4, 2, 8, [0]),  # GPUs 6..9 cross into node 1
        (8, 16, 1, 8, []),  # two whole nodes
        (4, 16, 1, 8, [0]),  # does not start on a node boundary
        (0, 12, 1, 8, [0]),  # not whole nodes
        (0, 8, 2, 8, []),
    ],
)
def test_misplaced_engines(
    offset: int, size: int, count: int, per_node: int, bad: list[int]
) -> None:
    assert misplaced_engines(offset, size, count, per_node) == bad


@pytest.mark.parametrize(
    ("colocate", "nodes", "train", "rollout", "size"),
    [(True, 2, 16, 16, 1), (False, 2, 4, 12, 2), (True, 4, 32, 32, 16), (False, 3, 8, 16, 8)],
)
def test_ports_never_collide_on_a_node(
    colocate: bool, nodes: int, train: int, rollout: int, size: int
) -> None:
    p = plan_placement(colocate, nodes, 8, train, rollout, size)
    for node in range(nodes):
        engines = [e for e in p.engines if any(s.node == node for s in e.slots)]
        ports = [
            port
            for e in engines
            for port in (e.http_port, e.nccl_port, e.dist_init_port)
            if port is not None
        ]
        ports += [ROUTER_PORT, p.train_master_port, p.weight_update_port] if node == 0 else []
        assert len(ports) == len(set(ports)), node
    assert all(a.slots != b.slots for a, b in itertools.combinations(p.engines, 2))
