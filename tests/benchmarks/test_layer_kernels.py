"""benchmarks/layer_kernels.py runs on CPU at the tiny shape: a row per kernel with its calls per
step, eager and compiled milliseconds (equal on CPU, where nothing compiles), the varlen
kernel's attention beside the padded path and SDPA alone, transformers' own RoPE and SwiGLU
beside the kernels the torch trainer runs instead, and no compiler failure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_run_prints_every_kernel_and_the_total() -> None:
    command = [sys.executable, str(ROOT / "benchmarks" / "layer_kernels.py"), "--size", "tiny",
               "--repeats", "1", "--inner", "1"]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {}
    for line in done.stdout.splitlines():
        figures = line[32:].split()
        if len(figures) == 5 and all(f.replace(".", "").isdigit() for f in figures):
            rows[line[:32].strip()] = [float(f) for f in figures]
    expected = {"rms_norm [t, h]", "rms_norm q+k heads", "rope q", "rope k", "swiglu",
                "logprobs (output layer)", "matmuls qkv, o, fc1, fc2",
                "attention varlen kernel", "attention padded path",
                "attention (SDPA, causal, 4096)", "rope q+k, transformers' eager",
                "swiglu, two projections", "swiglu, transformers' eager"}  # fmt: skip
    assert expected <= set(rows), sorted(rows)
    for name in expected:
        calls, eager, compiled, eager_step, compiled_step = rows[name]
        assert calls > 0 and eager > 0 and compiled > 0
        assert abs(eager_step - eager * calls) <= 5e-4 * calls + 0.05  # printed rounded
        assert compiled_step >= 0
    assert "compile failures: none" in done.stdout
    total = [line for line in done.stdout.splitlines() if line.startswith("total")]
    assert len(total) == 1
