"""benchmarks/engine_batching.py on a small rollout: a line per way of batching, each with
its CPU time, and the deterministic way (one row per forward) repeating bit for bit."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_small_rollout_prints_each_way_and_the_deterministic_one_repeats() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "engine_batching.py"),
         "--groups", "3", "--samples", "3", "--tokens", "6", "--repeats", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    rows = {
        m["way"]: m
        for m in re.finditer(
            r"^  (?P<way>continuous|one row)\s+(?P<cpu>[\d.]+)\s+(?P<wall>[\d.]+)"
            r"\s+(?P<ratio>[\d.]+)\s+(?P<repeats>\w+)$",
            done.stdout,
            re.MULTILINE,
        )
    }
    assert set(rows) == {"continuous", "one row"}, done.stdout
    assert float(rows["continuous"]["ratio"]) == 1.0
    assert all(float(r["cpu"]) > 0 for r in rows.values())
    assert rows["one row"]["repeats"] == "exactly"
