"""Host time to pack one micro-batch for the megatron trainer (batches.build_micro_batch: token
rows, positions, the attention index, response rows), which runs before a step's first
forward while the GPU waits: 4 samples x 4096 tokens, qwen3-0.6b's micro-batch in
benchmarks/megatron_train.py.

    .venv/bin/python benchmarks/pack_micro_batch.py
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlpost.backends.megatron.batches import build_micro_batch
from rlpost.types import TrainSample

SAMPLES, TOKENS, REPEATS = 4, 4096, 9


def main() -> None:
    rng = random.Random(0)
    samples = [
        TrainSample([rng.randrange(2, 1000) for _ in range(TOKENS)], TOKENS * 3 // 4, 1.0)
        for _ in range(SAMPLES)
    ]
    indices = list(range(SAMPLES))
    build_micro_batch(samples, indices)  # warm-up
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        build_micro_batch(samples, indices)
        times.append(time.perf_counter() - start)
    ms = [t * 1e3 for t in times]
    print(
        f"build_micro_batch, {SAMPLES} x {TOKENS} tokens: median {statistics.median(ms):.1f} ms "
        f"(min {min(ms):.1f}, max {max(ms):.1f}, {REPEATS} runs)"
    )


if __name__ == "__main__":
    main()
