"""benchmarks/megatron_train.py runs on CPU: the megatron trainer and the plain loop beside it
(--baseline) on the tiny Qwen3 shape, one timed rollout each."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_run_with_the_plain_loop_prints_both_and_the_ratio() -> None:
    command = [sys.executable, str(ROOT / "benchmarks" / "megatron_train.py")]
    command += ["--size", "tiny", "--steps", "1", "--baseline"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = dict(line.split("  ", 1) for line in done.stdout.splitlines() if "  " in line.strip())
    rows = {name.strip(): value.strip() for name, value in rows.items()}
    assert float(rows["MFU (of cpu's 0.1 TFLOP/s)"]) > 0
    assert float(rows["plain train tokens/s"].replace(",", "")) > 0
    assert float(rows["rlpost / plain tokens/s"]) > 0
    assert "8 samples per micro-batch" in rows["plain loop"]  # 1024 tokens / 128 per sample
