"""The CPU default run, timed: start-up, the phase split of a step, samples/s, peak memory;
and, when TRL is installed, TRL's GRPOTrainer on the same model, data and batch, with ratios.

    .venv/bin/python benchmarks/cpu_loop.py [--rollouts 40] [--no-trl] [overrides ...]

Runs the real loop (`python launch.py`, evaluation off) for `--rollouts` rollouts of 8
prompts x 8 samples and reads metrics.jsonl; the first two rollouts are warm-up. Then, with
the `bench` extra installed, benchmarks/trl_grpo.py runs as many TRL steps, one run after
the other (never side by side: both want both cores). Peak memory is the resident set of
every process of the run (the launcher, Ray, engines, trainers), sampled every 0.2 s; it
"grows" when the last quarter of the run holds more than the second quarter.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WARMUP = 2
GIB = float(1 << 30)


class MemorySampler:
    """Resident memory of a process and all its descendants, sampled in a thread."""

    def __init__(self, pid: int, every_s: float = 0.2) -> None:
        self.pid, self.every_s = pid, every_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self._stop.wait(self.every_s):
            total = 0
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    total += proc.memory_info().rss
            self.samples.append(total / GIB)

    def summary(self) -> dict[str, float]:
        if len(self.samples) < 8:
            return {}
        quarter = len(self.samples) // 4
        return {
            "peak_gib": max(self.samples),
            "second_quarter_gib": statistics.fmean(self.samples[quarter : 2 * quarter]),
            "last_quarter_gib": statistics.fmean(self.samples[3 * quarter :]),
        }


def run_rlpost(rollouts: int, overrides: list[str], tmp: Path) -> dict[str, Any]:
    run_dir = tmp / "run"
    command = [
        sys.executable, str(ROOT / "launch.py"),
        f"recipe.rollout.num_rollout={rollouts}",
        "recipe.eval.interval=null", "recipe.eval.datasets=[]", "recipe.save.interval=null",
        "tracking.tensorboard=false", "run.progress=false",
        f"run.dir={run_dir}", *overrides,
    ]  # fmt: skip
    have_psutil = importlib.util.find_spec("psutil") is not None
    start = time.time()
    proc = subprocess.Popen(command, cwd=ROOT)
    memory: dict[str, float] = {}
    if have_psutil:
        with MemorySampler(proc.pid) as sampler:
            proc.wait()
        memory = sampler.summary()
    else:
        proc.wait()
    end_to_end = time.time() - start
    if proc.returncode != 0:
        sys.exit(f"the rlpost run failed (exit {proc.returncode})")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    return {"records": records, "end_to_end_s": end_to_end, "memory": memory}


def phases(records: list[dict[str, Any]]) -> dict[str, float]:
    """Mean seconds per step of each phase, over the records after warm-up."""
    steady = records[WARMUP:] or records

    def mean(key: str) -> float:
        return statistics.fmean(float(r.get(key) or 0.0) for r in steady)

    prepare = mean("train/prepare_time_s")
    split = {
        "rollout (waiting for the batch)": mean("perf/rollout_time_s"),
        "logprob preparation (old, reference)": prepare,
        "training (forward, backward, optimizer)": mean("train/time_s") - prepare,
        "weight sync": mean("perf/weight_sync_time_s"),
    }
    split["other (data, rewards, logging)"] = mean("perf/step_time_s") - sum(split.values())
    split["step"] = mean("perf/step_time_s")
    return split


def batched_generate_s(prompts: int = 8, samples: int = 8, new_tokens: int = 16) -> float:
    """Median seconds of one HF `generate` call on the default's model and batch (the
    rollout's bound: one process, one batch, no server), sampling like the engines."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = ROOT / "rlpost" / "assets" / "qwen3-tiny"
    tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.train(False)
    data = ROOT / "rlpost" / "assets" / "data" / "arith_train.jsonl"
    rows = [json.loads(line) for line in data.open()][:prompts]
    texts = [
        tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
        for r in rows
        for _ in range(samples)
    ]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    times = []
    with torch.no_grad():
        for _ in range(5):
            start = time.perf_counter()
            model.generate(
                **batch, max_new_tokens=new_tokens, do_sample=True, top_k=0, pad_token_id=pad
            )
            times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def run_trl(steps: int, tmp: Path) -> dict[str, Any] | None:
    if importlib.util.find_spec("trl") is None:
        return None
    out = tmp / "trl.json"
    start = time.time()
    command = [sys.executable, str(ROOT / "benchmarks" / "trl_grpo.py"), f"--steps={steps}"]
    subprocess.run([*command, f"--warmup={WARMUP}", f"--out={out}"], check=True, cwd=ROOT)
    result: dict[str, Any] = json.loads(out.read_text())
    result["end_to_end_s"] = time.time() - start  # from the spawn, like rlpost's
    return result


def tail_mean(values: list[float], share: float = 0.25) -> float:
    tail = values[-max(1, int(len(values) * share)) :]
    return statistics.fmean(tail) if tail else float("nan")


def report(rl: dict[str, Any], trl: dict[str, Any] | None, generate_s: float) -> None:
    records = rl["records"]
    steady = records[WARMUP:] or records
    samples = sum(float(r["rollout/num_samples"]) for r in steady)
    loop_s = sum(float(r["perf/step_time_s"]) for r in steady)
    rewards = [float(r["rollout/reward_mean"]) for r in records]
    rows: list[tuple[str, str]] = [
        ("rollouts (after warm-up)", f"{len(records)} ({len(steady)})"),
        ("start-up: launch to first rollout s", f"{records[0].get('perf/startup_time_s', 0):.1f}"),
        ("end to end s", f"{rl['end_to_end_s']:.1f}"),
        ("steady state samples/s", f"{samples / loop_s:,.1f}"),
    ]
    rows += [(f"  {name} s", f"{value:.3f}") for name, value in phases(records).items()]
    rollout_s = phases(records)["rollout (waiting for the batch)"]
    rows.append(
        (
            "one batched HF generate, same batch s",
            f"{generate_s:.3f} (rollout / generate: {rollout_s / generate_s:.2f}x)",
        )
    )
    rows.append(
        ("reward: first rollout -> last quarter", f"{rewards[0]:.3f} -> {tail_mean(rewards):.3f}")
    )
    memory = rl["memory"]
    if memory:
        grows = memory["last_quarter_gib"] > memory["second_quarter_gib"] * 1.05
        rows += [
            ("peak RSS, all processes GiB", f"{memory['peak_gib']:.2f}"),
            (
                "RSS 2nd -> last quarter GiB",
                f"{memory['second_quarter_gib']:.2f} -> {memory['last_quarter_gib']:.2f}"
                + (" (grows)" if grows else " (flat)"),
            ),
        ]
    else:
        rows.append(("peak RSS", "not measured (install psutil: the dev or bench extra)"))
    if trl is None:
        rows.append(("TRL", "not installed (the bench extra); no side-by-side"))
    else:
        trl_rate = trl["samples"] / trl["loop_s"]
        rows += [
            ("TRL start-up: launch to first step s", f"{trl['startup_s']:.1f}"),
            ("TRL end to end s", f"{trl['end_to_end_s']:.1f}"),
            ("TRL steady state samples/s", f"{trl_rate:,.1f}"),
            (
                "TRL reward: first step -> last quarter",
                f"{trl['rewards'][0]:.3f} -> {tail_mean(trl['rewards']):.3f}",
            ),
            ("ratio steady samples/s (rlpost / TRL)", f"{samples / loop_s / trl_rate:.2f}x"),
            (
                "ratio end to end (TRL s / rlpost s)",
                f"{trl['end_to_end_s'] / rl['end_to_end_s']:.2f}x",
            ),
        ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name.ljust(width)}  {value}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=40)
    parser.add_argument("--no-trl", action="store_true", help="skip TRL even if installed")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rl = run_rlpost(args.rollouts, args.overrides, Path(tmp))
        trl = None if args.no_trl else run_trl(args.rollouts, Path(tmp))
    report(rl, trl, batched_generate_s())


if __name__ == "__main__":
    main()
