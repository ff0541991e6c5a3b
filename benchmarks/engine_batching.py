"""What determinism costs the CPU engine: one rollout's generation under each way of batching.

    .venv/bin/python benchmarks/engine_batching.py [--groups 8] [--samples 8] [--tokens 32]
                                                   [--repeats 3] [--model PATH]

One CPU engine (rlpost.backends.cpu_engine, one thread, the shipped tiny model unless
`--model`) serves a rollout's worth of requests (`--groups` prompts, `--samples` samples
each), all submitted at once, as the rollout sends them:
- continuous (the default): one /generate call per group; rows from any request share a
  batch and join it between steps;
- one row (`run.deterministic`): one call per sample, each with its own seed (the rollout's
  per-sample seeds, rlpost/runtime/determinism.py), one row per forward (`--max-batch-size 1`).
Per way: CPU seconds and wall seconds per rollout (median of the repeats after one warm-up),
the ratio to continuous batching, and whether it repeats: a last pass submits the same
requests in reverse order, and its rows (tokens and logprobs) must equal the first pass's bit
for bit. Exit status 1 when one row does not repeat.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from rlpost.backends.cpu_engine.engine import CpuEngine, EngineSettings
from rlpost.backends.cpu_engine.protocol import parse_generate_request
from rlpost.backends.cpu_engine.row import Row

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "rlpost" / "assets" / "qwen3-tiny"
# a way: the engine's settings, and whether the rollout sends one request per sample
WAYS: dict[str, tuple[dict[str, object], bool]] = {
    "continuous": ({}, False),
    "one row": ({"max_batch_size": 1}, True),
}


@dataclass(frozen=True)
class Shape:
    groups: int
    samples: int
    tokens: int


def rollout(
    engine: CpuEngine, shape: Shape, order: Sequence[int], per_sample: bool
) -> list[list[Row]]:
    """The groups' requests, submitted in `order`: one per group, or one per sample with a
    seed of its own (`per_sample`); the rows per group, in group order."""
    requests: dict[int, list[Row]] = {}
    for group in order:
        prompt = engine.encode(f"What is {group}+{3 * group + 1}?")
        bodies = [
            {"input_ids": [prompt] * count, "sampling_params": {
                "max_new_tokens": shape.tokens, "temperature": 1.0, "ignore_eos": True,
                "sampling_seed": 1000 * group + first,
            }}
            for first, count in (
                [(i, 1) for i in range(shape.samples)] if per_sample else [(0, shape.samples)]
            )
        ]  # fmt: skip
        requests[group] = []
        for body in bodies:
            request = parse_generate_request(body, engine.encode, engine.context_len)
            rows = engine.make_rows(request)
            requests[group] += rows
            engine.submit(rows)
    for rows in requests.values():
        for row in rows:
            row.done.result(timeout=600)
    return [requests[g] for g in sorted(requests)]


def outputs(groups: list[list[Row]]) -> list[tuple[list[int], list[float]]]:
    return [(list(r.output_ids), list(r.logprobs)) for rows in groups for r in rows]


def measure(
    model: Path, shape: Shape, repeats: int, settings: dict[str, object], per_sample: bool
) -> dict[str, object]:
    engine = CpuEngine(EngineSettings(model_path=str(model), seed=7, num_threads=1, **settings))  # type: ignore[arg-type]
    try:
        rollout(engine, shape, range(shape.groups), per_sample)  # warm-up
        cpu, wall = [], []
        for _ in range(repeats):
            c0, w0 = time.process_time(), time.perf_counter()
            first = rollout(engine, shape, range(shape.groups), per_sample)
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - w0)
        # the same requests, submitted in another order
        again = rollout(engine, shape, list(reversed(range(shape.groups))), per_sample)
        return {
            "cpu_s": statistics.median(cpu),
            "wall_s": statistics.median(wall),
            "repeats_exactly": outputs(again) == outputs(first),
        }
    finally:
        engine.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", type=Path, default=MODEL)
    ns = parser.parse_args(argv)
    shape = Shape(ns.groups, ns.samples, ns.tokens)
    threads = torch.get_num_threads()
    try:
        results = {way: measure(ns.model, shape, ns.repeats, *how) for way, how in WAYS.items()}
    finally:
        torch.set_num_threads(threads)
    base = results["continuous"]
    print(
        f"one rollout: {shape.groups} groups x {shape.samples} samples x {shape.tokens} tokens, "
        f"one engine thread, median of {ns.repeats}"
    )
    print(f"  {'batching':<12} {'cpu s':>7} {'wall s':>7} {'cpu / continuous':>17}  repeats")
    for way, r in results.items():
        ratio = float(r["cpu_s"]) / float(base["cpu_s"])  # type: ignore[arg-type]
        repeats = "exactly" if r["repeats_exactly"] else "no"
        print(f"  {way:<12} {r['cpu_s']:>7.2f} {r['wall_s']:>7.2f} {ratio:>17.2f}  {repeats}")
    return 0 if results["one row"]["repeats_exactly"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
