"""The log a train rank or the reward model actor keeps under the run's logs/ (actor_log):
in a process of its own here, as in an actor, since it takes over the process's stdout,
stderr and fatal-signal handler."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys
from pathlib import Path
from rlpost.runtime.actor_log import log_to
log_to(Path(sys.argv[1]), "train rank 0")
print("a line the rank prints")
"""


def run_in_a_process(log: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, str(log)], capture_output=True, text=True, timeout=60
    )


def test_what_the_process_prints_goes_to_its_log_and_still_to_its_stdout(tmp_path: Path) -> None:
    log = tmp_path / "run" / "logs" / "train_rank_0.log"
    done = run_in_a_process(log)
    assert done.returncode == 0, done.stderr
    assert "a line the rank prints" in done.stdout
    text = log.read_text()
    assert "train rank 0 starts (pid" in text and "a line the rank prints" in text


def test_a_log_it_cannot_open_is_said_and_the_process_goes_on(tmp_path: Path) -> None:
    """A run directory this node cannot write (here: a file where its folder would be) costs
    the log, not the actor: its constructor must not raise."""
    (tmp_path / "run").write_text("")
    log = tmp_path / "run" / "logs" / "train_rank_0.log"
    done = run_in_a_process(log)
    assert done.returncode == 0, done.stderr
    assert "a line the rank prints" in done.stdout
    assert f"rlpost: train rank 0 keeps no log at {log}: " in done.stderr
