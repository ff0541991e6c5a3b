"""A Ray cluster and the run's placement group, with bundles in physical (node, GPU) order."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlpost.schema import HardwareConfig

log = logging.getLogger(__name__)
LOCALHOST = "127.0.0.1"
AUTH_MODE_ENV = "RAY_AUTH_MODE"  # Ray turns it to "token" for a new local cluster


@dataclass(frozen=True)
class Slot:
    """One device slot of the placement group: a GPU, or a CPU bundle on `kind: cpu`."""

    bundle_index: int
    node_ip: str
    gpu_id: int


@ray.remote(num_cpus=0)
def _probe_bundle() -> tuple[str, int]:
    gpu_ids = ray.get_gpu_ids()
    return ray.util.get_node_ip_address(), int(gpu_ids[0]) if gpu_ids else -1


class Cluster:
    """Starts (or joins) Ray and reserves one bundle per device slot of the plan.

    Ray's bundle index order is not the physical order, so bundles are probed and sorted
    by (node IP, GPU id); `slots[i]` is then the i-th device of the plan's placement.
    """

    def __init__(self, hardware: HardwareConfig, num_slots: int) -> None:
        self.hardware = hardware
        self.num_slots = num_slots
        self.pg: PlacementGroup | None = None
        self.slots: list[Slot] = []
        self._started_ray = False

    @property
    def on_gpu(self) -> bool:
        return self.hardware.kind == "gpu"

    def start(self) -> None:
        if not ray.is_initialized():
            self._init_ray()
        bundle = {"GPU": 1, "CPU": 1} if self.on_gpu else {"CPU": 1}
        self.pg = placement_group([dict(bundle) for _ in range(self.num_slots)], strategy="PACK")
        ray.get(self.pg.ready(), timeout=600)
        self.slots = self._probe_order()

    def _init_ray(self) -> None:
        address = os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address, log_to_driver=True)
            return
        # Ray enables token auth on a new local cluster and warns that it did; the cluster
        # only listens on this host, so the notice is noise for the person running rlpost.
        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(
            logging.ERROR
        )
        # A local cluster: logical CPUs are slots, not cores, so colocated actors can share one.
        num_cpus = max(self.num_slots * 2, os.cpu_count() or 1)
        ray.init(
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
                "Ray's token authentication is off (%s=%s): Ray's own servers, which listen "
                "on every interface, accept calls from anyone who can reach this machine",
                AUTH_MODE_ENV,
                os.environ.get(AUTH_MODE_ENV),
            )

    def _probe_order(self) -> list[Slot]:
        assert self.pg is not None
        probes = [
            _probe_bundle.options(
                num_gpus=0.01 if self.on_gpu else 0,
                scheduling_strategy=self.strategy_for_bundle(i),
            ).remote()
            for i in range(self.num_slots)
        ]
        found = ray.get(probes)
        slots = [Slot(i, ip, gpu) for i, (ip, gpu) in enumerate(found)]
        return sorted(slots, key=lambda s: (s.node_ip, s.gpu_id, s.bundle_index))

    def strategy_for_bundle(self, bundle_index: int) -> PlacementGroupSchedulingStrategy:
        return PlacementGroupSchedulingStrategy(
            placement_group=self.pg,
            placement_group_bundle_index=bundle_index,
            placement_group_capture_child_tasks=True,
        )

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
