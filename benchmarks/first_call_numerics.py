"""How often a fresh process's first call of a vector-math function computes other bits than
its second call: without a warm-up, and after rlpost.backends.vector_math.warm_vector_math.

    .venv/bin/python benchmarks/first_call_numerics.py [--processes 100] [--threads 2]
                                                       [--tokens 253] [--load 0]

Each process sets `--threads` intra-op threads, warms up or not, then calls each function
of rlpost.backends.vector_math.VML_OPS twice on the same float32 tensor: for cos, sin and tan
a RoPE table of `--tokens` positions (head size 64, base 1e6: the tiny model's; 253 tokens is
the packed row of tests/integration/test_resume.py's first step), for the rest values in
(0, 1) of the same size. torch splits such a tensor between the threads, so a first call is
made from two threads at once. A process counts when some function's two results differ.
`--load N` keeps N busy-looping processes running meanwhile (a machine shared with a run's
other processes: engines, the other rank, the driver).

Printed per arm: the processes with a first call that differs, and which functions.
Exit status 1 when a warmed process has one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import hashlib, json, sys
import torch
threads, tokens, warm = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "warm"
torch.set_num_threads(threads)
from rlpost.backends.vector_math import VML_OPS, warm_vector_math
if warm:
    warm_vector_math()
inv_freq = 1.0 / (1e6 ** (torch.arange(0, 64, 2, dtype=torch.float) / 64))
freqs = torch.arange(tokens)[:, None].float() * inv_freq
table = torch.cat((freqs, freqs), dim=-1)
unit = torch.linspace(0.01, 0.99, table.numel()).view_as(table)
digest = lambda t: hashlib.md5(t.numpy().tobytes()).hexdigest()
differ = []
for name in VML_OPS:
    x = table if name in ("cos", "sin", "tan") else unit
    op = getattr(torch, name)
    if digest(op(x)) != digest(op(x)):
        differ.append(name)
print(json.dumps(differ))
"""


@dataclass
class Arm:
    name: str
    processes: int = 0
    differing: int = 0
    ops: Counter[str] = field(default_factory=Counter)

    def line(self) -> str:
        which = ", ".join(f"{op} {n}" for op, n in sorted(self.ops.items())) or "none"
        return (
            f"  {self.name:<5} {self.differing:>4} of {self.processes:<4} processes"
            f"  (first calls that differ: {which})"
        )


def first_calls(threads: int, tokens: int, warm: bool) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(threads), str(tokens), "warm" if warm else "cold"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"a probe process failed:\n{done.stderr[-2000:]}")
    ops: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return ops


@contextlib.contextmanager
def busy_loops(count: int) -> Iterator[None]:
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def bench(processes: int, threads: int, tokens: int, load: int) -> tuple[Arm, Arm]:
    cold, warm = Arm("cold"), Arm("warm")
    with busy_loops(load):
        for _ in range(processes):  # interleaved: both arms see the same machine
            for arm in (cold, warm):
                ops = first_calls(threads, tokens, arm is warm)
                arm.processes += 1
                arm.differing += bool(ops)
                arm.ops.update(ops)
    return cold, warm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=100, help="fresh processes per arm")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads")
    parser.add_argument("--tokens", type=int, default=253, help="RoPE positions (rows)")
    parser.add_argument("--load", type=int, default=0, help="busy-looping processes")
    ns = parser.parse_args()
    cold, warm = bench(ns.processes, ns.threads, ns.tokens, ns.load)
    print(
        f"first call against second call, {ns.threads} threads, {ns.tokens} x 64 values, "
        f"{ns.load} busy loop(s):"
    )
    print(cold.line())
    print(warm.line())
    sys.exit(1 if warm.differing else 0)


if __name__ == "__main__":
    main()
