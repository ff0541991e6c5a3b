"""The CPU default's rollout on its own: the two engines behind the router, as the loop runs
them, with each sample in a /generate call of its own and with each group in one call;
and one batched HF `generate` on the same model and batch, the rollout's bound.

    .venv/bin/python benchmarks/rollout_requests.py [--rounds 12]

The two ways take turns, round after round, so both see the same machine; each round is one
rollout of the default's 8 prompts x 8 samples (16 new tokens, temperature 1, the math
reward). Printed: the median seconds of each and its ratio to the batched generate.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from cpu_loop import batched_generate_s  # noqa: E402

from rlpost.backends.ports import free_port  # noqa: E402
from rlpost.backends.sglang.launch import EngineSpec  # noqa: E402
from rlpost.config.loader import compose_run_config  # noqa: E402
from rlpost.data.source import DataSource  # noqa: E402
from rlpost.rewards import compute_rewards, shutdown_grading_pool  # noqa: E402
from rlpost.runtime.engine_pool import LocalEngine  # noqa: E402
from rlpost.runtime.rollout.client import EngineClient  # noqa: E402
from rlpost.runtime.rollout.context import ContextFactory  # noqa: E402
from rlpost.runtime.rollout.manager import GroupRunner, SamplingSettings  # noqa: E402
from rlpost.runtime.router import Router, RouterSettings  # noqa: E402
from rlpost.types import Sample  # noqa: E402

ENGINE_ENV = {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}


async def rollouts(rounds: int, logs: Path) -> dict[str, list[float]]:
    from transformers import AutoTokenizer

    cfg, _ = compose_run_config([])
    rollout = cfg.recipe.rollout
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.hf_checkpoint)
    data = DataSource.from_config(
        cfg.recipe.data, tokenizer, n_samples_per_prompt=rollout.n_samples_per_prompt
    )
    params = SamplingSettings(
        max_new_tokens=rollout.max_response_len, temperature=rollout.temperature
    ).to_sglang()

    async def reward(samples: list[Sample]) -> list[float]:
        return await compute_rewards(samples, rollout.reward)

    engines = [
        LocalEngine(
            EngineSpec(
                index=i, backend="cpu", model_path=cfg.model.hf_checkpoint, host="127.0.0.1",
                port=free_port("127.0.0.1"), seed=i, log_path=str(logs / f"engine_{i}.log"),
                startup_timeout_s=120, num_threads=1, max_batch_size=256,
            ),
            ENGINE_ENV,
        )
        for i in range(2)
    ]  # fmt: skip
    urls = await asyncio.gather(*(e.start() for e in engines))
    router = Router(RouterSettings(log_path=str(logs / "router.log"))).start()
    times: dict[str, list[float]] = {"sample": [], "group": []}
    try:
        for url in urls:
            router.add_worker(url)
        router.wait_ready(len(urls))
        async with EngineClient(router.url, worker_urls=urls) as client:
            runners = {
                way: GroupRunner(
                    client, reward, contexts=ContextFactory(tokenizer=tokenizer),
                    group_requests=way == "group",
                )
                for way in times
            }  # fmt: skip
            for round_ in range(rounds + 1):  # the first round warms both up
                for way, runner in runners.items():
                    groups = data.next_groups(rollout.batch_size, round_)
                    start = time.perf_counter()
                    await asyncio.gather(
                        *(runner.run(g, dict(params), runner.client_for(g)) for g in groups)
                    )
                    if round_:
                        times[way].append(time.perf_counter() - start)
    finally:
        router.stop()
        await asyncio.gather(*(e.stop() for e in engines))
        shutdown_grading_pool()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        times = asyncio.run(rollouts(args.rounds, Path(tmp)))
    generate_s = batched_generate_s()
    print(f"{'one batched HF generate, same batch s':44} {generate_s:.3f}")
    for way, label in (("sample", "a request per sample"), ("group", "a request per group")):
        median = statistics.median(times[way])
        print(f"{'rollout, ' + label + ' s':44} {median:.3f} ({median / generate_s:.2f}x)")


if __name__ == "__main__":
    main()
