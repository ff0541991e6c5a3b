"""The TCP rendezvous listens on the address it is given, not on every interface (the process
groups over it: test_data_parallel.py, the weight-update group: test_weight_sync.py)."""

from __future__ import annotations

import threading
from datetime import timedelta

import psutil
import torch.distributed as dist

from rlpost.backends.ports import free_port
from rlpost.backends.stores import process_group_store, tcp_store

TIMEOUT = timedelta(seconds=30)


def listening() -> set[tuple[str, int]]:
    return {
        (c.laddr.ip, c.laddr.port)
        for c in psutil.Process().net_connections("inet")
        if c.status == psutil.CONN_LISTEN
    }


def test_rank_zero_serves_on_its_host_alone_and_peers_reach_it() -> None:
    before, port = listening(), free_port()
    peer: dict[str, dist.Store] = {}
    thread = threading.Thread(
        target=lambda: peer.update(s=tcp_store("127.0.0.1", port, 1, 2, TIMEOUT))
    )
    thread.start()
    master = tcp_store("127.0.0.1", port, 0, 2, TIMEOUT)
    thread.join()
    master.set("weights", "v3")
    assert peer["s"].get("weights") == b"v3"
    assert listening() - before == {("127.0.0.1", port)}  # torch's own store: ("::", port)


def test_a_file_rendezvous_stays_a_file() -> None:
    assert process_group_store("file:///tmp/x", "127.0.0.1", 1, 0, 2, TIMEOUT) == {
        "init_method": "file:///tmp/x"
    }


def test_a_held_port_stays_this_processs_until_its_store_serves_it() -> None:
    """The weight-update group's port is held from the moment it is chosen: no other process
    can bind it (a free port picked and let go can be taken by a launch beside this one), a
    peer that connects early is served, and the store listens on that same socket."""
    from rlpost.backends.ports import hold_port, is_port_free, take_held_port

    port = hold_port("127.0.0.1")
    assert not is_port_free(port, "127.0.0.1")  # what another launch's bind would meet
    peer: dict[str, dist.Store] = {}
    thread = threading.Thread(
        target=lambda: peer.update(s=tcp_store("127.0.0.1", port, 1, 2, TIMEOUT))
    )
    thread.start()  # connects to the held socket, before the store exists
    master = tcp_store("127.0.0.1", port, 0, 2, TIMEOUT)
    thread.join()
    master.set("weights", "v4")
    assert peer["s"].get("weights") == b"v4"
    assert take_held_port("127.0.0.1", port) is None  # the store owns the socket now
    assert ("127.0.0.1", port) in listening()
