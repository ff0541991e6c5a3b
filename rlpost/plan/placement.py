"""Where each train rank and each engine rank runs, and the ports engines listen on.

Slots are (node, local GPU) pairs in node-major order, the order a placement group's bundles
take once sorted by node and GPU id. Train ranks take the first `train_gpus` slots; engines
follow them when decoupled and start at slot 0 when colocated (sharing the train GPUs).

Ports are deterministic so every process can compute them: on each node the engines that
touch it are numbered 0, 1, ... in engine order, and engine k's block starts at
ENGINE_PORT_BASE + k x PORTS_PER_ENGINE (HTTP server, NCCL port of its TP group, and for an
engine spanning nodes the torch.distributed init port on its head node). The router, the
trainer's rendezvous and the weight-update group listen on node 0 below the engine range.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

ROUTER_PORT = 19000
TRAIN_MASTER_PORT = 19001
WEIGHT_UPDATE_PORT = 19002
ENGINE_PORT_BASE = 20000
PORTS_PER_ENGINE = 4


@dataclass(frozen=True)
class Slot:
    """One accelerator: node index and local GPU index on that node."""

    node: int
    gpu: int


@dataclass(frozen=True)
class EnginePlacement:
    """An engine's GPUs (its TP ranks in order) and its ports on its head node."""

    index: int
    slots: tuple[Slot, ...]
    http_port: int
    nccl_port: int
    dist_init_port: int | None

    @property
    def head_node(self) -> int:
        return self.slots[0].node

    @property
    def num_nodes(self) -> int:
        return len({slot.node for slot in self.slots})

    @property
    def node_slots(self) -> tuple[Slot, ...]:
        """The engine's first GPU on each node it spans, head node first: where each of its
        server processes runs (one per node, --node-rank in this order)."""
        firsts: dict[int, Slot] = {}
        for slot in self.slots:
            if slot.node not in firsts or slot.gpu < firsts[slot.node].gpu:
                firsts[slot.node] = slot
        return tuple(firsts.values())


@dataclass(frozen=True)
class Placement:
    colocate: bool
    num_nodes: int
    gpus_per_node: int
    train_gpus: int
    rollout_gpus: int
    gpus_per_engine: int
    num_engines: int
    train_slots: tuple[Slot, ...]
    engines: tuple[EnginePlacement, ...]
    reward_slot: Slot | None = None  # the reward model's own slot (reward.model_placement)
    router_port: int = ROUTER_PORT
    train_master_port: int = TRAIN_MASTER_PORT
    weight_update_port: int = WEIGHT_UPDATE_PORT

    def index(self, slot: Slot) -> int:
        """The slot's position in node-major order: its device in the run's placement group."""
        return slot.node * self.gpus_per_node + slot.gpu

    @property
    def total_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def slots_in_use(self) -> int:
        """Device slots the run reserves: train ranks, engines (unless colocated), reward."""
        used = used_slots(self.colocate, self.train_gpus, self.rollout_gpus)
        return used + (1 if self.reward_slot is not None else 0)


def all_slots(num_nodes: int, gpus_per_node: int) -> list[Slot]:
    return [Slot(node, gpu) for node in range(num_nodes) for gpu in range(gpus_per_node)]


def engine_offset(colocate: bool, train_gpus: int) -> int:
    """The first slot engines use."""
    return 0 if colocate else train_gpus


def misplaced_engines(
    offset: int, gpus_per_engine: int, num_engines: int, gpus_per_node: int
) -> list[int]:
    """Engines that cross a node boundary where they cannot.

    An engine that fits in a node must sit inside one (its TP all-reduce runs over NVLink);
    a larger one must cover whole nodes, starting on a node boundary (multi-node SGLang runs
    the same TP slice on every node).
    """
    bad = []
    for index in range(num_engines):
        start = offset + index * gpus_per_engine
        end = start + gpus_per_engine - 1
        if gpus_per_engine <= gpus_per_node:
            ok = start // gpus_per_node == end // gpus_per_node
        else:
            ok = start % gpus_per_node == 0 and gpus_per_engine % gpus_per_node == 0
        if not ok:
            bad.append(index)
    return bad


def _engine_ports(engines: list[tuple[Slot, ...]]) -> list[tuple[int, int, int | None]]:
    """(http, nccl, dist_init) per engine; unique on every node an engine touches."""
    next_ordinal: dict[int, int] = defaultdict(int)
    ports = []
    for slots in engines:
        nodes = sorted({slot.node for slot in slots})
        ordinal = max(next_ordinal[node] for node in nodes)
        for node in nodes:
            next_ordinal[node] = ordinal + 1
        base = ENGINE_PORT_BASE + ordinal * PORTS_PER_ENGINE
        ports.append((base, base + 1, base + 2 if len(nodes) > 1 else None))
    return ports


def plan_placement(
    colocate: bool,
    num_nodes: int,
    gpus_per_node: int,
    train_gpus: int,
    rollout_gpus: int,
    gpus_per_engine: int,
    reward_slots: int = 0,
) -> Placement:
    """Assign slots to train ranks and engines, then (`reward_slots`) the reward model the
    slot after them; the counts must already be valid."""
    slots = all_slots(num_nodes, gpus_per_node)
    num_engines = rollout_gpus // gpus_per_engine
    offset = engine_offset(colocate, train_gpus)
    engine_slots = [
        tuple(slots[offset + i * gpus_per_engine : offset + (i + 1) * gpus_per_engine])
        for i in range(num_engines)
    ]
    engines = tuple(
        EnginePlacement(i, group, http, nccl, dist)
        for i, (group, (http, nccl, dist)) in enumerate(
            zip(engine_slots, _engine_ports(engine_slots), strict=True)
        )
    )
    return Placement(
        colocate=colocate,
        num_nodes=num_nodes,
        gpus_per_node=gpus_per_node,
        train_gpus=train_gpus,
        rollout_gpus=rollout_gpus,
        gpus_per_engine=gpus_per_engine,
        num_engines=num_engines,
        train_slots=tuple(slots[:train_gpus]),
        engines=engines,
        reward_slot=slots[used_slots(colocate, train_gpus, rollout_gpus)] if reward_slots else None,
    )


def used_slots(colocate: bool, train_gpus: int, rollout_gpus: int) -> int:
    """Slots training and the engines take (the first ones)."""
    return train_gpus if colocate else train_gpus + rollout_gpus
