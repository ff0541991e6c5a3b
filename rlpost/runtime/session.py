"""Everything a run holds while it trains: Ray placement, trainers, engines, router, client.

Built from the Plan, torn down in reverse order on exit (also on Ctrl-C or an error).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from pathlib import Path
from types import TracebackType

import ray

from rlpost.plan import Plan
from rlpost.runtime.actors import EngineActor, EngineSpec, TrainActor, TrainerSpec
from rlpost.runtime.cluster import Cluster
from rlpost.runtime.ports import port_or_free
from rlpost.runtime.progress import status
from rlpost.runtime.rollout.client import EngineClient
from rlpost.runtime.router import Router, RouterSettings
from rlpost.schema import RunConfig
from rlpost.types import TrainSample

log = logging.getLogger(__name__)

TRAINER_BACKENDS = {"torch", "auto"}
ENGINE_BACKENDS = {"cpu", "auto"}


def _since(start: float) -> str:
    return f"{time.perf_counter() - start:.1f} s"


def _check_backends(cfg: RunConfig) -> None:
    """Only what runs here is accepted: the torch trainer and rlpost's CPU engine."""
    trainer = cfg.trainer.backend
    engine = cfg.engine.backend
    if cfg.hardware.kind == "gpu" and "auto" in (trainer, engine):
        raise RuntimeError(
            "training on GPUs uses trainer.backend=megatron and engine.backend=sglang, "
            "which this build does not include yet; set trainer.backend=torch and "
            "engine.backend=cpu to run the torch trainer and rlpost's engine on this host"
        )
    if trainer not in TRAINER_BACKENDS or engine not in ENGINE_BACKENDS:
        raise RuntimeError(
            f"trainer.backend={trainer} / engine.backend={engine}: this build trains with "
            "trainer.backend=torch and serves with engine.backend=cpu"
        )


class Session:
    def __init__(
        self, cfg: RunConfig, plan: Plan, run_dir: Path, loop: asyncio.AbstractEventLoop
    ) -> None:
        _check_backends(cfg)
        self.cfg = cfg
        self.plan = plan
        self.run_dir = run_dir
        self.loop = loop
        placement = plan.placement
        used = placement.train_gpus + (0 if placement.colocate else placement.rollout_gpus)
        self.cluster = Cluster(cfg.hardware, used)
        self.trainers: list[ray.actor.ActorHandle] = []
        self.engines: list[ray.actor.ActorHandle] = []
        self.engine_urls: list[str] = []
        self.router: Router | None = None
        self.client: EngineClient | None = None
        self.weights_dir = run_dir / "weights"
        self._last_weights: Path | None = None

    # ---- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> Session:
        try:
            start = time.perf_counter()
            self.cluster.start()
            status(f"ray: {len(self.cluster.slots)} device slot(s) reserved ({_since(start)})")
            self._start_trainers()
            self._start_engines()
            status(f"engines: {len(self.engine_urls)} serving ({_since(start)})")
            self._start_router()
            ray.get([t.ready.remote() for t in self.trainers])
            status(f"trainers: {len(self.trainers)} rank(s) ready ({_since(start)})")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self.client is not None:
            self.loop.run_until_complete(self.client.close())
            self.client = None
        if self.router is not None:
            self.router.stop()
            self.router = None
        for engine in self.engines:
            try:
                ray.get(engine.stop.remote(), timeout=30)
            except Exception:  # noqa: BLE001  (shutting down: report and go on)
                log.warning("an engine did not stop cleanly", exc_info=True)
        self.engines = []
        self.trainers = []
        self.cluster.shutdown()

    def _slot_index(self, node: int, gpu: int) -> int:
        return node * self.plan.placement.gpus_per_node + gpu

    def _threads_per_slot(self) -> int:
        if self.cfg.trainer.threads_per_rank:
            return self.cfg.trainer.threads_per_rank
        hw = self.cfg.hardware
        return max(1, hw.cpus_per_node // hw.gpus_per_node)

    def _thread_env(self) -> dict[str, dict[str, str]]:
        """Set before torch loads in the actor: its thread pool size and wait policy.

        Passive waiting matters on shared cores: spinning OpenMP threads of one process
        starve the others (measured 3x slower steps with two processes on two cores).
        """
        return {
            "env_vars": {
                "OMP_NUM_THREADS": str(self._threads_per_slot()),
                "OMP_WAIT_POLICY": "PASSIVE",
                "TOKENIZERS_PARALLELISM": "false",
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_VERBOSITY": "error",
                "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            }
        }

    def _start_trainers(self) -> None:
        placement = self.plan.placement
        cfg = self.cfg
        spec = TrainerSpec(
            backend="torch",
            model_dir=cfg.model.load or cfg.model.hf_checkpoint,
            algo=cfg.recipe.algo,
            optim=cfg.recipe.optim,
            train=cfg.recipe.train,
            rollout_temperature=cfg.recipe.rollout.temperature,
            world_size=placement.train_gpus,
            master_addr="127.0.0.1",
            master_port=port_or_free(placement.train_master_port),
            num_threads=self._threads_per_slot(),
            seed=cfg.run.seed,
        )
        share = 0.4 if placement.colocate else 1.0
        for rank, slot in enumerate(placement.train_slots):
            strategy = self.cluster.strategy(self._slot_index(slot.node, slot.gpu))
            resources = {"num_gpus": share} if self.cluster.on_gpu else {"num_cpus": share}
            actor = TrainActor.options(
                scheduling_strategy=strategy, runtime_env=self._thread_env(), **resources
            ).remote(spec, rank)
            self.trainers.append(actor)

    def _start_engines(self) -> None:
        cfg = self.cfg
        logs = self.run_dir / "logs"
        share = 0.2 if self.plan.placement.colocate else 1.0
        for engine in self.plan.placement.engines:
            head = engine.slots[0]
            spec = EngineSpec(
                index=engine.index,
                model_path=cfg.model.hf_checkpoint,
                host="127.0.0.1",
                port=port_or_free(engine.http_port),
                num_threads=self._threads_per_slot() * len(engine.slots),
                seed=cfg.run.seed,
                max_batch_size=cfg.engine.max_batch_size,
                log_path=str(logs / f"engine_{engine.index}.log"),
                startup_timeout_s=cfg.engine.startup_timeout_s,
            )
            strategy = self.cluster.strategy(self._slot_index(head.node, head.gpu))
            resources = {"num_gpus": share} if self.cluster.on_gpu else {"num_cpus": share}
            self.engines.append(
                EngineActor.options(
                    scheduling_strategy=strategy, runtime_env=self._thread_env(), **resources
                ).remote(spec)
            )
        self.engine_urls = ray.get([e.start.remote() for e in self.engines])

    def _start_router(self) -> None:
        settings = RouterSettings(
            policy=self.cfg.engine.router_policy,
            request_timeout_s=self.cfg.engine.request_timeout_s,
            port=port_or_free(self.plan.placement.router_port),
            log_path=str(self.run_dir / "logs" / "router.log"),
        )
        self.router = Router(settings).start()
        for url in self.engine_urls:
            self.router.add_worker(url)
        self.router.wait_ready(len(self.engine_urls))
        self.client = EngineClient(
            self.router.url,
            worker_urls=self.engine_urls,
            max_concurrency=self.cfg.recipe.rollout.max_concurrency,
            request_timeout_s=self.cfg.engine.request_timeout_s,
        )

    # ---- per rollout -------------------------------------------------------------------

    def train(self, batch: list[TrainSample]) -> dict[str, float]:
        """Every rank gets the whole rollout and takes its own share (see TorchTrainer)."""
        ref = ray.put(batch)
        results = ray.get([t.train.remote(ref) for t in self.trainers])
        return results[0]

    async def push_weights(self, version: int) -> None:
        """Trainer -> engines through disk; every engine must then report `version`."""
        assert self.client is not None
        target = self.weights_dir / f"v{version}"
        await asyncio.to_thread(ray.get, [t.export_hf.remote(str(target)) for t in self.trainers])
        await self.client.flush_cache()
        await self.client.update_weights_from_disk(str(target), weight_version=str(version))
        versions = await asyncio.gather(
            *(self.client.get_weight_version(url) for url in self.engine_urls)
        )
        stale = [
            url for url, v in zip(self.engine_urls, versions, strict=True) if v != str(version)
        ]
        if stale:
            raise RuntimeError(f"engines {stale} did not switch to weight version {version}")
        if self._last_weights is not None:
            shutil.rmtree(self._last_weights, ignore_errors=True)
        self._last_weights = target
