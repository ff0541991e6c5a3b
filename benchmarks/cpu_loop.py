"""Throughput of the CPU default run: rollout and training samples/s and tokens/s, and how
close dynamic-batch packing comes to its bound.

    .venv/bin/python benchmarks/cpu_loop.py [--rollouts 20] [overrides ...]

Runs the real loop (`python launch.py`) for a few rollouts, then reads metrics.jsonl. The
first two rollouts are dropped as warm-up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WARMUP = 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=20)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        command = [
            sys.executable, str(ROOT / "launch.py"),
            f"recipe.rollout.num_rollout={args.rollouts}",
            "recipe.eval.interval=null", "recipe.eval.datasets=[]",
            "tracking.tensorboard=false", "run.progress=false",
            f"run.dir={run_dir}", *args.overrides,
        ]  # fmt: skip
        subprocess.run(command, check=True, cwd=ROOT)
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    report(records[WARMUP:] or records)


def report(records: list[dict[str, float]]) -> None:
    def total(key: str) -> float:
        return sum(float(r.get(key) or 0.0) for r in records)

    rollout_s = total("perf/rollout_time_s")
    train_s = total("train/time_s")
    samples = total("rollout/num_samples")
    response_tokens = sum(
        r["rollout/num_samples"] * r["rollout/response_len_mean"] for r in records
    )
    train_tokens = sum(r["train/tokens_per_s"] * r["train/time_s"] for r in records)
    efficiency = statistics.fmean(float(r["train/packing_efficiency"]) for r in records)
    rows = [
        ("rollouts measured", f"{len(records)}"),
        ("rollout samples/s", f"{samples / rollout_s:,.1f}"),
        ("rollout response tokens/s", f"{response_tokens / rollout_s:,.1f}"),
        ("train samples/s", f"{samples / train_s:,.1f}"),
        ("train tokens/s (prompt + response)", f"{train_tokens / train_s:,.1f}"),
        ("step time s (mean)", f"{total('perf/step_time_s') / len(records):.3f}"),
        ("packing efficiency (bound / micro-batches used)", f"{efficiency:.3f}"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name.ljust(width)}  {value}")


if __name__ == "__main__":
    main()
