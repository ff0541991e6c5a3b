"""benchmarks/moe_experts.py runs on CPU at its tiny shape: both ways of computing a layer's
experts timed, and the ratio; a dense model has no experts to time."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "benchmarks" / "moe_experts.py")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, SCRIPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_tiny_run_times_both_ways_and_their_ratio() -> None:
    done = run("--tiny", "--repeats", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    times = {
        m.group(1).strip(): float(m.group(2))
        for m in re.finditer(r"^(.{28}) +([0-9.]+) ms a layer", done.stdout, re.MULTILINE)
    }
    assert set(times) == {"experts one at a time", "grouped GEMMs"}
    assert all(t > 0 for t in times.values())
    ratio = re.search(r"grouped / one at a time speed: ([0-9.]+)x", done.stdout)
    assert ratio is not None
    expected = times["experts one at a time"] / times["grouped GEMMs"]
    assert abs(float(ratio.group(1)) - expected) <= 0.01 + 0.01 * expected  # printed rounded
    assert "8 local experts, hidden 64, FFN 32" in done.stdout


def test_a_dense_model_has_no_experts_to_time() -> None:
    done = run("--model", "qwen3-0.6b")
    assert done.returncode != 0 and "qwen3-0.6b is a dense model" in done.stderr
    assert "Traceback" not in done.stderr
