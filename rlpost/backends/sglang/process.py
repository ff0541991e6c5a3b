"""One engine server process on this host: start it from its spec, wait for it, stop it.

Used inside an EngineActor (in the engine's Ray bundle, so on the right node) and directly
where no Ray cluster is wanted. The process runs in a session of its own so that stopping it
also ends the workers it spawned (SGLang starts a scheduler per GPU), and it dies with the
process that started it (`start_child`): a SIGKILLed launcher or Ray actor leaves no server
behind holding GPUs and ports.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from rlpost.backends.child_process import start_child
from rlpost.backends.engine_key import ENGINE_KEY_ENV, auth_headers
from rlpost.backends.ports import (
    free_port,
    is_listened_on,
    is_port_free,
    listens_on,
    says_port_taken,
)
from rlpost.backends.sglang.launch import EngineSpec, engine_backend

VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
START_MARK = "\n=== start "  # each start's line in the engine's log
LOG_TAIL_BYTES = 16384


def visible_index(gpu_id: int, visible: str | None) -> int:
    """`gpu_id` (a node's GPU id, as Ray and nvidia-smi number them) as an index among the
    GPUs that `visible` (CUDA_VISIBLE_DEVICES) shows; itself where that lists no such id
    (unset, or GPUs named by UUID)."""
    listed = [part.strip() for part in (visible or "").split(",")]
    return listed.index(str(gpu_id)) if str(gpu_id) in listed else gpu_id


class EngineStartError(RuntimeError):
    """An engine process exited or stayed unhealthy while starting. `returncode` is the
    process's exit status when it exited (negative: the signal that killed it)."""

    def __init__(self, message: str, returncode: int | None = None) -> None:
        super().__init__(message)
        self.returncode = returncode

    @property
    def killed(self) -> bool:
        """Ended by a signal (SIGKILL, the OOM killer), not by an error of its own: starting
        again may well succeed."""
        return self.returncode is not None and self.returncode < 0


class EngineProcess:
    """The server process of one (engine, node); start() may be called again after stop()."""

    def __init__(self, spec: EngineSpec, extra_env: dict[str, str] | None = None) -> None:
        """`extra_env` may carry the launch's engine key (ENGINE_KEY_ENV): the server then
        answers only requests with it, and this process's health checks send it."""
        self.spec = spec
        self.backend = engine_backend(spec.backend)
        self.extra_env = dict(extra_env or {})
        self.key = self.extra_env.get(ENGINE_KEY_ENV) or None
        self.port = spec.port
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return self.spec.url(self.port)

    def command(self) -> list[str]:
        return self.backend.command(self.spec, self.port)

    def start(self) -> str:
        """Launch; the head returns its URL once healthy, other nodes once launched.

        The plan's port when free here (a restart may find it still held, or taken). If
        another process takes the port while this one starts, it starts once more on a
        port the system hands out: the port is held when asked again, or the server said it
        was (a connection of another process may hold it for a moment, the port chosen from
        the range the system also hands out for connections).
        """
        if self.is_alive():
            raise EngineStartError(f"engine {self.spec.index} is already running")
        spec = self.spec
        port = spec.port if is_port_free(spec.port, spec.host) else free_port(spec.host)
        try:
            return self._launch(port)
        except EngineStartError:
            if not spec.is_head or self.is_alive():
                raise
            if is_port_free(self.port, spec.host) and not self._said_port_taken():
                raise
            self.stop()
            return self._launch(free_port(spec.host))

    def _said_port_taken(self) -> bool:
        """Whether this start's log says the server could not bind its port."""
        try:
            with open(self.spec.log_path, "rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - LOG_TAIL_BYTES))
                tail = log.read().decode(errors="replace")
        except OSError:
            return False
        return says_port_taken(tail.rsplit(START_MARK, 1)[-1])

    def launch_command(self, env: Mapping[str, str]) -> list[str]:
        """The command as this host runs it, in `env`: the spec's base GPU is the GPU id Ray
        gave the bundle, which the server reads as an index into the GPUs it sees, so where
        CUDA_VISIBLE_DEVICES lists a subset of the node's GPUs (Ray then numbers them by
        their ids, 4,5,6,7) the id becomes its place in that list (0)."""
        base = visible_index(self.spec.base_gpu_id, env.get(VISIBLE_DEVICES))
        return self.backend.command(dataclasses.replace(self.spec, base_gpu_id=base), self.port)

    def _launch(self, port: int) -> str:
        spec = self.spec
        self.port = port
        env = {**os.environ, **self.backend.env(spec), **self.extra_env}
        if self.key is None:
            env.pop(ENGINE_KEY_ENV, None)
        command = self.launch_command(env)
        key_args = [] if self.key is None else self.backend.key_args(self.key)
        Path(spec.log_path).parent.mkdir(parents=True, exist_ok=True)
        with open(spec.log_path, "ab") as log:
            log.write(f"{START_MARK}{self.starts + 1}: {' '.join(command)}\n".encode())
            log.flush()
            self.proc = start_child(
                command + key_args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self.starts += 1
        if spec.is_head:
            self.wait_healthy(spec.startup_timeout_s)
        return self.url

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            if not self.is_alive():
                code = self.proc.returncode if self.proc is not None else None
                raise EngineStartError(
                    f"engine {self.spec.index} exited with {code} while starting; "
                    f"see {self.spec.log_path}",
                    returncode=code,
                )
            if not self._owns_port():
                # unbound while the server loads, or another process's: that one gets
                # neither a request (it may accept and never answer) nor the engine's key
                last = (
                    f"port {self.port} is listened on by another process"
                    if is_listened_on(self.port)
                    else "not listening yet"
                )
                time.sleep(0.2)
                continue
            try:
                url = self.url + self.backend.health_path
                request = urllib.request.Request(url, headers=auth_headers(self.key))
                with urllib.request.urlopen(request, timeout=30) as reply:
                    if reply.status == 200 and self._owns_port():
                        return
                    last = f"HTTP {reply.status}"
                    if reply.status == 200:
                        last = f"port {self.port} answers, but from another process"
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
                last = str(exc)
            time.sleep(0.2)
        raise EngineStartError(
            f"engine {self.spec.index} not healthy after {timeout_s} s ({last}); "
            f"see {self.spec.log_path}"
        )

    def _owns_port(self) -> bool:
        assert self.proc is not None
        return listens_on(self.proc.pid, self.port) is not False

    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def is_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to the process group, SIGKILL after `grace_s`; a no-op when not running."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            self._signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self._signal_group(proc, signal.SIGKILL)
                proc.wait()
        # Children of a killed parent (SGLang schedulers) may still hold the GPU or the port.
        self._signal_group(proc, signal.SIGKILL)

    @staticmethod
    def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
