"""torch.distributed's TCP rendezvous, listening on one address only.

`init_process_group(init_method="tcp://host:port")` makes rank 0 a TCPStore server that
binds every interface (`::`) whatever host it is given; the host only tells the other ranks
where to connect. Rank 0 here binds the socket itself, on host, or takes the one it has held
since it chose the port (`rlpost.backends.ports.hold_port`), and hands it to the store
(`master_listen_fd`); the other ranks connect as before, so a peer that rendezvouses by URL
(SGLang's `init_custom_process_group`) meets it unchanged. Measured with torch 2.13: the
default store listens on `::`, this one on the address given only.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import TypedDict

from torch.distributed import Store, TCPStore  # type: ignore[attr-defined]

from rlpost.backends.ports import take_held_port

TCP_PREFIX = "tcp://"


class Rendezvous(TypedDict, total=False):
    """`init_process_group`'s keyword arguments for where the ranks meet: one of the two."""

    init_method: str
    store: Store


def tcp_store(host: str, port: int, rank: int, world_size: int, timeout: timedelta) -> Store:
    """The rendezvous store at host:port; rank 0 serves it on host alone."""
    if rank != 0:
        return TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    held = take_held_port(host, port)  # this process's port since it was chosen, if held
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with held or socket.socket(family, socket.SOCK_STREAM) as listener:
        if held is None:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, port))
        listener.listen(max(world_size, 128))
        bound_port = listener.getsockname()[1]
        # the store owns the socket from here on: the `with` must not close it
        fd = listener.detach()
    return TCPStore(
        host, bound_port, world_size, is_master=True, timeout=timeout, master_listen_fd=fd
    )


def process_group_store(
    init_method: str | None,
    host: str,
    port: int,
    rank: int,
    world_size: int,
    timeout: timedelta,
) -> Rendezvous:
    """`init_process_group` keyword arguments for a rendezvous: a `file://` init_method as
    it is, else a TCP store served on host only."""
    if init_method is not None and not init_method.startswith(TCP_PREFIX):
        return {"init_method": init_method}
    if init_method is not None:
        host, _, port_text = init_method.removeprefix(TCP_PREFIX).rpartition(":")
        port = int(port_text)
    return {"store": tcp_store(host, port, rank, world_size, timeout)}
