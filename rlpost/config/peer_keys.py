"""The peers' keys on a launch's command line (verl's, NeMo-RL's): which peer's a key is, and
the Issue that answers it with rlpost's key (rlpost.config.verl_keys, nemo_rl_keys).

A key both peers name (data.shuffle) is answered once where their readings agree and with
each reading where they differ; a key of neither table under a section both have (data.*)
names both.
"""

from __future__ import annotations

from typing import Any

from rlpost.config import nemo_rl_keys, verl_keys
from rlpost.config.peer_rows import Line, PeerRow, read_row, readings_issue
from rlpost.errors import Issue

PEERS: tuple[tuple[str, dict[str, PeerRow], frozenset[str]], ...] = (
    ("verl", dict(verl_keys.BY_KEY), verl_keys.SECTIONS),
    ("NeMo-RL", nemo_rl_keys.BY_KEY, nemo_rl_keys.SECTIONS),
)


def is_peer_key(path: str) -> bool:
    """Whether `path` (not a key of rlpost's) is one of a peer's."""
    section = path.split(".", 1)[0]
    return any(path in rows or section in sections for _, rows, sections in PEERS)


def peer_key_issue(path: str, value: Any, line: Line, token: str) -> Issue:
    """The Issue for a peer's key `path` given `value` (`line`: the peers' keys on the
    command line)."""
    found = [(peer, rows[path]) for peer, rows, _ in PEERS if path in rows]
    if [peer for peer, _ in found] == ["verl"]:
        return verl_keys.verl_issue(path, value, line, token)
    secret = any(row.secret for _, row in found)
    shown, token = verl_keys.shown_value(path, value, token, secret)
    if not found:
        section = path.split(".", 1)[0]
        owners = " and ".join(peer for peer, _, sections in PEERS if section in sections)
        return verl_keys.section_issue(path, shown, token, owners)
    readings = [read_row(peer, row, shown, line) for peer, row in found]
    return readings_issue(path, "key", readings, shown, token, tail=", not rlpost's")
