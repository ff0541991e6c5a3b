"""What a train rank prints for the person watching the run."""

from __future__ import annotations

import subprocess
import sys

NOTES = """
import logging
from rlpost.runtime.progress import trainer_notes_to_stderr

logging.getLogger("rlpost.backends.sdpa").info("before")  # dropped: the root logger's WARNING
trainer_notes_to_stderr()
trainer_notes_to_stderr()  # idempotent: one handler
logging.getLogger("rlpost.backends.sdpa").info("a note")
logging.getLogger("rlpost.backends.megatron.kernels").warning("a warning")
logging.getLogger("rlpost.backends.sdpa").debug("a debug record")
logging.getLogger("elsewhere").info("not rlpost's")
"""


def test_a_train_rank_prints_rlpost_notes_once_each_and_nothing_else() -> None:
    """In a process whose root logger stays at WARNING (a Ray worker's), rlpost's INFO records
    reach stderr once each after `trainer_notes_to_stderr`, other loggers' do not."""
    done = subprocess.run(
        [sys.executable, "-c", NOTES], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stderr.splitlines() == [
        "[rlpost] rlpost.backends.sdpa: a note",
        "[rlpost] rlpost.backends.megatron.kernels: a warning",
    ]
