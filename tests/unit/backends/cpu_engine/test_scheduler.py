"""The scheduler's batches: continuous batching mixes requests, and a row's last bits
depend on what it is batched with; one row per forward (`run.deterministic`) gives a request
the same numerics whatever else is waiting."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from rlpost.backends.cpu_engine.engine import CpuEngine, EngineSettings
from rlpost.backends.cpu_engine.protocol import parse_generate_request
from rlpost.backends.cpu_engine.row import Row

SAMPLED = {"max_new_tokens": 10, "temperature": 1.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(tiny_lm_dir: Path) -> Iterator[CpuEngine]:
    threads = torch.get_num_threads()
    # a deterministic run's CPU engine (rlpost/backends/sglang/launch.py: engine_batch_size)
    settings = EngineSettings(model_path=str(tiny_lm_dir), seed=7, num_threads=1, max_batch_size=1)
    engine = CpuEngine(settings)
    yield engine
    engine.shutdown()
    torch.set_num_threads(threads)


def request(engine: CpuEngine, prompts: Sequence[str], seed: int, **params: Any) -> list[Row]:
    """The rows of one /generate request: a batch of prompts, sampled from `seed` on."""
    body = {
        "input_ids": [engine.encode(p) for p in prompts],
        "sampling_params": {**SAMPLED, "sampling_seed": seed, **params},
    }
    return engine.make_rows(parse_generate_request(body, engine.encode, engine.context_len))


def served(engine: CpuEngine, *requests: list[Row]) -> list[list[Row]]:
    """Submit the requests at once (each as one /generate call would) and wait for them."""
    for rows in requests:
        engine.submit(rows)
    for rows in requests:
        for row in rows:
            row.done.result(timeout=120)
    return list(requests)


def outputs(rows: Sequence[Row]) -> list[tuple[list[int], list[float]]]:
    return [(list(r.output_ids), list(r.logprobs)) for r in rows]


PROMPT = ["What is 12+19?"]  # one sample: deterministic requests carry one seed each


def test_a_request_served_one_row_per_forward_has_the_same_bits_whatever_else_waits(
    engine: CpuEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sample comes out bit for bit the same (tokens and logprobs) served alone and served
    among requests of other prompts and lengths submitted before and after it; every forward
    held one row."""
    (alone,) = served(engine, request(engine, PROMPT, seed=11))
    batches: list[int] = []
    start = engine.generator._start

    def recording(rows: Sequence[Row]) -> Any:
        batches.append(len(rows))
        return start(rows)

    monkeypatch.setattr(engine.generator, "_start", recording)
    before = request(engine, ["7", "The answer is", "What is 29+1"], seed=3, max_new_tokens=6)
    sample = request(engine, PROMPT, seed=11)
    after = request(engine, ["What is 3+4? The"] * 2, seed=5, max_new_tokens=14)
    served(engine, before, sample, after)
    assert outputs(sample) == outputs(alone)  # exact: no tolerance
    assert batches == [1] * 6, batches


def test_continuous_batching_changes_the_last_bits_that_one_row_per_forward_keeps(
    engine: CpuEngine,
) -> None:
    """Why a deterministic run computes one row per forward: the same sample decoded in one
    batch with other requests' rows gives other logprob bits than decoded alone."""
    alone = request(engine, PROMPT, seed=11)
    engine.generator.run(alone)
    sample = request(engine, PROMPT, seed=11)
    other = request(engine, ["7", "The answer is", "What is 29+1"], seed=3)
    engine.generator.run(sample + other)
    assert [r.logprobs for r in sample] != [r.logprobs for r in alone]
    for mixed, single in zip(sample, alone, strict=True):
        torch.testing.assert_close(mixed.logprobs, single.logprobs, atol=1e-4, rtol=0)
