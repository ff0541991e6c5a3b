"""Sampling seeds in deterministic mode: stable, distinct, and attached to every request."""

from __future__ import annotations

import asyncio
from typing import Any

from rlpost.runtime.determinism import Seeding, deterministic_env, sampling_seed
from rlpost.runtime.rollout.client import FinishKind, GenerateResult
from rlpost.runtime.rollout.context import GenerateContext
from rlpost.types import Sample


def test_seed_is_stable_and_fits_a_signed_64_bit_generator() -> None:
    seed = sampling_seed(1234, "train", 7, 42)
    assert seed == sampling_seed(1234, "train", 7, 42)
    assert 0 <= seed < 2**62


def test_seeds_differ_across_rounds_samples_streams_runs_and_continuations() -> None:
    keys = [
        (run, stream, rollout, index, generated)
        for run in (1, 2)
        for stream in ("train", "eval")
        for rollout in range(10)
        for index in range(64)
        for generated in (0, 5)
    ]
    assert len({sampling_seed(*key) for key in keys}) == len(keys)


def test_every_request_of_a_context_carries_the_samples_seed() -> None:
    seen: list[dict[str, Any]] = []

    class Client:
        async def generate(self, input_ids: list[int], params: dict[str, Any]) -> Any:
            seen.append(params)
            return GenerateResult([4, 5], "45", [-0.1, -0.2], FinishKind.ABORT, "0", 1, 2)

    ctx = GenerateContext(
        Client(), None, {"temperature": 1.0, "max_new_tokens": 8}, seeder=Seeding(5, "eval").at(3)
    )
    sample = Sample(group_index=0, index=9, prompt="p", prompt_ids=[1])
    asyncio.run(ctx.policy_turn(sample))
    asyncio.run(ctx.policy_turn(sample))  # continued after the interruption: its own seed
    assert seen == [
        {"temperature": 1.0, "max_new_tokens": 8, "sampling_seed": sampling_seed(5, "eval", 3, 9)},
        {
            "temperature": 1.0,
            "max_new_tokens": 6,
            "sampling_seed": sampling_seed(5, "eval", 3, 9, generated=2),
        },
    ]


def test_deterministic_gpu_ranks_get_cublas_fixed_workspace() -> None:
    """torch refuses every cuBLAS call under deterministic kernels unless the process started
    with a fixed cuBLAS workspace: a deterministic GPU run's train ranks get one, and no
    other run's do."""
    assert deterministic_env(True, on_gpu=True) == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    assert deterministic_env(True, on_gpu=False) == {}
    assert deterministic_env(False, on_gpu=True) == {}
