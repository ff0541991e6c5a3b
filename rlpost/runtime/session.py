"""Everything a run holds while it trains: Ray placement, trainers, engines, router, client.

Built from the Plan (which has decided the engine backend, the weight-sync path and memory
offload), started and torn down by `async with Session(...)`, in reverse order on exit (also
on an error). The engines form an EnginePool (restarted when they die, with
engine.fault_tolerance); weights reach them through the plan's WeightSync; colocated runs can
release the engines' memory around training.

Every call to the train ranks goes to all of them at once and is awaited as a whole: a rank
that does not answer within trainer.collective_timeout_s (a save or an HF export: of its last
written byte) is named in the error, and a rank whose process died is reported as a fault
(`RunFault`) that `run.max_restarts` can restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import ray
from ray.exceptions import RayTaskError

from rlpost.backends.engine_key import ENGINE_KEY_ENV, new_engine_key
from rlpost.backends.sglang.launch import engine_backend, engine_specs
from rlpost.backends.sglang.trainer_calls import trainer_side
from rlpost.plan import Plan
from rlpost.plan.prediction import RANK_PEAK_METRICS
from rlpost.plan.work import evaluates_served_weights
from rlpost.rewards.errors import RewardError
from rlpost.rewards.scored import Scored
from rlpost.runtime.actor_log import reward_model_log, train_rank_log
from rlpost.runtime.actors import RewardModelActor, TrainActor
from rlpost.runtime.checkpoint import bytes_under
from rlpost.runtime.cluster import ENGINE_SHARE, TRAIN_SHARE, Cluster
from rlpost.runtime.determinism import deterministic_env
from rlpost.runtime.engine_pool import EnginePool, HealthSettings, RayEngine, ray_engines
from rlpost.runtime.failures import (
    ActorPart,
    RunFault,
    cured_by_restart,
    death_fault,
    is_fault,
    killed_while_starting,
    said,
)
from rlpost.runtime.leftovers import record_processes
from rlpost.runtime.ports import port_or_free
from rlpost.runtime.progress import status
from rlpost.runtime.rank_calls import Awaited, await_ranks
from rlpost.runtime.rank_io import READS_DIR, load_metered, reads_seen
from rlpost.runtime.remote_errors import remote_cause
from rlpost.runtime.rollout.client import EngineClient
from rlpost.runtime.router import Router, RouterSettings
from rlpost.runtime.trainers import trainer_spec
from rlpost.runtime.weight_sync import (
    WEIGHT_SYNCS,
    ProbeSettings,
    SyncContext,
    WeightSync,
    on_trainer,
    probe_weights,
    update_engines,
)
from rlpost.schema import RunConfig
from rlpost.types import Sample, TrainSample

log = logging.getLogger(__name__)

# Released one stage at a time, and resumed weights first: the weight update needs the
# weights' memory, the KV cache only the next rollout.
RELEASE_STAGES = (("kv_cache",), ("cuda_graph",), ("weights",))
PROBE_TEXT = "The capital of France is"
LOOPBACK_IFNAME = "lo"
# With engine.fault_tolerance, a weight update that an engine's death interrupted is sent
# again (after the engine's restart) this many times in all.
PUSH_ATTEMPTS = 3
REWARD_MODEL_ACTOR = "reward model actor"  # the part a fault of the reward model's actor names


def _since(start: float) -> str:
    return f"{time.perf_counter() - start:.1f} s"


class Session:
    def __init__(
        self,
        cfg: RunConfig,
        plan: Plan,
        run_dir: Path,
        before_actors: Awaitable[object] | None = None,
        after_ray: Callable[[], None] | None = None,
        resume_from: Path | None = None,
    ) -> None:
        """`before_actors`: awaited once Ray is up and before any actor starts (the run's
        inputs, loading meanwhile: a problem with them stops the run there). `after_ray`:
        called once Ray has started in this process (it installs signal handlers of its own,
        which the caller may replace). `resume_from`: the checkpoint the ranks load."""
        self.cfg = cfg
        self.resume_from = resume_from
        self.before_actors = before_actors
        self.after_ray = after_ray
        self.plan = plan
        self.run_dir = run_dir
        self.cluster = Cluster(cfg.hardware, plan.placement.slots_in_use, cfg)
        self.trainers: list[ray.actor.ActorHandle[TrainActor]] = []
        self.reward_actor: ray.actor.ActorHandle[RewardModelActor] | None = None
        self.pool: EnginePool | None = None
        self.router: Router | None = None
        self.client: EngineClient | None = None
        # This launch's engine key: its engines answer only requests that carry it, so a
        # run never drives (or health-checks) another run's engine that took a dead one's
        # port. Held in memory and in child processes' environments only.
        self.engine_key = new_engine_key()
        self.weights_dir = run_dir / "weights"
        self.reads_dir = run_dir / READS_DIR  # what the ranks have read (rank_io)
        self.weight_sync: WeightSync | None = None
        self.weight_version = 0
        self.pushed = False  # the engines serve the trainers' weights, not the HF folder's
        self.offload = plan.runtime.offload
        self.probe: ProbeSettings | None = None
        self.rendezvous = ""
        self.train_starts: list[ray.ObjectRef[bool]] = []  # each train rank's `start`
        # an evaluation of the weights the engines load at their start needs no train rank
        self.with_trainers = not evaluates_served_weights(cfg)

    @property
    def engine_urls(self) -> list[str]:
        return self.pool.serving_urls if self.pool is not None else []

    # ---- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> Session:
        try:
            start = time.perf_counter()
            # in the main thread: Ray installs signal handlers of its own
            self.cluster.start(after_init=self.after_ray)
            # what a killed launch would leave running, for the next launch to end
            record_processes(self.run_dir)
            self.cluster.check_shared(self.run_dir)
            self.cluster.check_seen(self._read_on_every_node())
            status(f"ray: {len(self.cluster.slots)} device slot(s) reserved ({_since(start)})")
            if self.before_actors is not None:
                await self.before_actors
            # The reward model's actor first, and built before the engines start: a class
            # that cannot be built stops the run in seconds, not once everything else is up.
            # The train ranks load meanwhile.
            self._start_reward_model()
            if self.with_trainers:
                await self._start_trainers()
            await self._reward_model_ready()
            # The router starts while the engines load (it needs none of them to start).
            started = await asyncio.gather(
                self._start_engines(),
                asyncio.to_thread(self._launch_router),
                return_exceptions=True,
            )
            if isinstance(started[1], Router):
                self.router = started[1]
            for outcome in started:
                if isinstance(outcome, BaseException):
                    raise outcome
            status(f"engines: {len(self.engine_urls)} serving ({_since(start)})")
            await self._start_router()
            await self.on_ranks("start", self.train_starts, progress=self._rank_reads)
            if self.with_trainers:
                await self._start_weight_sync()
                status(f"trainers: {len(self.trainers)} rank(s) ready ({_since(start)})")
            else:
                status(
                    "trainers: none (mode=eval of the weights the engines load, "
                    "model.hf_checkpoint's)"
                )
            await self._record_placement()
            record_processes(self.run_dir)  # Ray's agents and workers are up by now
        except Exception as exc:
            fault = await self.fault_behind(exc, starting=True)
            await self.close()
            if fault is not None:
                raise fault from exc
            raise
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop everything the session started; a part that fails to stop is reported and
        the rest still stops."""
        steps: list[tuple[str, Any]] = []
        if self.pool is not None:
            steps.append(("engine monitor", self.pool.stop_monitor()))
        if self.weight_sync is not None:
            steps.append(("weight sync", self.weight_sync.close()))
        if self.client is not None:
            steps.append(("engine client", self.client.close()))
        for what, step in steps:
            try:
                await asyncio.wait_for(step, 30)
            except Exception:  # shutting down: report and go on
                log.warning("%s did not close cleanly", what, exc_info=True)
        self.weight_sync, self.client = None, None
        if self.router is not None:
            self.router.stop()
            self.router = None
        if self.pool is not None:
            await self.pool.stop()
            self.pool = None
        for trainer in self.trainers:  # before Ray's shutdown SIGTERMs them mid-cleanup
            ray.kill(trainer)
        self.trainers = []
        if self.reward_actor is not None:
            ray.kill(self.reward_actor)
            self.reward_actor = None
        self.cluster.shutdown()

    def _threads_per_slot(self) -> int:
        if self.cfg.trainer.threads_per_rank:
            return self.cfg.trainer.threads_per_rank
        hw = self.cfg.hardware
        return max(1, hw.cpus_per_node // hw.gpus_per_node)

    def _thread_env(self, slot_index: int | None = None) -> dict[str, str]:
        """Set by each actor before torch loads in its process (an argument, not a Ray
        runtime_env: a runtime_env gives every actor a fresh worker started through Ray's
        setup process, while the workers Ray started in advance sit idle): the thread pool
        size and wait policy, and the interface collectives use: loopback on a single node;
        across nodes the hardware profile's `socket_ifname`, or the interface that carries
        the slot's node address.

        Passive waiting matters on shared cores: spinning OpenMP threads of one process
        starve the others (measured 3x slower steps with two processes on two cores).
        """
        env = {
            "OMP_NUM_THREADS": str(self._threads_per_slot()),
            "OMP_WAIT_POLICY": "PASSIVE",
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_VERBOSITY": "error",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        }
        ifname = self._socket_ifname(slot_index)
        if ifname:
            env.update(GLOO_SOCKET_IFNAME=ifname, NCCL_SOCKET_IFNAME=ifname)
        return env

    def _train_env(self, slot_index: int) -> dict[str, str]:
        on_gpu = self.cfg.hardware.kind == "gpu"
        return {
            **self._thread_env(slot_index),
            **deterministic_env(self.cfg.run.deterministic, on_gpu),
        }

    def _socket_ifname(self, slot_index: int | None) -> str | None:
        if self.plan.runtime.loopback_only:
            return LOOPBACK_IFNAME
        if self.cfg.hardware.socket_ifname:
            return self.cfg.hardware.socket_ifname
        if slot_index is None:
            return None
        return self.cluster.slots[slot_index].ifname

    async def _record_placement(self) -> None:
        """placement.json in the run directory: where each rank and engine runs, next to the
        node the plan gave it; a difference is reported."""
        placement = self.plan.placement
        nodes = self.cluster.nodes
        entries: list[dict[str, Any]] = []
        wheres: list[dict[str, object]] = await asyncio.gather(
            *(t.where.remote() for t in self.trainers)
        )
        train_slots = placement.train_slots if self.trainers else []
        for rank, (slot, where) in enumerate(zip(train_slots, wheres, strict=True)):
            entries.append({"role": "train", "rank": rank, "node": slot.node, **where})
        assert self.pool is not None
        for engine in self.pool.engines:
            for actor in getattr(engine, "actors", []):
                where = await actor.where.remote()
                node = placement.engines[engine.index].slots[0].node
                entries.append({"role": "engine", "index": engine.index, "node": node, **where})
        if self.reward_actor is not None and placement.reward_slot is not None:
            where = await self.reward_actor.where.remote()
            entries.append({"role": "reward model", "node": placement.reward_slot.node, **where})
        for entry in entries:
            entry["planned_address"] = nodes[entry["node"]].address if nodes else None
        misplaced = [e for e in entries if e["planned_address"] not in (None, e["address"])]
        for e in misplaced:
            log.warning(
                "%s is on %s, not on plan node %d (%s)",
                e,
                e["address"],
                e["node"],
                e["planned_address"],
            )
        (self.run_dir / "placement.json").write_text(
            json.dumps({"rendezvous": self.rendezvous, "processes": entries}, indent=1) + "\n",
            encoding="utf-8",
        )

    def _rendezvous(self) -> str | None:
        """Where the train ranks meet: a file store in the run directory on one node (no
        socket to listen on, no port to race for), rank 0's TCP store across nodes."""
        if self.plan.runtime.rendezvous != "file":
            return None
        folder = self.run_dir / "rendezvous"
        folder.mkdir(parents=True, exist_ok=True)
        return f"file://{folder / f'train-{uuid.uuid4().hex}'}"

    async def _start_trainers(self) -> None:
        """The train ranks' actors, building their trainers while the engines start. Ranks
        that meet over TCP meet at a port rank 0 holds from the moment it picks it (the
        kernel's pick, not the plan's fixed port: runs that start together on one host would
        both find that free)."""
        placement = self.plan.placement
        cfg = self.cfg
        first = placement.index(placement.train_slots[0])
        spec = trainer_spec(
            cfg,
            self.plan,
            master_addr=self.cluster.slots[first].node_ip,
            master_port=0,  # rank 0's held port, below
            num_threads=self._threads_per_slot(),
            init_method=self._rendezvous(),
        )
        resources = self.cluster.share(TRAIN_SHARE if placement.colocate else 1.0)
        model = cfg.model
        loads = [os.path.abspath(p) for p in (model.hf_checkpoint, model.ref_load, model.load) if p]
        for rank, slot in enumerate(placement.train_slots):
            index = placement.index(slot)
            strategy = self.cluster.strategy(index)
            actor = TrainActor.options(  # type: ignore[attr-defined]
                scheduling_strategy=strategy, **resources
            ).remote(
                spec,
                rank,
                self._train_env(index),
                (str(self.reads_dir), loads),
                str(train_rank_log(self.run_dir, rank)),
            )
            self.trainers.append(actor)
        port: int | None = None
        if spec.init_method is not None:  # on one node, a file (placement.json)
            self.rendezvous = spec.init_method
        elif spec.world_size > 1:  # across nodes
            [port] = await self.on_ranks(
                "the rendezvous", [self.trainers[0].hold_rendezvous.remote()]
            )
            self.rendezvous = f"tcp://{spec.master_addr}:{port}"
            status(f"trainers: {placement.train_gpus} rank(s) meet at {self.rendezvous}")
        else:  # one rank meets no one (megatron's store binds a port the kernel picks)
            self.rendezvous = f"tcp://{spec.master_addr}:0"
        self.train_starts = [t.start.remote(port) for t in self.trainers]

    def _start_reward_model(self) -> None:
        """The reward model's actor on the plan's slot for it (reward.model_placement)."""
        slot, reward = self.plan.placement.reward_slot, self.cfg.recipe.rollout.reward
        if slot is None or reward.type != "model" or reward.model is None:
            return
        index = self.plan.placement.index(slot)
        resources = self.cluster.share(1.0)
        self.reward_actor = RewardModelActor.options(  # type: ignore[attr-defined]
            scheduling_strategy=self.cluster.strategy(index), **resources
        ).remote(
            reward.model,
            dict(reward.model_settings),
            self.cluster.on_gpu,
            self._thread_env(index),
            str(reward_model_log(self.run_dir)),
        )

    def _reward_model_name(self) -> str:
        return f"the {REWARD_MODEL_ACTOR} ({self.cfg.recipe.rollout.reward.model})"

    async def _reward_model_ready(self) -> None:
        """Waits for the reward model's actor to build the class, within
        engine.startup_timeout_s (a start, as an engine's, loading a model); a RewardError
        naming it when the class could not be built. An actor that died while building it
        (killed, out of memory) or did not answer in time is a RunFault naming it."""
        if self.reward_actor is None:
            return
        timeout_s = self.cfg.engine.startup_timeout_s
        who = Awaited(
            part=REWARD_MODEL_ACTOR,
            key="engine.startup_timeout_s",
            names=(self._reward_model_name(),),
            fix="raise engine.startup_timeout_s if the model takes longer to load",
            logs=(reward_model_log(self.run_dir),),
        )
        ready = [self.reward_actor.ready.remote()]
        (failure,) = await await_ranks("its start (building the class)", ready, timeout_s, who=who)
        if failure is not None:
            raise RewardError(failure)

    async def score_rewards(self, samples: list[Sample]) -> list[Scored]:
        """Rewards from the reward model's actor, with what it returned beside each; an
        actor that died (killed, out of memory, its node lost) is a RunFault naming it,
        which a restart (run.max_restarts) mends."""
        assert self.reward_actor is not None
        try:
            rewards: list[Scored] = await self.reward_actor.score.remote(samples)
        except RayTaskError as exc:
            if not isinstance(exc.cause, RewardError):
                raise
            # what the model did wrong, as in the driver: Ray's text of it holds the
            # actor's traceback, which logs/failures.log keeps
            raise RewardError(str(exc.cause)) from exc.cause
        except Exception as exc:
            if not cured_by_restart(exc):
                raise
            log = reward_model_log(self.run_dir)
            raise RunFault(
                f"{self._reward_model_name()} died while scoring {len(samples)} samples "
                f"({type(exc).__name__}: {said(exc)})"
                + (f"; its log: {log}" if log.exists() else ""),
                component=REWARD_MODEL_ACTOR,
            ) from exc
        return rewards

    async def _start_engines(self) -> None:
        cfg, placement = self.cfg, self.plan.placement
        backend = engine_backend(self.plan.runtime.engine_backend)
        specs = engine_specs(
            cfg,
            self.plan,
            backend=backend.name,
            node_addresses=self.cluster.node_addresses,
            log_dir=str(self.run_dir / "logs"),
            threads_per_engine=self._threads_per_slot() * placement.gpus_per_engine,
            memory_saver=self.offload,
            gpu_ids=self.cluster.gpu_ids(placement) if self.cluster.on_gpu else None,
        )

        # The server picks its GPUs by --base-gpu-id, so it must see the whole node: the one
        # actor that needs a Ray runtime_env (the server's own environment is an argument).
        runtime_env = (
            {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}
            if backend.needs_gpu
            else None
        )
        resources = self.cluster.share(ENGINE_SHARE if placement.colocate else 1.0)
        health = HealthSettings(
            enabled=cfg.engine.fault_tolerance,
            interval_s=cfg.engine.health_check_interval_s,
            timeout_s=cfg.engine.health_check_timeout_s,
            first_wait_s=cfg.engine.health_check_first_wait_s,
            path=backend.health_path,
            max_restarts=cfg.engine.max_restarts_per_engine,
        )
        engines = ray_engines(
            specs, self.cluster, self.plan, self._server_env, resources, runtime_env
        )
        self.pool = EnginePool(engines, health)
        await self.pool.start()

    def _server_env(self, slot_index: int) -> dict[str, str]:
        return {**self._thread_env(slot_index), ENGINE_KEY_ENV: self.engine_key}

    def _launch_router(self) -> Router:
        engine, logs = self.cfg.engine, self.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        settings = RouterSettings(
            policy=engine.router_policy,
            request_timeout_s=engine.request_timeout_s,
            port=port_or_free(self.plan.placement.router_port),
            log_path=str(logs / "router.log"),
            engine_key=self.engine_key,
        )
        return Router(settings).start()

    async def _start_router(self) -> None:
        """Register the serving engines with the launched router; the client goes through it."""
        assert self.pool is not None and self.router is not None
        engine, router = self.cfg.engine, self.router
        for url in self.pool.urls:
            await asyncio.to_thread(router.add_worker, url)
        await asyncio.to_thread(router.wait_ready, len(self.pool.urls))
        self.client = EngineClient(
            router.url,
            worker_urls=self.pool.urls,
            max_concurrency=self.plan.runtime.max_concurrency,
            request_timeout_s=engine.request_timeout_s,
            # With restarts, a request may have to outwait one (the router retries on its
            # own only briefly); without, fail fast.
            max_attempts=60 if engine.fault_tolerance else 5,
            gone=self._router_gone,
            key=self.engine_key,
        )
        self.pool.connect(router, self.client, self._catch_up)
        self.pool.start_monitor(asyncio.get_running_loop())

    async def _start_weight_sync(self) -> None:
        assert self.client is not None and self.pool is not None
        cfg, placement = self.cfg, self.plan.placement
        kind = self.plan.runtime.weight_sync
        context = SyncContext(
            client=self.client,
            call=self.call_trainer,
            num_ranks=len(self.trainers),
            weights_dir=self.weights_dir,
            bucket_bytes=cfg.engine.weight_bucket_mb << 20,
            gpus_per_engine=placement.gpus_per_engine,
            engine_ranks=self._engine_ranks,
            on_gpu=self.cluster.on_gpu,
            multi_node=cfg.hardware.num_nodes > 1,
            fp8=self.plan.runtime.fp8,
            timeout_s=cfg.trainer.collective_timeout_s,
            ranks=self._train_ranks(),
        )
        self.weight_sync = WEIGHT_SYNCS[kind](context)
        if cfg.engine.weight_probe:
            ask = self.call_trainer(0, trainer_side.probe_prompt_ids, PROBE_TEXT)
            prompt = (await self.on_ranks("tokenizing the weight probe's prompt", [ask]))[0]
            self.probe = ProbeSettings(
                prompt_ids=tuple(prompt),
                temperature=cfg.recipe.rollout.temperature,
                tolerance=cfg.engine.weight_probe_tolerance,
                seed=cfg.run.seed,
            )
        log.info("weight sync: %s; offload around training: %s", kind, self.offload)

    # ---- calling the train ranks ---------------------------------------------------------

    async def on_ranks(
        self, what: str, refs: Sequence[Any], progress: Callable[[], int] | None = None
    ) -> list[Any]:
        """Await one call on every train rank (`await_ranks`, within
        trainer.collective_timeout_s)."""
        timeout_s = self.cfg.trainer.collective_timeout_s
        return await await_ranks(what, refs, timeout_s, progress, self._train_ranks())

    def _train_ranks(self) -> Awaited:
        """The train ranks as a fault in a call on them names them: by rank, with their logs."""
        return Awaited(
            logs=tuple(train_rank_log(self.run_dir, r) for r in range(len(self.trainers)))
        )

    async def call_trainer(self, rank: int, fn: Any, *args: Any) -> Any:
        """`fn(trainer, *args)` in train rank `rank`'s process."""
        return await self.trainers[rank].__ray_call__.remote(on_trainer, fn, *args)

    def _read_on_every_node(self) -> dict[str, str]:
        """The folders the ranks and engines on each node read, by config key: the model's
        and a checkpoint to resume from outside the run directory (which is checked itself)."""
        model = self.cfg.model
        # as the preflight checks them: the reference only where the recipe reads it
        reference = model.ref_load if self.cfg.recipe.algo.reference_interval > 0 else None
        folders = {
            key: os.path.abspath(path)
            for key, path in (
                ("model.hf_checkpoint", model.hf_checkpoint),
                ("model.ref_load", reference),
                ("model.load", model.load),
            )
            if path
        }
        outside = self.resume_from and not self.resume_from.resolve().is_relative_to(
            self.run_dir.resolve()
        )
        if self.resume_from is not None and outside:
            folders["run.resume"] = str(self.resume_from.resolve())
        return folders

    def _rank_reads(self) -> int:
        """A figure that changes while the train ranks read the folders they start or resume
        from (`rank_io`)."""
        return reads_seen(self.reads_dir)

    def _on_all_trainers(self, fn: Any, *args: Any) -> list[Any]:
        return [t.__ray_call__.remote(on_trainer, fn, *args) for t in self.trainers]

    def _engine_ranks(self, url: str) -> Sequence[int]:
        """The train rank on each GPU of the engine at `url`, in its TP order (colocated)."""
        assert self.pool is not None
        placement = self.plan.placement
        engine = placement.engines[self.pool.urls.index(url)]
        return [placement.train_slots.index(slot) for slot in engine.slots]

    def _router_gone(self) -> str | None:
        router = self.router
        return None if router is None or router.is_running else "the sglang-router process exited"

    async def diagnose(self) -> str | None:
        """A part of the run that has died (the router process, an engine), or None."""
        if self.router is not None and not self.router.is_running:
            return f"the sglang-router process exited (see {self.run_dir / 'logs/router.log'})"
        if self.pool is not None and self.pool.exhausted:
            return f"{self.pool.exhausted}; see the engine logs in {self.run_dir / 'logs'}"
        if self.pool is not None:
            dead = await self.pool.dead()
            if dead:
                gone = "; ".join(dead[i] for i in sorted(dead))
                return f"{gone} (see the engine logs in {self.run_dir / 'logs'})"
        return None

    async def fault_behind(self, exc: BaseException, starting: bool = False) -> RunFault | None:
        """The fault that `exc` is a symptom of, when it is not one itself: a request that
        failed because an engine or the router had died, an engine killed while starting
        (`starting`: the session's start failed). Ray's own word that an actor died, many
        lines, becomes one that names the actor. None when `exc` is a RunFault already or
        nothing has died (a bug, a hook that raises)."""
        if is_fault(exc):
            return death_fault(exc, self._actor_names(), starting)
        part = killed_while_starting(exc, self._actor_parts())
        if part is not None:
            why = remote_cause(exc)
            return RunFault(f"the {part} was killed while starting ({why})", component=part)
        try:
            dead = await self.diagnose()
        except Exception:  # asking must not hide the failure being explained
            log.warning("could not tell whether a part of the run died", exc_info=True)
            return None
        if dead is None:
            return None
        part = "router" if self._router_gone() else "engine"
        return RunFault(f"{dead} ({type(exc).__name__}: {exc})", component=part)

    def _actor_parts(self) -> dict[str, str]:
        """The part each of the session's actors other than the engines is, by actor id."""
        parts = {t._actor_id.hex(): "train rank" for t in self.trainers}
        if self.reward_actor is not None:
            parts[self.reward_actor._actor_id.hex()] = REWARD_MODEL_ACTOR
        return parts

    def _actor_names(self) -> dict[str, ActorPart]:
        """Each of the session's actors as a failure names it, by actor id."""
        names = {
            t._actor_id.hex(): ActorPart(
                "train rank", f"train rank {rank}", train_rank_log(self.run_dir, rank)
            )
            for rank, t in enumerate(self.trainers)
        }
        if self.reward_actor is not None:
            name = f"{REWARD_MODEL_ACTOR} ({self.cfg.recipe.rollout.reward.model})"
            names[self.reward_actor._actor_id.hex()] = ActorPart(
                REWARD_MODEL_ACTOR, name, reward_model_log(self.run_dir)
            )
        for engine in self.pool.engines if self.pool is not None else []:
            if isinstance(engine, RayEngine):
                for actor_id, log in engine.logs_by_actor().items():
                    names[actor_id] = ActorPart("engine", f"engine {engine.index}", Path(log))
        return names

    # ---- per rollout -------------------------------------------------------------------

    async def train(self, batch: list[TrainSample], with_reference: bool) -> dict[str, float]:
        """Every rank gets the whole rollout and takes its own share (see TorchTrainer);
        `with_reference`: the reference forward runs this rollout (Plan.work).
        With offload, the engines release their memory first and the trainers give theirs
        back after; push_weights brings the engines back."""
        if self.offload:
            await self._release_engines()
            await self.on_ranks("onload", self._on_all_trainers(trainer_side.onload))
        ref = ray.put(batch)
        calls = [t.train.remote(ref, with_reference) for t in self.trainers]
        results = await self.on_ranks("a train step", calls)
        if self.offload:
            await self.on_ranks("offload", self._on_all_trainers(trainer_side.offload))
        merged: dict[str, float] = dict(results[0])
        # each rank saw its own share, and measured its own memory
        for key in (k for k in merged if k.endswith("_max") or k in RANK_PEAK_METRICS):
            merged[key] = max(r[key] for r in results if key in r)
        return merged

    async def _release_engines(self) -> None:
        assert self.pool is not None
        async with self.pool.exclusive():
            await self.pool.release_memory(RELEASE_STAGES)

    async def push_weights(self, version: int) -> float:
        """The trainers' weights to every engine as `version` (see weight_sync), after
        restarting any engine that died; every engine must then report `version`. Returns
        the seconds it took."""
        assert self.client is not None and self.pool is not None and self.weight_sync
        start = time.perf_counter()
        fault_tolerant = self.cfg.engine.fault_tolerance
        async with self.pool.exclusive():
            for attempt in range(1, PUSH_ATTEMPTS + 1):
                if fault_tolerant:
                    await self.pool.heal()
                else:
                    await self._refuse_dead_engines()
                await self.pool.resume_memory([("weights",)], done=False)
                urls = self.pool.serving_urls
                try:
                    await update_engines(self.client, self.weight_sync, urls, version)
                    break
                except Exception as exc:
                    # An engine that died during the update is restarted (and caught up to
                    # the previous version) by the next heal; then every engine gets it.
                    dead = await self.pool.dead() if fault_tolerant else {}
                    if not dead or attempt == PUSH_ATTEMPTS:
                        raise
                    log.warning("weight update to version %d: %s (%s); pushing again",
                                version, "; ".join(dead.values()), exc)  # fmt: skip
            await self.pool.resume_memory([("kv_cache",), ("cuda_graph",)], done=True)
            self.weight_version, self.pushed = version, True
            if self.probe is not None:
                gaps = await probe_weights(self.client, urls, self._trainer_logprobs, self.probe)
                log.info("weight probe after version %d: %s", version, gaps)
        seconds = time.perf_counter() - start
        log.info("weights v%d pushed in %.2f s", version, seconds)
        return seconds

    async def _refuse_dead_engines(self) -> None:
        """Without engine fault tolerance nothing watches the engines, and a dead one's port
        is free for another run on this machine to take: a weight update sent there would
        load this run's weights into that run's engine (seen: a run that started while
        another's engine was dead served the other's weights). So a dead engine is a fault
        here, before any weights go out."""
        assert self.pool is not None
        dead = await self.pool.dead()
        if dead:
            gone = "; ".join(dead[i] for i in sorted(dead))
            logs = self.run_dir / "logs"
            raise RunFault(f"{gone} (see the engine logs in {logs})", component="engine")

    async def _trainer_logprobs(self, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
        """Rank 0's answer; every rank computes it (a sharded trainer's forward is collective)."""
        refs = self._on_all_trainers(trainer_side.probe_logprobs, prompt_ids, output_ids)
        results = await self.on_ranks("the weight probe", refs)
        first: list[float] = results[0]
        return first

    async def _catch_up(self, url: str) -> None:
        """A restarted engine loads the weights the others serve before it is registered."""
        if self.pushed:
            assert self.client is not None and self.weight_sync is not None
            await update_engines(self.client, self.weight_sync, [url], self.weight_version)

    # ---- checkpoints ---------------------------------------------------------------------

    async def save_trainer(self, staging: Path, with_optimizer: bool) -> None:
        """Every rank writes its RNG and its part of the trainer's state (see run_state)."""
        from rlpost.runtime.run_state import save_rank_state

        refs = [
            t.__ray_call__.remote(on_trainer, save_rank_state, str(staging), rank, with_optimizer)
            for rank, t in enumerate(self.trainers)
        ]
        # a save of a large trainer can outlast the timeout: it runs while it still writes
        await self.on_ranks("a checkpoint save", refs, progress=lambda: bytes_under(staging))

    async def load_trainer(self, checkpoint: Path) -> list[int]:
        """Load a checkpoint into every rank; returns the ranks that had no saved RNG."""
        refs = [
            t.__ray_call__.remote(
                on_trainer, load_metered, str(checkpoint), rank, str(self.reads_dir)
            )
            for rank, t in enumerate(self.trainers)
        ]
        # like a save, it runs while it still reads (a large model's outlasts the timeout)
        found = await self.on_ranks("loading the checkpoint", refs, progress=self._rank_reads)
        return [rank for rank, ok in enumerate(found) if not ok]

    async def export_policy(self, out_dir: Path) -> None:
        """The current policy as an HF folder (written by rank 0, atomically); like a save,
        it runs while it still writes (a large model's export outlasts the timeout)."""
        from rlpost.backends.hf_folder import staging_folders

        await self.on_ranks(
            "an HF export",
            [t.export_hf.remote(str(out_dir)) for t in self.trainers],
            progress=lambda: sum(bytes_under(folder) for folder in staging_folders(out_dir)),
        )

    async def use_deterministic_algorithms(self) -> None:
        from rlpost.runtime.run_state import use_deterministic_algorithms

        refs = [t.__ray_call__.remote(use_deterministic_algorithms) for t in self.trainers]
        await self.on_ranks("switching to deterministic kernels", refs)
