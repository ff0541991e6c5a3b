"""An engine process only counts as up when the server answering on its port is its own."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from rlpost.backends.sglang.launch import EngineSpec
from rlpost.backends.sglang.process import EngineProcess, EngineStartError, listens_on


class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def squatter() -> Iterator[int]:
    """Another run's server, already answering 200 on the port."""
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
    spec = EngineSpec(
        index=3, backend="cpu", model_path="/unused", host="127.0.0.1", port=squatter, seed=0,
        log_path=f"{tmp_path}/e.log", startup_timeout_s=1,
    )  # fmt: skip
    process = EngineProcess(spec)
    # stands in for an engine still importing its libraries, not yet bound
    process.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(EngineStartError, match="from another process"):
            process.wait_healthy(timeout_s=1.0)
    finally:
        process.proc.kill()
        process.proc.wait()
