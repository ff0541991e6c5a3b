"""The sglang-router (a Rust gateway) as a subprocess: start, register workers, stop.

Generation goes through the router; control calls (abort, pause, weight updates) do not —
the router answers 404 to them — and go to each worker directly. The router process dies with
the process that started it (`start_child`).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from rlpost.backends.child_process import start_child
from rlpost.backends.engine_key import ENGINE_KEY_ENV, auth_headers
from rlpost.backends.ports import free_port, is_port_free, listens_on, says_port_taken

logger = logging.getLogger(__name__)

POLICIES = ("round_robin", "random", "cache_aware", "power_of_two", "manual")


class RouterError(RuntimeError):
    """The router failed to start, to register a worker, or to become ready. `returncode`
    is the process's exit status when it exited while starting (negative: the signal that
    killed it)."""

    def __init__(self, message: str, returncode: int | None = None) -> None:
        super().__init__(message)
        self.returncode = returncode

    @property
    def killed(self) -> bool:
        """Ended by a signal while starting (SIGKILL, the OOM killer), not by an error of its
        own: starting again may well succeed."""
        return self.returncode is not None and self.returncode < 0


class RouterPortTakenError(RouterError):
    """Another process holds the port the router was to listen on."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(
            f"sglang-router could not listen on {host}:{port}: another process holds that "
            f"port. Stop that process (`ss -ltnp 'sport = :{port}'` names it), or let the "
            "router take a free port (RouterSettings.require_port=False, or port=None)"
        )
        self.port = port


class _MetricsPortTaken(RouterError):
    """The router's own port was free, but another it binds (its metrics server's, picked
    free when the command was built) was taken by the time it bound it."""


@dataclass(frozen=True)
class RouterSettings:
    """How the router runs. As slime does, its health checker and circuit breaker are off:
    a paused engine must not be marked unhealthy, and a failed request is retried on
    another worker by the router's own retry loop instead."""

    policy: str = "round_robin"
    request_timeout_s: float = 3600.0
    max_retries: int = 5
    host: str = "127.0.0.1"
    port: int | None = None  # None: a free port
    # False: when another process holds `port` (a concurrent run took it first), start on a
    # free port instead; True: fail with RouterPortTakenError.
    require_port: bool = False
    startup_timeout_s: float = 60.0
    shutdown_grace_s: float = 5.0
    log_level: str = "warn"
    log_path: str | None = None  # None: the router writes to this process's stdout/stderr
    extra_args: tuple[str, ...] = ()
    # The launch's engine key (rlpost.backends.engine_key): the router sends it to every
    # worker. It reaches the router through its environment, never its command line.
    engine_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(
                f"router policy '{self.policy}' is unknown; use one of {list(POLICIES)}"
            )
        if self.request_timeout_s <= 0 or self.max_retries < 1:
            raise ValueError("router request_timeout_s must be > 0 and max_retries >= 1")


@dataclass(frozen=True)
class RouterWorker:
    id: str
    url: str
    is_healthy: bool


def http_json(
    method: str,
    url: str,
    body: Any = None,
    timeout_s: float = 10.0,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """One blocking HTTP call; returns (status, parsed JSON or text). Raises on no answer."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    text = raw.decode(errors="replace")
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


class Router:
    """A running sglang-router; use as a context manager or call start() and stop()."""

    def __init__(self, settings: RouterSettings | None = None) -> None:
        self.settings = settings or RouterSettings()
        self.port = self.settings.port or free_port(self.settings.host)
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.port}"

    def command(self) -> list[str]:
        s = self.settings
        return [
            sys.executable, "-m", "rlpost.runtime.router_main",
            "--host", s.host,
            "--port", str(self.port),
            "--policy", s.policy,
            "--request-timeout-secs", str(max(1, round(s.request_timeout_s))),
            "--retry-max-retries", str(s.max_retries),
            "--shutdown-grace-period-secs", str(max(1, round(s.shutdown_grace_s))),
            "--disable-health-check",
            "--disable-circuit-breaker",
            # Its metrics server binds a fixed port by default; two routers would collide.
            "--prometheus-host", s.host,
            "--prometheus-port", str(free_port(s.host)),
            "--log-level", s.log_level,
            *s.extra_args,
        ]  # fmt: skip

    def start(self) -> Router:
        """Launch the router and wait until it answers; it starts with no workers.

        Only the router's own process holding the port counts: a process that took the port
        first (another run's router answers /health too) is never mistaken for it. Unless
        `require_port` is set, the router then starts once more on a free port.
        """
        if self._process is not None:
            raise RouterError("the router is already running")
        try:
            return self._launch()
        except _MetricsPortTaken:  # another metrics port, on a command built anew
            logger.warning("the router's metrics port was taken while it started; retrying")
            return self._launch()
        except RouterPortTakenError:
            if self.settings.require_port:
                raise
            taken, self.port = self.port, free_port(self.settings.host)
            logger.warning("router port %d is taken by another process; using %d", taken, self.port)
            return self._launch()

    def _launch(self) -> Router:
        s = self.settings
        log = open(s.log_path, "ab") if s.log_path else None  # noqa: SIM115
        logged_before = log.tell() if log is not None else 0
        env = {k: v for k, v in os.environ.items() if k != ENGINE_KEY_ENV}
        if s.engine_key is not None:
            env[ENGINE_KEY_ENV] = s.engine_key
        try:
            process = start_child(
                self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
            )
        finally:
            if log is not None:
                log.close()  # the child holds its own descriptor
        self._process = process
        see_log = f"; see {s.log_path}" if s.log_path else ""
        last = "no answer"
        deadline = time.monotonic() + s.startup_timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                self._process = None
                if not is_port_free(self.port, s.host):
                    raise RouterPortTakenError(s.host, self.port)
                if says_port_taken(self._logged_since(logged_before)):
                    raise _MetricsPortTaken(f"a port of the router was taken{see_log}")
                raise RouterError(
                    f"sglang-router exited with code {process.returncode} at startup{see_log}",
                    returncode=process.returncode,
                )
            try:
                status, _ = self._call("GET", "/health", timeout_s=2)
            except OSError as exc:
                last = str(exc)
            else:
                last = f"HTTP {status}"
                if status == 200 and listens_on(process.pid, self.port) is not False:
                    return self
                if status == 200:
                    last = f"port {self.port} answers, but from another process"
            time.sleep(0.1)
        self.stop()
        raise RouterError(
            f"sglang-router did not answer on {self.url} within {s.startup_timeout_s} s "
            f"({last}){see_log}"
        )

    def _logged_since(self, offset: int) -> str:
        """What the router's log gained from `offset` on ('' without a log)."""
        if not self.settings.log_path:
            return ""
        try:
            with open(self.settings.log_path, "rb") as log:
                log.seek(offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def _call(
        self, method: str, path: str, body: Any = None, timeout_s: float = 10.0
    ) -> tuple[int, Any]:
        """A call to the router's own API, which its key guards too (HTTP 401 without it)."""
        headers = auth_headers(self.settings.engine_key)
        return http_json(method, f"{self.url}{path}", body, timeout_s, headers)

    def add_worker(self, worker_url: str) -> str:
        """Register a worker (the router probes its /health in the background)."""
        body = {"url": worker_url}
        if self.settings.engine_key is not None:
            body["api_key"] = self.settings.engine_key
        status, body = self._call("POST", "/workers", body)
        if status not in (200, 202) or not isinstance(body, dict):
            raise RouterError(f"adding worker {worker_url} failed: HTTP {status} {body}")
        return str(body.get("worker_id", worker_url))

    def workers(self) -> list[RouterWorker]:
        status, body = self._call("GET", "/workers")
        if status != 200 or not isinstance(body, dict):
            raise RouterError(f"listing workers failed: HTTP {status} {body}")
        return [
            RouterWorker(id=str(w["id"]), url=str(w["url"]), is_healthy=bool(w["is_healthy"]))
            for w in body.get("workers", [])
        ]

    def worker_urls(self) -> list[str]:
        return [w.url for w in self.workers()]

    def remove_worker(self, worker_url: str) -> bool:
        """Unregister a worker by URL; False when the router does not list it."""
        match = [w for w in self.workers() if w.url.rstrip("/") == worker_url.rstrip("/")]
        for worker in match:
            status, body = self._call("DELETE", f"/workers/{worker.id}")
            if status not in (200, 202, 404):
                raise RouterError(f"removing worker {worker_url} failed: HTTP {status} {body}")
        return bool(match)

    def wait_ready(self, num_workers: int, timeout_s: float = 60.0) -> None:
        """Block until the router reports exactly `num_workers` healthy workers."""
        deadline = time.monotonic() + timeout_s
        seen: Any = None
        while time.monotonic() < deadline:
            try:
                _, seen = self._call("GET", "/readiness", timeout_s=2)
            except OSError as exc:
                seen = exc
            else:
                if isinstance(seen, dict) and seen.get("healthy_workers") == num_workers:
                    return
            # Slow polling: the router logs each of its own 503 answers as an error.
            time.sleep(0.25)
        raise RouterError(
            f"router at {self.url} did not reach {num_workers} healthy workers within "
            f"{timeout_s} s; last /readiness answer: {seen}"
        )

    def stop(self, grace_s: float | None = None) -> None:
        """Terminate the router, and kill it if it has not exited after the grace period."""
        grace_s = self.settings.shutdown_grace_s + 1 if grace_s is None else grace_s
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            logger.warning("sglang-router ignored SIGTERM for %.0f s; killing it", grace_s)
            process.kill()
            process.wait()

    @property
    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def __enter__(self) -> Router:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
