"""An engine process only counts as up when the server answering on its port is its own, and
it does not outlive the process that started it."""

from __future__ import annotations

import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

import rlpost
from rlpost.backends.engine_key import ENGINE_KEY_ENV
from rlpost.backends.ports import free_port
from rlpost.backends.sglang.launch import EngineSpec
from rlpost.backends.sglang.process import (
    EngineProcess,
    EngineStartError,
    listens_on,
    visible_index,
)

REPO_ROOT = Path(rlpost.__file__).resolve().parent.parent


class Ok(http.server.BaseHTTPRequestHandler):
    asked: ClassVar[list[dict[str, str]]] = []  # the headers of each request, in order

    def do_GET(self) -> None:
        Ok.asked.append(dict(self.headers))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def squatter() -> Iterator[int]:
    """Another run's server, already answering 200 on the port (what it is asked: Ok.asked)."""
    Ok.asked.clear()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_listens_on_tells_whose_socket_it_is() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert listens_on(os.getpid(), port) is True
        assert listens_on(os.getppid(), port) is False


def test_a_foreign_server_on_the_port_is_not_taken_for_the_engine(
    squatter: int, tmp_path: object
) -> None:
    refused_while_loading(squatter, tmp_path, {ENGINE_KEY_ENV: "k" * 32})  # an engine's key
    # the other process was not asked at all, so it never saw the engine's key
    assert Ok.asked == []


def refused_while_loading(port: int, tmp_path: object, env: dict[str, str] | None = None) -> None:
    """An engine on `port`, still importing its libraries (not yet bound), while another
    process listens there: its start is refused, naming that process."""
    spec = EngineSpec(
        index=3, backend="cpu", model_path="/unused", host="127.0.0.1", port=port, seed=0,
        log_path=f"{tmp_path}/e.log", startup_timeout_s=1,
    )  # fmt: skip
    process = EngineProcess(spec, env)
    process.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(EngineStartError, match="listened on by another process"):
            process.wait_healthy(timeout_s=1.0)
    finally:
        process.proc.kill()
        process.proc.wait()


def test_a_port_whose_holder_never_answers_is_not_waited_on(tmp_path: object) -> None:
    """A process that accepts connections on the port and never answers (a connection of
    another process may hold it for a moment): the health check asks it nothing, so the
    start is not held for a request's timeout before the server's own failure is seen."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        holder.setblocking(False)
        refused_while_loading(holder.getsockname()[1], tmp_path)
        with pytest.raises(BlockingIOError):  # no connection came
            holder.accept()


# The launcher (or a Ray actor): starts a CPU engine from a thread that then ends, as
# `asyncio.to_thread` does, reports the server's pid and waits to be killed.
LAUNCHER = """
import sys, threading, time
from rlpost.backends.sglang.launch import EngineSpec
from rlpost.backends.sglang.process import EngineProcess
model_dir, port, log_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
spec = EngineSpec(index=0, backend="cpu", model_path=model_dir, host="127.0.0.1", port=port,
                  seed=0, log_path=log_path, startup_timeout_s=120, num_threads=1)
process = EngineProcess(spec)
starter = threading.Thread(target=process.start)
starter.start()
starter.join()
print(process.pid(), process.url, flush=True)
time.sleep(600)
"""


def is_gone(pid: int) -> bool:
    """Exited (a zombie not yet reaped by its new parent counts as exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux")
def test_engine_dies_with_a_sigkilled_launcher(tiny_lm_dir: Path, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    args = [str(tiny_lm_dir), str(free_port()), str(tmp_path / "e.log")]
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, *args], stdout=subprocess.PIPE, env=env, text=True
    )
    server_pid = None
    try:
        assert launcher.stdout is not None
        line = launcher.stdout.readline()
        assert line, f"the launcher exited with {launcher.wait()} before the engine was up"
        pid_text, url = line.split()
        server_pid = int(pid_text)
        time.sleep(0.5)  # the thread that started it has ended: the server must still serve
        with urllib.request.urlopen(f"{url}/health", timeout=10) as reply:
            assert reply.status == 200
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        deadline = time.monotonic() + 5
        while not is_gone(server_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert is_gone(server_pid), f"engine {server_pid} outlived its SIGKILLed launcher"
    finally:
        launcher.kill()
        launcher.wait()
        if server_pid is not None and not is_gone(server_pid):
            os.killpg(server_pid, signal.SIGKILL)


def test_the_base_gpu_is_the_bundles_place_among_the_gpus_the_server_sees(tmp_path: Path) -> None:
    """Ray numbers a node's GPUs by their ids, SGLang's --base-gpu-id counts the visible ones:
    under CUDA_VISIBLE_DEVICES=4,5,6,7 the engine on GPUs 6 and 7 starts at index 2."""
    spec = EngineSpec(
        index=0, backend="sglang", model_path="/ckpt", host="127.0.0.1", port=30000, seed=0,
        log_path=f"{tmp_path}/e.log", startup_timeout_s=1, gpus_per_engine=2, base_gpu_id=6,
    )  # fmt: skip
    process = EngineProcess(spec)

    def base(env: dict[str, str]) -> str:
        command = process.launch_command(env)
        return command[command.index("--base-gpu-id") + 1]

    assert base({}) == "6" == process.command()[process.command().index("--base-gpu-id") + 1]
    assert base({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}) == "2"
    assert base({"CUDA_VISIBLE_DEVICES": "GPU-5a1f,GPU-77c0"}) == "6"  # by UUID: left as it is
    assert visible_index(6, "0, 1, 6") == 2 and visible_index(3, None) == 3


def test_a_port_taken_for_a_moment_at_bind_time_moves_the_engine_to_another(
    tiny_lm_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process's connection may hold the plan's port for a moment (ports come from
    the range the system hands out for connections): the server cannot bind it, and asked
    again the port may be free. The server's own words decide: it starts once more on a
    port the system hands out. Here a listener holds the port while `is_port_free` says
    free both times, as a connection that came and went would leave it."""
    import rlpost.backends.sglang.process as process_module

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        monkeypatch.setattr(process_module, "is_port_free", lambda port, host: True)
        spec = EngineSpec(
            index=0, backend="cpu", model_path=str(tiny_lm_dir), host="127.0.0.1", port=taken,
            seed=0, log_path=str(tmp_path / "engine_0.log"), startup_timeout_s=120,
            num_threads=1,
        )  # fmt: skip
        process = EngineProcess(spec)
        try:
            url = process.start()
            assert process.port != taken and url.endswith(f":{process.port}")
            assert process.starts == 2
            assert "address already in use" in (tmp_path / "engine_0.log").read_text().lower()
        finally:
            process.stop(grace_s=2)
