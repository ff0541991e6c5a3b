"""The per-launch key that a run's engines, its router and its clients share.

Runs on one machine take engine ports from the same range, so once one run's engine has died
another run's engine may listen on its port. Every engine server is started with the launch's
key and refuses (HTTP 401) any request without it, so a run can neither drive nor health-check
another run's engine. The key travels in child processes' environments (readable only by
their user), never on a command line, in the run directory or in a log.
"""

from __future__ import annotations

import hmac
import secrets

ENGINE_KEY_ENV = "RLPOST_ENGINE_KEY"


def new_engine_key() -> str:
    return secrets.token_hex(16)


def auth_headers(key: str | None) -> dict[str, str]:
    """The header an engine started with `key` requires; none without a key."""
    return {} if key is None else {"Authorization": f"Bearer {key}"}


def is_authorized(header: str | None, key: str) -> bool:
    """Whether an `Authorization` header carries `key` (compared in constant time)."""
    return header is not None and hmac.compare_digest(header.encode(), f"Bearer {key}".encode())
