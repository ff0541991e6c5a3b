"""TCP ports on this host: whether one is free, a free one, and whose socket listens on one.

Two runs on one host can pick the same free port at the same moment, so a server started on
a port only counts as up once its own process holds the listening socket (`listens_on`).
Stdlib only: the engine processes, the router and the runtime all use it.
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

LOCALHOST = "127.0.0.1"
_TCP_LISTEN = "0A"  # the LISTEN state in /proc/net/tcp


def is_port_free(port: int, host: str = LOCALHOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = LOCALHOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


# how servers say bind() failed: Python's and Rust's words for EADDRINUSE
_PORT_TAKEN = ("address already in use", "[errno 98]", "os error 98")


def says_port_taken(log_text: str) -> bool:
    """Whether a server's log says it could not bind a port (another process held it)."""
    text = log_text.lower()
    return any(sign in text for sign in _PORT_TAKEN)


_HELD: dict[tuple[str, int], socket.socket] = {}


def hold_port(host: str = LOCALHOST) -> int:
    """A port on host that this process binds and listens on now, and keeps until
    `take_held_port` hands the socket to the server that will serve it: unlike a free port
    picked and let go, no other process can take it in between."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    port = int(sock.getsockname()[1])
    _HELD[(host, port)] = sock
    return port


def take_held_port(host: str, port: int) -> socket.socket | None:
    """The listening socket `hold_port` keeps for host:port (the caller owns it from here),
    or None when this process holds none there."""
    return _HELD.pop((host, port), None)


def release_held_port(host: str, port: int) -> None:
    """Closes a held port nobody took."""
    sock = take_held_port(host, port)
    if sock is not None:
        sock.close()


def is_listened_on(port: int) -> bool | None:
    """Whether any process here listens on `port` (None: cannot tell)."""
    inodes = _listening_inodes(port)
    return None if inodes is None else bool(inodes)


def _listening_inodes(port: int) -> set[str] | None:
    """Socket inodes listening on `port` here (Linux /proc), or None where unknown."""
    inodes: set[str] = set()
    found_table = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        found_table = True
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == _TCP_LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes if found_table else None


def listens_on(pid: int, port: int) -> bool | None:
    """Whether process `pid` holds the socket listening on `port` (None: cannot tell).

    A server that lost the bind to another process must not take that process's answers
    for its own.
    """
    inodes = _listening_inodes(port)
    if inodes is None:
        return None
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return None
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(fd).removeprefix("socket:[").removesuffix("]") in inodes:
                return True
    return False
