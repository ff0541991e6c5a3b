"""Ports on this host: the plan's port when free, otherwise a free one."""

from __future__ import annotations

from rlpost.backends.ports import LOCALHOST, free_port, is_port_free


def port_or_free(preferred: int, host: str = LOCALHOST) -> int:
    """The plan's port where it is free; a local run may share the host with other runs."""
    return preferred if is_port_free(preferred, host) else free_port(host)
