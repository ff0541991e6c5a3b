"""The rollout engines as one pool: started together, registered with the router, kept alive.

With fault tolerance on, a monitor asks every engine for its health at an interval. An
engine that does not answer in time (dead, or hung) is taken out of the router, restarted in
its own slot, brought to the weight version the others serve, and only then registered
again, so no request is ever answered with stale weights. Requests that were running on it
are re-sent by the router (a reset connection, or the 503 an engine answers as it shuts down,
is retried on another engine) and, past the router's retries, by the rollout client; a sample
is filled by exactly one answer. Stopping an engine aborts nothing rlpost has to account for:
its requests are never answered with a partial output.

Health checks, restarts and weight updates exclude one another (`exclusive()`): an engine
paused for an update is never judged hung, and an update never reaches a half-restarted one.

An engine that needs more than `max_restarts` restarts (a crash loop: it dies at load, or
every time it serves) is given up: it stays out of the router and is not tried again. The run
goes on with the others; once none is left, `exhausted` says why. An engine killed while it
starts (by a signal, or its actor gone) is started again under the same count.

An engine whose process is gone is restarted at once, even in its first-wait grace: the grace
is for an engine that is slow to answer, and a dead one will never answer. Without fault
tolerance nothing restarts an engine; `dead()` names the ones that are gone, and the run
treats that as a fault (see rlpost.runtime.failures).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import ray

from rlpost.backends.sglang.launch import EngineSpec
from rlpost.backends.sglang.process import EngineProcess
from rlpost.plan import Plan
from rlpost.plan.placement import Placement
from rlpost.runtime.actors import EngineActor
from rlpost.runtime.cluster import Cluster
from rlpost.runtime.failures import killed_while_starting, said
from rlpost.runtime.remote_errors import remote_cause
from rlpost.runtime.rollout.client import EngineClient
from rlpost.runtime.router import Router, RouterWorker

log = logging.getLogger(__name__)

CatchUp = Callable[[str], Awaitable[None]]
"""Bring the engine at this URL to the weights the others serve."""


@dataclass(frozen=True)
class HealthSettings:
    """engine.fault_tolerance and its health-check timing."""

    enabled: bool = False
    interval_s: float = 30.0
    timeout_s: float = 30.0
    first_wait_s: float = 300.0
    path: str = "/health_generate"
    router_timeout_s: float = 60.0
    max_restarts: int = 3


@dataclass(frozen=True)
class Restart:
    """One engine restart, for logs and metrics."""

    index: int
    old_url: str
    new_url: str
    reason: str
    seconds: float


class EngineHandle(Protocol):
    """One engine's server process(es), wherever they run."""

    index: int

    async def start(self) -> str: ...

    async def stop(self) -> None: ...

    async def pid(self) -> int | None: ...

    async def alive(self) -> bool: ...

    async def close(self) -> None: ...


class LocalEngine:
    """An engine whose process this process starts (tests, single-process tools)."""

    def __init__(
        self,
        spec: EngineSpec,
        extra_env: dict[str, str] | None = None,
        stop_grace_s: float = 10.0,
    ) -> None:
        self.index = spec.index
        self.process = EngineProcess(spec, extra_env)
        self.stop_grace_s = stop_grace_s

    async def start(self) -> str:
        return await asyncio.to_thread(self.process.start)

    async def stop(self) -> None:
        await asyncio.to_thread(self.process.stop, self.stop_grace_s)

    async def pid(self) -> int | None:
        return self.process.pid()

    async def alive(self) -> bool:
        return self.process.is_alive()

    async def close(self) -> None:
        await self.stop()


class RayEngine:
    """An engine run by EngineActors, one per node it spans, head first."""

    def __init__(
        self,
        specs: Sequence[EngineSpec],
        make_actor: Callable[[EngineSpec], ray.actor.ActorHandle[EngineActor]],
    ) -> None:
        self.index = specs[0].index
        self.specs = list(specs)
        self.make_actor = make_actor
        self.actors: list[ray.actor.ActorHandle[EngineActor]] = []

    async def start(self) -> str:
        """Start the servers, from new actors where `stop` found any gone. An actor that
        dies here is raised, never replaced: only the pool's restarts (engine.fault_tolerance)
        start an engine again, through `stop` then `start`."""
        if not self.actors:
            self.actors = [self.make_actor(spec) for spec in self.specs]
        return await self._start_actors()

    async def _start_actors(self) -> str:
        # Every node of a multi-node engine must come up together; the head answers.
        urls: list[str] = await asyncio.gather(*(a.start.remote() for a in self.actors))
        return str(urls[0])

    def logs_by_actor(self) -> dict[str, str]:
        """The log of the server each of its actors runs, by actor id (hex)."""
        actors = zip(self.actors, self.specs, strict=False)
        return {actor._actor_id.hex(): spec.log_path for actor, spec in actors}

    async def stop(self) -> None:
        """Stop the servers. Where an actor died with its process (or its node), every
        actor of the engine is let go, so the next `start` begins from new ones: the nodes
        of a multi-node engine come up together."""

        async def stop_one(actor: ray.actor.ActorHandle[EngineActor]) -> bool:
            try:
                await actor.stop.remote()
            except ray.exceptions.RayActorError:
                log.warning("engine %d: its actor is gone", self.index)
                return False
            return True

        if not all(await asyncio.gather(*(stop_one(a) for a in self.actors))):
            for actor in self.actors:
                ray.kill(actor)
            self.actors = []

    async def pid(self) -> int | None:
        return await self.actors[0].pid.remote() if self.actors else None

    async def alive(self) -> bool:
        if not self.actors:  # never started, or let go by `stop`
            return False
        try:
            return all(await asyncio.gather(*(a.is_alive.remote() for a in self.actors)))
        except ray.exceptions.RayActorError:
            return False

    async def close(self) -> None:
        """Stop the processes, then the actors themselves (a Ray shutdown would SIGTERM
        them in the middle of their own cleanup)."""
        await self.stop()
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []


def server_slot(placement: Placement, spec: EngineSpec) -> int:
    """The slot index of an engine server process: its engine's first GPU on the node of
    its --node-rank."""
    engine = placement.engines[spec.index]
    return placement.index(engine.node_slots[spec.node_rank])


def ray_engines(
    specs: Sequence[Sequence[EngineSpec]],
    cluster: Cluster,
    plan: Plan,
    server_env: Callable[[int], dict[str, str]],
    resources: dict[str, float],
    runtime_env: dict[str, Any] | None = None,
) -> list[RayEngine]:
    """One RayEngine per engine; each node's actor in the bundle of the engine's first GPU
    on that node, its server process started with `server_env(slot index)`."""
    placement = plan.placement

    def make_actor(spec: EngineSpec) -> ray.actor.ActorHandle[EngineActor]:
        index = server_slot(placement, spec)
        options: dict[str, Any] = {"scheduling_strategy": cluster.strategy(index), **resources}
        if runtime_env is not None:
            options["runtime_env"] = runtime_env
        # mypy sees EngineActor as the plain class, not the ActorClass ray.remote made of it
        actor: ray.actor.ActorHandle[EngineActor]
        actor = EngineActor.options(**options).remote(spec, server_env(index))  # type: ignore[attr-defined]
        return actor

    return [RayEngine(per_node, make_actor) for per_node in specs]


class EnginePool:
    """Starts the engines, owns their URLs, and (when enabled) keeps them healthy."""

    def __init__(self, engines: Sequence[EngineHandle], health: HealthSettings) -> None:
        self.engines = list(engines)
        self.health = health
        self.urls: list[str] = []
        self.restarts: list[Restart] = []
        self.router: Router | None = None
        self.client: EngineClient | None = None
        self.catch_up: CatchUp | None = None
        self._serving: set[int] = set()
        self._released: set[int] = set()
        self._check_after: dict[int, float] = {}
        self._attempts: dict[int, int] = {}
        self._restart_errors: dict[int, str] = {}
        self.given_up: dict[int, str] = {}
        self._lock = asyncio.Lock()
        self._monitor: asyncio.Task[None] | None = None

    # ---- lifecycle ---------------------------------------------------------------------

    async def start(self) -> list[str]:
        self.urls = list(await asyncio.gather(*(self._first_start(e) for e in self.engines)))
        self._serving = set(range(len(self.engines)))
        grace = time.monotonic() + self.health.first_wait_s
        self._check_after = dict.fromkeys(self._serving, grace)
        return list(self.urls)

    async def _first_start(self, engine: EngineHandle) -> str:
        """Start one engine; with fault tolerance, one killed while it starts is started
        again, up to max_restarts times."""
        while True:
            try:
                return await engine.start()
            except Exception as exc:
                attempts = self._attempts.get(engine.index, 0) + 1
                if not (self.health.enabled and killed_while_starting(exc)):
                    raise
                if attempts > self.health.max_restarts:
                    raise
                self._attempts[engine.index] = attempts
                log.warning("engine %d died while starting (%s); starting it again",
                            engine.index, said(remote_cause(exc)))  # fmt: skip
                await engine.stop()

    def connect(
        self, router: Router, client: EngineClient, catch_up: CatchUp | None = None
    ) -> None:
        """The router to keep registrations in, the client whose engine list to keep, and
        how a restarted engine gets the current weights."""
        self.router, self.client, self.catch_up = router, client, catch_up
        client.set_worker_urls(self.serving_urls)

    @property
    def serving_urls(self) -> list[str]:
        return [url for i, url in enumerate(self.urls) if i in self._serving]

    async def stop(self) -> None:
        await self.stop_monitor()
        closing = (e.close() for e in self.engines)
        results = await asyncio.gather(*closing, return_exceptions=True)
        for engine, result in zip(self.engines, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("engine %d did not stop cleanly: %s", engine.index, result)

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """Hold off health checks and restarts (weight updates, memory release)."""
        async with self._lock:
            yield

    # ---- health ------------------------------------------------------------------------

    async def problem(self, index: int, *, process_only: bool = False) -> str | None:
        """Why engine `index` is unhealthy, or None. An engine whose memory is released
        cannot generate, so for it (and with `process_only`) only a process that is gone
        counts."""
        assert self.client is not None, "connect() the pool first"
        if index in self._released or process_only:
            return None if await self.engines[index].alive() else "its process exited"
        url = self.urls[index]
        try:
            status = await self.client.health_status(url, self.health.path, self.health.timeout_s)
        except TimeoutError:
            return f"no answer to {self.health.path} within {self.health.timeout_s} s"
        except Exception as exc:  # any failure to answer is the finding
            return f"{self.health.path} failed: {type(exc).__name__}: {exc}"
        return None if status == 200 else f"{self.health.path} answered HTTP {status}"

    async def heal(self, *, respect_grace: bool = False) -> list[Restart]:
        """Check every engine once and restart those that fail; the caller holds
        `exclusive()`. Engines still in their first-wait grace are only checked for a
        process that is gone, when asked."""
        now = time.monotonic()
        indices = [i for i in range(len(self.engines)) if i not in self.given_up]
        problems = await asyncio.gather(
            *(
                self.problem(i, process_only=respect_grace and now < self._check_after.get(i, 0))
                for i in indices
            )
        )
        done = []
        for index, problem in zip(indices, problems, strict=True):
            if problem is not None:
                restart = await self.restart(index, problem)
                if restart is not None:
                    done.append(restart)
        return done

    async def check(self) -> list[Restart]:
        """One monitored round: engines in their grace period are left alone."""
        async with self.exclusive():
            return await self.heal(respect_grace=True)

    async def monitor(self) -> None:
        while True:
            await asyncio.sleep(self.health.interval_s)
            try:
                await self.check()
            except Exception:  # the monitor must outlive one bad round
                log.exception("engine health round failed")

    def start_monitor(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run the monitor on `loop` (it runs whenever the loop does: rollout, updates)."""
        if self.health.enabled and self._monitor is None:
            self._monitor = loop.create_task(self.monitor())

    async def stop_monitor(self) -> None:
        task, self._monitor = self._monitor, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ---- colocated memory -------------------------------------------------------------

    async def release_memory(self, stages: Sequence[Sequence[str]]) -> None:
        """Free the serving engines' memory, one stage of tags at a time (the caller holds
        `exclusive()`); they cannot generate until `resume_memory` has run every stage."""
        assert self.client is not None, "connect() the pool first"
        indices = sorted(self._serving)
        urls = [self.urls[i] for i in indices]
        for tags in stages:
            await self.client.release_memory(tags, urls)
        self._released.update(indices)

    async def resume_memory(self, stages: Sequence[Sequence[str]], *, done: bool) -> None:
        """Give the released engines their memory back, a stage at a time (weights before
        the weight update, then KV cache and CUDA graphs). With `done`, they count as fully
        resumed afterwards."""
        assert self.client is not None, "connect() the pool first"
        indices = sorted(self._released & self._serving)
        urls = [self.urls[i] for i in indices]
        for tags in stages:
            if urls:
                await self.client.resume_memory(tags, urls)
        if done:
            self._released.clear()

    async def dead(self) -> dict[int, str]:
        """The engines (not given up) whose process is gone, each with what is known."""
        indices = [i for i in range(len(self.engines)) if i not in self.given_up]
        found = await asyncio.gather(*(self._alive(i) for i in indices))
        return {i: why for i, why in zip(indices, found, strict=True) if why is not None}

    async def _alive(self, index: int) -> str | None:
        where = f"engine {index}" + (f" at {self.urls[index]}" if index < len(self.urls) else "")
        try:
            up = await asyncio.wait_for(self.engines[index].alive(), self.health.timeout_s)
        except TimeoutError:  # its actor is stopped or stuck
            return f"{where}: its actor did not answer within {self.health.timeout_s:g} s"
        return None if up else f"{where}: its server process is gone"

    @property
    def released(self) -> bool:
        return bool(self._released)

    @property
    def exhausted(self) -> str | None:
        """Why no engine is left, once every one has been given up."""
        if len(self.given_up) < len(self.engines):
            return None
        reasons = "; ".join(f"engine {i}: {why}" for i, why in sorted(self.given_up.items()))
        return (
            f"every engine was given up after engine.max_restarts_per_engine="
            f"{self.health.max_restarts} restarts ({reasons})"
        )

    # ---- restart -----------------------------------------------------------------------

    async def restart(self, index: int, reason: str) -> Restart | None:
        """Out of the router, stop, start, catch up, back into the router.

        A failed restart leaves the engine out of service; the next round tries again.
        """
        started = time.perf_counter()
        old_url = self.urls[index]
        self._set_serving(index, False)
        self._attempts[index] = self._attempts.get(index, 0) + 1
        if self._attempts[index] > self.health.max_restarts:
            failed = self._restart_errors.get(index)
            self.given_up[index] = reason + (
                f"; its last restart failed: {failed}" if failed else ""
            )
            log.error(
                "engine %d at %s: %s; it was restarted %d time(s) already "
                "(engine.max_restarts_per_engine), so it is given up",
                index, old_url, reason, self.health.max_restarts,
            )  # fmt: skip
            return None
        log.warning("engine %d at %s: %s; restarting it", index, old_url, reason)
        self._released.discard(index)  # it comes back with its memory in place
        try:
            await self._unregister(old_url)
            await self.engines[index].stop()
            new_url = await self.engines[index].start()
            if self.catch_up is not None:
                await self.catch_up(new_url)
            self.urls[index] = new_url
            await self._register(new_url)
        except Exception as exc:  # kept out of service; retried next round
            self._restart_errors[index] = f"{type(exc).__name__}: {exc}"
            log.exception("engine %d could not be restarted; it stays out of service", index)
            return None
        self._set_serving(index, True)
        self._check_after[index] = time.monotonic() + self.health.first_wait_s
        restart = Restart(index, old_url, new_url, reason, time.perf_counter() - started)
        self.restarts.append(restart)
        log.warning("engine %d serves again at %s (%.1f s)", index, new_url, restart.seconds)
        return restart

    def _set_serving(self, index: int, serving: bool) -> None:
        if serving:
            self._serving.add(index)
        else:
            self._serving.discard(index)
        if self.client is not None:
            self.client.set_worker_urls(self.serving_urls)

    async def _unregister(self, url: str) -> None:
        router = self.router
        if router is None:
            return
        await asyncio.to_thread(router.remove_worker, url)
        await self._wait_router(
            lambda ws: all(w.url.rstrip("/") != url for w in ws), f"{url} to leave the router"
        )

    async def _register(self, url: str) -> None:
        router = self.router
        if router is None:
            return
        await asyncio.to_thread(router.add_worker, url)
        await self._wait_router(
            lambda ws: any(w.url.rstrip("/") == url and w.is_healthy for w in ws),
            f"{url} to join the router",
        )

    async def _wait_router(self, done: Callable[[list[RouterWorker]], bool], what: str) -> None:
        assert self.router is not None
        deadline = time.monotonic() + self.health.router_timeout_s
        while time.monotonic() < deadline:
            if done(await asyncio.to_thread(self.router.workers)):
                return
            await asyncio.sleep(0.1)
        raise TimeoutError(f"waited {self.health.router_timeout_s} s for {what}")
