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
