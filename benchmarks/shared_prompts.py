"""A group's prompt computed once, in the torch trainer and in the CPU engine, each against
its copy-per-sample counterpart, the two ways taking turns round after round.

    .venv/bin/python benchmarks/shared_prompts.py [--rounds 10]

On the shipped tiny model, in this process, one thread, with the default's shape: 8 prompts
of 17 tokens and 8 responses of 4-16 tokens each (random tokens; the arithmetic does not
depend on them). Printed, as medians after two warm-up rounds:
- a train step of the 64 samples, prompts packed once per micro-batch vs once per sample;
- one data-parallel rank's 32 samples: 4 whole groups (how ranks split groups now) vs 8
  groups of 4 (a group split over two ranks);
- the CPU engine decoding 32 rows of 4 prompts for 16 new tokens, each prompt prefilled once
  vs once per row.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from rlpost.backends.cpu_engine.row import Row
    from rlpost.backends.torch_trainer import TorchTrainer
    from rlpost.types import TrainSample

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "rlpost" / "assets" / "qwen3-tiny"
PROMPT_TOKENS = 17
VOCAB = range(10, 300)


def train_samples(rng: random.Random, groups: int, per_group: int) -> list[TrainSample]:
    from rlpost.types import TrainSample

    prompts = [[rng.choice(VOCAB) for _ in range(PROMPT_TOKENS)] for _ in range(groups)]
    samples = []
    for _ in range(per_group):
        for prompt in prompts:
            n = rng.randint(4, 16)
            response = [rng.choice(VOCAB) for _ in range(n)]
            samples.append(TrainSample(prompt + response, n, float(rng.random() < 0.5)))
    return samples


def trainer(batch_size: int, share_prompts: bool) -> TorchTrainer:
    from rlpost.backends.torch_trainer import TorchTrainer
    from rlpost.schema import AlgoConfig, OptimConfig, TrainConfig

    return TorchTrainer(
        MODEL,
        AlgoConfig(use_kl_loss=True, kl_loss_coef=0.0, eps_clip=0.2, eps_clip_high=0.28),
        OptimConfig(lr=1e-4, clip_grad=1.0),
        TrainConfig(
            global_batch_size=batch_size, use_dynamic_batch_size=True, max_tokens_per_gpu=2048
        ),
        num_threads=1,
        load_reference=False,
        share_prompts=share_prompts,
    )


def engine_rows(rng: random.Random) -> list[Row]:
    from rlpost.backends.cpu_engine.row import Row
    from rlpost.backends.cpu_engine.sampling import SamplingParams

    params = SamplingParams(max_new_tokens=16, temperature=1.0, ignore_eos=True)
    rows = []
    for g in range(4):
        prompt = [rng.choice(VOCAB) for _ in range(PROMPT_TOKENS)]
        for s in range(8):
            generator = torch.Generator().manual_seed(rng.randrange(1 << 30))
            rows.append(Row(f"{g}-{s}", list(prompt), params, generator))
    return rows


def generators() -> dict[str, Callable[[list[Row]], None]]:
    from transformers import AutoModelForCausalLM

    from rlpost.backends.cpu_engine.generator import BatchGenerator

    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    model.train(False)
    return {
        name: BatchGenerator(model, [], lambda ids, skip: "", share_prefill=share).run
        for name, share in (("prefill per row", False), ("prefill once", True))
    }


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def train_steps(
    trainer: TorchTrainer, rng: random.Random, groups: int, per_group: int
) -> Callable[[], float]:
    """Seconds of one of `trainer`'s train steps, on new samples each call."""
    return lambda: timed(lambda: trainer.train_step(train_samples(rng, groups, per_group)))


def generations(run: Callable[[list[Row]], None], rng: random.Random) -> Callable[[], float]:
    """Seconds of one of `run`'s generations, on new rows each call."""
    return lambda: timed(lambda: run(engine_rows(rng)))


def compare(title: str, ways: dict[str, Callable[[], float]], rounds: int) -> None:
    """Each way once per round, in turn; medians of the rounds after two warm-up rounds."""
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds + 2):
        for name, run in ways.items():
            times[name].append(run())
    medians = {name: statistics.median(t[2:]) for name, t in times.items()}
    (old, old_s), (new, new_s) = medians.items()
    print(f"{title}\n  {old}: {old_s:.4f} s\n  {new}: {new_s:.4f} s ({old_s / new_s:.2f}x faster)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(0)

    step = {share: trainer(64, share) for share in (False, True)}
    compare(
        "train step, 64 samples of 8 prompts",
        {
            f"prompt per {'micro-batch' if share else 'sample'}": train_steps(t, rng, 8, 8)
            for share, t in step.items()
        },
        args.rounds,
    )
    rank = trainer(32, True)
    compare(
        "one data-parallel rank, 32 samples",
        {
            "8 groups of 4 (split over ranks)": train_steps(rank, rng, 8, 4),
            "4 whole groups of 8": train_steps(rank, rng, 4, 8),
        },
        args.rounds,
    )
    compare(
        "CPU engine, 32 rows of 4 prompts, 16 new tokens",
        {name: generations(run, rng) for name, run in generators().items()},
        args.rounds,
    )


if __name__ == "__main__":
    main()
