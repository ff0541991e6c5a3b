"""The three loop modes side by side on a decoupled CPU layout: rollouts/s, trained
samples/s, staleness and final eval accuracy, with each mode's speed-up over sync.

    .venv/bin/python benchmarks/async_loop.py [overrides ...] [--rollouts 30]
        [--modes sync async fully_async]

One train slot and one engine slot (one thread each) of the tiny default: while the trainer
trains, the engine would sit idle under `sync`; `async` generates the next rollout meanwhile
and `fully_async` never stops generating. Each mode runs the real loop (`python launch.py`)
with the same data, model and number of rollouts, so they train on the same number of
samples; the first two steps are dropped as warm-up and the last (it evaluates) too. Every
mode trains with `off_policy_correction: tis` unless an override names another. Overrides
go before --modes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WARMUP = 2
CORRECTION = "tis"
DECOUPLED = (
    "layout.colocate=false",
    "layout.train.num_gpus=1",
    "layout.rollout.num_gpus=1",
)


def correction(overrides: list[str]) -> list[str]:
    """Every mode the same recipe: truncated importance sampling against the rollout logprobs
    corrects what the async modes' staler tokens (and, in every mode, the engine's numerics)
    differ from the trained policy, at no extra forward; unless the overrides choose."""
    key = "recipe.algo.off_policy_correction="
    return [] if any(o.startswith(key) for o in overrides) else [key + CORRECTION]


def run_mode(mode: str, rollouts: int, overrides: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        command = [
            sys.executable, str(ROOT / "launch.py"), *DECOUPLED,
            f"recipe.loop.mode={mode}",
            *correction(overrides),
            f"recipe.rollout.num_rollout={rollouts}",
            f"recipe.eval.interval={rollouts}", "recipe.eval.skip_before_train=true",
            "recipe.save.interval=null",
            "tracking.tensorboard=false", "run.progress=false",
            f"run.dir={run_dir}", f"hydra.run.dir={Path(tmp) / 'hydra'}", *overrides,
        ]  # fmt: skip
        start = time.perf_counter()
        subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    steady = records[WARMUP:-1]
    seconds = sum(r["perf/step_time_s"] for r in steady)
    eval_keys = [k for k in records[-1] if k.startswith("eval/") and k.endswith("/accuracy")]
    return {
        "rollouts/s": len(steady) / seconds,
        "trained samples/s": sum(r["rollout/num_samples"] for r in steady) / seconds,
        "step time s": seconds / len(steady),
        "staleness mean": statistics.fmean(r["rollout/staleness_mean"] for r in records),
        "staleness max": max(r["rollout/staleness_max"] for r in records),
        "trained samples": sum(r["rollout/num_samples"] for r in records),
        "final eval accuracy": records[-1][eval_keys[0]] if eval_keys else float("nan"),
        "wall s (incl. start-up)": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=30)
    parser.add_argument("--modes", nargs="+", default=["sync", "async", "fully_async"])
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    results = {}
    for mode in args.modes:
        results[mode] = run_mode(mode, args.rollouts, args.overrides)
        print(f"{mode}: done", file=sys.stderr, flush=True)
    report(results)


def report(results: dict[str, dict[str, float]]) -> None:
    modes = list(results)
    rows = list(next(iter(results.values())))
    base = results.get("sync")
    width = max(len(r) for r in [*rows, "speed-up over sync (rollouts/s)"])
    print("".ljust(width) + "".join(m.rjust(14) for m in modes))
    for row in rows:
        print(row.ljust(width) + "".join(f"{results[m][row]:14.3f}" for m in modes))
    if base is not None:
        ratios = [results[m]["rollouts/s"] / base["rollouts/s"] for m in modes]
        print(
            "speed-up over sync (rollouts/s)".ljust(width) + "".join(f"{r:13.2f}x" for r in ratios)
        )


if __name__ == "__main__":
    main()
