"""A refusal read by a reader that leaves early (`rlpost validate ... 2>&1 | head -1`) still
exits 2, without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

COMMANDS = {
    "rlpost": [sys.executable, "-m", "rlpost.cli.main", "validate", "recipe.optim.lrr=1"],
    "launch.py": [sys.executable, str(ROOT / "launch.py"), "recipe.optim.lrr=1"],
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_refusal_into_a_closed_pipe_exits_2(name: str, tmp_path: Path) -> None:
    # The whole refusal fits a pipe's buffer, so a reader that took a few bytes and then
    # closed could do so after the last write: closing the read end before the command
    # writes anything makes every write of the refusal meet the closed pipe.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            COMMANDS[name],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=write_end,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    out = done.stdout.decode()
    assert done.returncode == 2, out
    assert "Traceback" not in out and "Exception ignored" not in out
