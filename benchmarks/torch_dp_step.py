"""The torch trainer's step with two data-parallel ranks over gloo, as the CPU default runs
it: FSDP2 with the whole model one unit (the CPU choice) against a unit per decoder layer
(the CUDA structure), the two taking turns.

    .venv/bin/python benchmarks/torch_dp_step.py [--rounds 4] [--steps 30]

Each round starts two rank processes (spawned, one thread each) per way, builds the shipped
tiny model and trains `--steps` rollouts of the default's shape: 8 prompts of 17 tokens and
8 responses of 4-16 tokens each (random tokens; the arithmetic does not depend on them), 64
samples, one optimizer step. Printed: per way, the median over rounds of each round's median
step (the first three steps of each round left out), each rank's CPU seconds per step (the
process, and its main thread: the rest is gloo's threads), and the ratio of the two ways.
On two cores the ranks' CPU time bounds the step: a way that saves CPU saves time.
"""

from __future__ import annotations

import argparse
import random
import socket
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.multiprocessing as mp

if TYPE_CHECKING:
    from rlpost.types import TrainSample

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "rlpost" / "assets" / "qwen3-tiny"
WARM_UP = 3
WAYS = {"one unit (CPU)": False, "a unit per layer (CUDA)": True}


def rollout(seed: int) -> list[TrainSample]:
    from rlpost.types import TrainSample

    rng = random.Random(seed)
    vocab = range(10, 300)
    prompts = [[rng.choice(vocab) for _ in range(17)] for _ in range(8)]
    samples = []
    for _ in range(8):
        for prompt in prompts:
            n = rng.randint(4, 16)
            samples.append(
                TrainSample(
                    prompt + [rng.choice(vocab) for _ in range(n)], n, 1.0 * (rng.random() < 0.5)
                )
            )
    return samples


def rank_main(rank: int, port: int, per_layer: bool, steps: int, out: Any) -> None:
    from rlpost.backends.torch_trainer import TorchTrainer
    from rlpost.schema import AlgoConfig, OptimConfig, TrainConfig

    trainer = TorchTrainer(
        MODEL,
        AlgoConfig(use_kl_loss=True, kl_loss_coef=0.0, eps_clip=0.2, eps_clip_high=0.28),
        OptimConfig(lr=1e-4, adam_beta2=0.98, clip_grad=1.0),
        TrainConfig(
            global_batch_size=64,
            use_dynamic_batch_size=True,
            max_tokens_per_gpu=2048,
            balance_data=True,
        ),
        rank=rank,
        world_size=2,
        master_port=port,
        num_threads=1,
        load_reference=False,
        per_layer_units=per_layer,
    )
    wall, process, thread = [], [], []
    for step in range(steps):
        batch = rollout(step)
        w, p, t = time.perf_counter(), time.process_time(), time.thread_time()
        trainer.train_step(batch)
        wall.append(time.perf_counter() - w)
        process.append(time.process_time() - p)
        thread.append(time.thread_time() - t)
    trainer.close()
    out.put((rank, [statistics.median(x[WARM_UP:]) for x in (wall, process, thread)]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_round(per_layer: bool, steps: int) -> tuple[float, float, float]:
    """The slower rank's median step, and the ranks' mean CPU seconds (process, main thread)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    ranks = [ctx.Process(target=rank_main, args=(r, port, per_layer, steps, out)) for r in (0, 1)]
    for p in ranks:
        p.start()
    results = [out.get(timeout=600)[1] for _ in ranks]
    for p in ranks:
        p.join()
        if p.exitcode:
            raise SystemExit(f"a rank exited with {p.exitcode}")
    return (
        max(r[0] for r in results),
        statistics.mean(r[1] for r in results),
        statistics.mean(r[2] for r in results),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    if args.steps <= WARM_UP:
        parser.error(f"--steps must be more than the {WARM_UP} warm-up steps")
    rounds: dict[str, list[tuple[float, float, float]]] = {name: [] for name in WAYS}
    for _ in range(args.rounds):
        for name, per_layer in WAYS.items():
            rounds[name].append(one_round(per_layer, args.steps))
    print(f"two ranks over gloo, 64 samples a step, {args.rounds} rounds of {args.steps} steps")
    medians: dict[str, float] = {}
    for name, results in rounds.items():
        wall, process, thread = (statistics.median(r[i] for r in results) for i in range(3))
        medians[name] = wall
        print(
            f"  {name}: {wall * 1e3:.1f} ms a step; CPU a rank {process * 1e3:.1f} ms "
            f"({thread * 1e3:.1f} ms main thread)"
        )
    (one, one_s), (each, each_s) = medians.items()
    print(f"  {each} / {one}: {each_s / one_s:.2f}x")


if __name__ == "__main__":
    main()
