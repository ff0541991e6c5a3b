"""A Ray cluster and the run's placement group, with bundles in physical (node, GPU) order."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlpost.errors import Issue, Location, UserError
from rlpost.plan.cluster import (
    NodeInfo,
    address_key,
    choose_nodes,
    nodes_from_ray,
    ray_address,
)
from rlpost.plan.placement import Placement
from rlpost.runtime.stop import Terminated
from rlpost.schema import HardwareConfig, RunConfig

log = logging.getLogger(__name__)
LOCALHOST = "127.0.0.1"
AUTH_MODE_ENV = "RAY_AUTH_MODE"  # Ray turns it to "token" for a new local cluster
NODE_PIN = 0.001  # of a node's `node:<address>` resource (1.0): pins a bundle, shares the node
# Colocated, a train rank and an engine share each device slot: the parts of it they ask for.
TRAIN_SHARE = 0.4
ENGINE_SHARE = 0.2
# The nodes are known to hold the run before the reservation: a wait this long means
# another job holds the slots.
PLACEMENT_TIMEOUT_S = 120.0
# Ray's own switch for one-machine clusters (its name says where Ray uses it by default)
CLUSTER_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
RAY_LOOPBACK_VERSIONS = ("2.60.",)  # where loopback_node_address was measured


def use_cluster_token() -> None:
    """Joining a cluster: talk to it with token authentication whenever a token is here
    (~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN) and RAY_AUTH_MODE does not
    say otherwise; Ray itself only does this for `ray start`."""
    from ray._private.authentication.authentication_token_setup import (
        maybe_enable_token_auth_if_token_available,
    )

    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(
        logging.ERROR
    )
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


@contextlib.contextmanager
def loopback_node_address() -> Iterator[None]:
    """A Ray started inside takes 127.0.0.1 as its node's address, so that its servers (GCS,
    raylet, object manager, every worker's gRPC endpoint, the dashboard and runtime-env
    agents, the metrics exporters) listen on loopback only.

    Ray 2.60 binds each server to the node's address, but `ray.init` turns a loopback
    `_node_ip_address` into the address of the route to the internet
    (`services.resolve_ip_for_localhost`); its address lookup answers 127.0.0.1 only where
    `ray_constants.ENABLE_RAY_CLUSTER` is off, as on a laptop (the
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER switch). Both are set for the start alone: the
    processes it spawns inherit the variable, and a later `ray.init(address=...)` in this
    process finds its own node's address again. Can go when `ray.init` keeps a loopback
    `_node_ip_address` (pass it then)."""
    from ray._private import ray_constants

    if not ray.__version__.startswith(RAY_LOOPBACK_VERSIONS):
        log.warning(
            "Ray %s is untested here: its servers may bind every interface", ray.__version__
        )
    saved_constant, saved_env = ray_constants.ENABLE_RAY_CLUSTER, os.environ.get(CLUSTER_SWITCH)
    ray_constants.ENABLE_RAY_CLUSTER = False
    os.environ[CLUSTER_SWITCH] = "0"
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_constant
        if saved_env is None:
            os.environ.pop(CLUSTER_SWITCH, None)
        else:
            os.environ[CLUSTER_SWITCH] = saved_env


@dataclass(frozen=True)
class Slot:
    """One device slot of the placement group: a GPU, or a CPU bundle on `kind: cpu`."""

    bundle_index: int
    node_ip: str
    gpu_id: int
    ifname: str | None = None  # the interface that carries node_ip on its node


@ray.remote(num_cpus=0, max_calls=0)  # max_calls=0: the worker stays for the next probe
def _probe_bundle() -> tuple[str, str, str | None]:
    """The bundle's node address, its GPU's id as Ray gives it ("" on CPU), its interface."""
    from rlpost.runtime.netif import interface_for

    gpu_ids = ray.get_gpu_ids()
    address = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    return address, str(gpu_ids[0]) if gpu_ids else "", interface_for(address)


def gpu_index(node_ip: str, ray_gpu_id: str) -> int:
    """Ray's id of a bundle's GPU as the GPU index the engines and ranks are placed by (-1: no
    GPU). Ray takes its ids from CUDA_VISIBLE_DEVICES as it was when the node started, so a
    node started with GPUs named by UUID or MIG id hands out those names."""
    if not ray_gpu_id:
        return -1
    if ray_gpu_id.isdigit():
        return int(ray_gpu_id)
    raise UserError(
        [
            Issue(
                "CUDA_VISIBLE_DEVICES",
                f"Ray on node {node_ip} names its GPUs by UUID or MIG id ({ray_gpu_id}): it "
                "started with CUDA_VISIBLE_DEVICES holding those names, and the run places its "
                "engines and train ranks by GPU index",
                "start Ray on that node with CUDA_VISIBLE_DEVICES listing GPU indices "
                "(`nvidia-smi -L` shows which is which), or without it",
                value=ray_gpu_id,
                location=Location(file="the environment"),
            )
        ],
        title="cluster problem",
    )


@ray.remote(num_cpus=0)
def _is_dir(path: str) -> bool:
    return os.path.isdir(path)


def unseen_issues(folders: Mapping[str, str], blind: Mapping[str, Sequence[str]]) -> list[Issue]:
    """An Issue for each folder (config key -> path) that some nodes (`blind[key]`, their
    addresses) cannot see."""
    return [
        Issue(
            key,
            f"node(s) {', '.join(nodes)} cannot see it, and the train ranks and engines there "
            "read it (it is found on the node the launch runs on)",
            "put it on storage every node mounts at the same path (NFS, Lustre, a shared "
            "volume), or copy it to that path on every node",
            value=folders[key],
        )
        for key, nodes in blind.items()
        if nodes
    ]


@ray.remote(num_cpus=0)
def _reads(path: str, expected: str) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read() == expected
    except OSError:
        return False


def one_per_node_at_a_time(
    calls: Sequence[tuple[int, Callable[[], ray.ObjectRef[Any]]]],
) -> list[Any]:
    """The results of remote calls given as (node, start the call), run in waves of at most
    one call per node. Short tasks then reuse one worker process per node (with max_calls=0,
    which a task that asks for a GPU needs: Ray otherwise starts a fresh worker for each).
    Probing seed 002's 64 bundles on a fake 8 x 8 cluster on two cores: 5 s, against 40 s
    all at once."""
    by_node: dict[int, list[int]] = defaultdict(list)
    for i, (node, _) in enumerate(calls):
        by_node[node].append(i)
    results: list[Any] = [None] * len(calls)
    for wave in range(max((len(q) for q in by_node.values()), default=0)):
        batch = [queue[wave] for queue in by_node.values() if wave < len(queue)]
        refs = [calls[i][1]() for i in batch]
        for i, result in zip(batch, ray.get(refs), strict=True):
            results[i] = result
    return results


class Cluster:
    """Starts (or joins) Ray and reserves one bundle per device slot of the plan.

    Before anything is reserved, the cluster's nodes are matched to the hardware profile
    (`choose_nodes`): a cluster that cannot hold the run is refused at once, naming what is
    missing. Bundles are pinned node by node (plan node 0 is where the launch runs); Ray's
    bundle index order is not the physical order, so bundles are probed and sorted by (plan
    node, GPU id); `slots[i]` is then the i-th device of the plan's placement.
    """

    def __init__(self, hardware: HardwareConfig, num_slots: int, cfg: RunConfig) -> None:
        self.hardware = hardware
        self.num_slots = num_slots
        self.cfg = cfg
        self.nodes: list[NodeInfo] = []
        self.pg: PlacementGroup | None = None
        self.slots: list[Slot] = []
        self._started_ray = False

    @property
    def on_gpu(self) -> bool:
        return self.hardware.kind == "gpu"

    def start(self, after_init: Callable[[], None] | None = None) -> None:
        """Start or join Ray, then reserve the slots. `after_init`: called as soon as Ray is
        initialized in this process (ray.init replaces the process's SIGTERM handlers)."""
        if not ray.is_initialized():
            try:
                self._init_ray()
            except SystemExit as exc:
                # ray.init's own SIGTERM handler (it exits with the signal's number), until
                # the launch puts its own back (rlpost.runtime.stop)
                if exc.code != signal.SIGTERM:
                    raise
                raise Terminated from None
        if after_init is not None:
            after_init()
        driver = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        nodes = ray.nodes()  # type: ignore[no-untyped-call]
        self.nodes = choose_nodes(self.hardware, nodes_from_ray(nodes), driver, self.num_slots)
        self.pg = placement_group(self._bundles(), strategy="PACK")
        try:
            ray.get(self.pg.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise UserError(
                [
                    Issue(
                        "hardware",
                        f"the cluster's nodes ({', '.join(n.address for n in self.nodes)}) "
                        f"have the {self.num_slots} device slot(s) this run needs, but not "
                        f"free: after {PLACEMENT_TIMEOUT_S:.0f} s Ray still could not reserve "
                        "them (another job holds them)",
                        "wait for the other job, or stop it (ray list actors / ray status)",
                        value=self.hardware.name,
                    )
                ],
                title="cluster busy",
            ) from None
        self.slots = self._probe_order()

    def _bundles(self) -> list[dict[str, float]]:
        """One bundle per device slot, node by node, each pinned to its chosen node (Ray's
        `node:<address>` resource) so plan node n is the n-th chosen node, whatever else
        the cluster holds."""
        per_node = self.hardware.gpus_per_node
        bundles = []
        for i in range(self.num_slots):
            bundle = {"GPU": 1.0, "CPU": 1.0} if self.on_gpu else {"CPU": 1.0}
            bundle[f"node:{self.nodes[i // per_node].address}"] = NODE_PIN
            bundles.append(bundle)
        return bundles

    def _init_ray(self) -> None:
        address = ray_address(self.cfg)
        if address:
            use_cluster_token()
            try:
                ray.init(
                    address=address,
                    _node_ip_address=self.cfg.run.node_address,
                    log_to_driver=True,
                    logging_level=logging.WARNING,
                )
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise _cannot_join(address, self.cfg, exc) from None
            return
        # Ray enables token auth on a new local cluster and warns that it did; the cluster
        # only listens on this host, so the notice is noise for the person running rlpost.
        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(
            logging.ERROR
        )
        # A local cluster: logical CPUs are slots, not cores, so colocated actors can share one.
        num_cpus = max(self.num_slots * 2, os.cpu_count() or 1)
        with loopback_node_address():
            ray.init(
                # never a cluster that `ray start` left running here: only run.ray_address joins
                address="local",
                num_cpus=num_cpus,
                num_gpus=self.hardware.gpus_per_node if self.on_gpu else 0,
                include_dashboard=False,
                dashboard_host=LOCALHOST,
                log_to_driver=True,
                logging_level=logging.WARNING,
                configure_logging=True,
            )
        self._started_ray = True
        if os.environ.get(AUTH_MODE_ENV) != "token":
            log.warning(
                "Ray's token authentication is off (%s=%s): Ray's own servers, on 127.0.0.1, "
                "accept calls from any process on this machine",
                AUTH_MODE_ENV,
                os.environ.get(AUTH_MODE_ENV),
            )

    def _probe_order(self) -> list[Slot]:
        assert self.pg is not None
        per_node = self.hardware.gpus_per_node
        found = one_per_node_at_a_time(
            [
                # bundle i is pinned to chosen node i // per_node
                (i // per_node, functools.partial(self._start_probe, i))
                for i in range(self.num_slots)
            ]
        )
        rank = {node.address: n for n, node in enumerate(self.nodes)}
        slots = [
            Slot(i, ip, gpu_index(ip, gpu), ifname) for i, (ip, gpu, ifname) in enumerate(found)
        ]
        return sorted(
            slots, key=lambda s: (rank.get(s.node_ip, len(rank)), s.gpu_id, s.bundle_index)
        )

    def _start_probe(self, bundle_index: int) -> ray.ObjectRef[tuple[str, str, str | None]]:
        return _probe_bundle.options(
            num_gpus=0.01 if self.on_gpu else 0,
            scheduling_strategy=self.strategy_for_bundle(bundle_index),
        ).remote()

    def share(self, fraction: float) -> dict[str, float]:
        """Ray resources of an actor that takes `fraction` of its device slot."""
        return {"num_gpus": fraction} if self.on_gpu else {"num_cpus": fraction}

    @property
    def node_addresses(self) -> list[str]:
        """Plan node n's address in the cluster, n = 0, 1, ..."""
        return [node.address for node in self.nodes]

    def gpu_ids(self, placement: Placement) -> dict[tuple[int, int], int]:
        """Each plan slot (node, GPU) the run uses -> the GPU index Ray gave its bundle on
        that node (the two differ when other jobs hold some of the node's GPUs)."""
        used = [*placement.train_slots, *(s for e in placement.engines for s in e.slots)]
        return {(s.node, s.gpu): self.slots[placement.index(s)].gpu_id for s in used}

    def strategy_for_bundle(self, bundle_index: int) -> PlacementGroupSchedulingStrategy:
        return PlacementGroupSchedulingStrategy(
            # Ray takes None for no group, though its annotation says PlacementGroup
            placement_group=self.pg,  # type: ignore[arg-type]
            placement_group_bundle_index=bundle_index,
            placement_group_capture_child_tasks=True,
        )

    def check_shared(self, folder: Path) -> None:
        """Every node sees `folder` (the run directory: checkpoints written by ranks on every
        node, weights the engines load from disk), or a UserError naming the nodes that
        do not."""
        if len(self.nodes) < 2:
            return
        folder.mkdir(parents=True, exist_ok=True)
        token = uuid.uuid4().hex
        marker = folder / f".shared-{token}"
        marker.write_text(token, encoding="utf-8")
        try:
            firsts = self._first_slots()
            seen = ray.get(
                [
                    _reads.options(scheduling_strategy=self.strategy(i)).remote(str(marker), token)
                    for i in firsts
                ]
            )
        finally:
            marker.unlink(missing_ok=True)
        blind = [self.slots[i].node_ip for i, ok in zip(firsts, seen, strict=True) if not ok]
        if blind:
            raise UserError(
                [
                    Issue(
                        "run.dir",
                        f"node(s) {', '.join(blind)} cannot see the run directory: ranks on "
                        "every node write checkpoints there and engines load weights from it",
                        "put run.dir on storage every node mounts at the same path (NFS, "
                        "Lustre, a shared volume)",
                        value=str(folder),
                    )
                ],
                title="run directory not shared",
            )

    def _first_slots(self) -> list[int]:
        """The first slot of each node the run uses."""
        per_node = self.hardware.gpus_per_node
        return [n * per_node for n in range(len(self.nodes)) if n * per_node < len(self.slots)]

    def check_seen(self, folders: Mapping[str, str]) -> None:
        """Every node sees each folder (config key -> path) its ranks and engines read (the
        model's, the checkpoint a run resumes from), or a UserError naming the nodes that
        do not, before anything is loaded from them."""
        if len(self.nodes) < 2 or not folders:
            return
        firsts = self._first_slots()
        found = {
            key: [
                _is_dir.options(scheduling_strategy=self.strategy(i)).remote(path) for i in firsts
            ]
            for key, path in folders.items()
        }
        blind = {
            key: [
                self.slots[i].node_ip for i, ok in zip(firsts, ray.get(refs), strict=True) if not ok
            ]
            for key, refs in found.items()
        }
        issues = unseen_issues(folders, blind)
        if issues:
            raise UserError(issues, title="folders not on every node")

    def strategy(self, slot_index: int) -> PlacementGroupSchedulingStrategy:
        """Scheduling strategy for the plan's `slot_index`-th device."""
        return self.strategy_for_bundle(self.slots[slot_index].bundle_index)

    def shutdown(self) -> None:
        if self.pg is not None:
            remove_placement_group(self.pg)
            self.pg = None
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False


def _cannot_join(address: str, cfg: RunConfig, exc: BaseException) -> UserError:
    key, where = address_key(cfg)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return UserError(
        [
            Issue(
                key,
                f"could not join the Ray cluster at {address}: {first}",
                "start the cluster first (rlpost cluster up --hostfile FILE), launch on one "
                "of its nodes, and set run.node_address when this machine has several "
                "addresses; a cluster with token authentication needs its token here "
                "(~/.ray/auth_token or RAY_AUTH_TOKEN)",
                value=address,
                location=where,
            )
        ],
        title="cannot join the cluster",
    )
