"""The router only counts as started when its own process holds its port."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlpost.runtime.router import Router, RouterPortTakenError, RouterSettings, http_json

# Another run's server on the port: answers 200 to everything, /health included.
SQUATTER = """
import http.server
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), Ok)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


@pytest.fixture
def squatter() -> Iterator[int]:
    """The port of a listening HTTP server in another process."""
    process = subprocess.Popen([sys.executable, "-c", SQUATTER], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        yield int(process.stdout.readline())
    finally:
        process.kill()
        process.wait()


def test_a_taken_port_moves_the_router_to_a_free_one(squatter: int, tmp_path: Path) -> None:
    settings = RouterSettings(port=squatter, log_path=str(tmp_path / "router.log"))
    with Router(settings) as router:
        assert router.port != squatter
        assert router.workers() == []  # the squatter answers no JSON: this is the router
        assert http_json("GET", f"{router.url}/health")[0] == 200
    assert "Address already in use" in (tmp_path / "router.log").read_text()


def test_a_required_port_that_is_taken_fails_naming_port_and_fix(
    squatter: int, tmp_path: Path
) -> None:
    log = tmp_path / "router.log"
    router = Router(RouterSettings(port=squatter, require_port=True, log_path=str(log)))
    with pytest.raises(RouterPortTakenError) as info:
        router.start()
    message = str(info.value)
    assert f"127.0.0.1:{squatter}" in message and "another process holds that port" in message
    assert "require_port=False" in message
    assert not router.is_running
    assert "Address already in use" in log.read_text()


def test_a_metrics_port_taken_while_the_router_starts_is_picked_again(
    squatter: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The metrics server's port is picked free when the command is built; another launch's
    process may take it before the router binds it (two runs started at once). The router
    then starts again with another, even when its own port must stay (require_port)."""
    import rlpost.runtime.router as router_module

    real_free_port = router_module.free_port
    picks = iter([squatter])  # the first metrics port the command is given: taken

    def free_port(host: str = "127.0.0.1") -> int:
        return next(picks, None) or real_free_port(host)

    own = real_free_port("127.0.0.1")
    settings = RouterSettings(port=own, require_port=True, log_path=str(tmp_path / "router.log"))
    monkeypatch.setattr(router_module, "free_port", free_port)
    with Router(settings) as router:
        assert router.port == own and router.workers() == []
    assert "Address already in use" in (tmp_path / "router.log").read_text()
