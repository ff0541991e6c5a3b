"""benchmarks/first_call_numerics.py on a few processes: a line per arm, and no warmed
process whose first call of a vector-math function differs from its second."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_few_processes_print_both_arms_and_warmed_first_calls_repeat() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "first_call_numerics.py"), "--processes", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    arms = {
        m["arm"]: (int(m["differing"]), int(m["processes"]))
        for m in re.finditer(
            r"^  (?P<arm>cold|warm)\s+(?P<differing>\d+) of (?P<processes>\d+)\s+processes",
            done.stdout,
            re.MULTILINE,
        )
    }
    assert arms.keys() == {"cold", "warm"} and arms["cold"][1] == arms["warm"][1] == 2, done.stdout
    assert arms["warm"][0] == 0, done.stdout
