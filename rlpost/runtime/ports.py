"""Ports on this host: the plan's port when free, otherwise a free one."""

from __future__ import annotations

import socket


def is_port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_or_free(preferred: int, host: str = "127.0.0.1") -> int:
    """The plan's port where it is free; a local run may share the host with other runs."""
    return preferred if is_port_free(preferred, host) else free_port(host)
