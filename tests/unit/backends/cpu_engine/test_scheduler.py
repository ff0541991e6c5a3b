"""The scheduler's batches: continuous batching mixes requests; batching per request
(`run.deterministic`) gives a request the same numerics whatever else is waiting."""

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
    settings = EngineSettings(
        model_path=str(tiny_lm_dir), seed=7, num_threads=1, batch_per_request=True
    )
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


GROUP = ["What is 12+19?"] * 4  # a group: one prompt, four samples


def test_a_request_batched_alone_has_the_same_bits_whatever_else_waits(
    engine: CpuEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group's samples come out bit for bit the same (tokens and logprobs) when served
    alone and when served among requests of other prompts and lengths, submitted before it
    and after it; and no batch held rows of two requests."""
    (alone,) = served(engine, request(engine, GROUP, seed=11))
    batches: list[set[int]] = []
    start = engine.generator._start

    def recording(rows: Sequence[Row]) -> Any:
        batches.append({r.request for r in rows})
        return start(rows)

    monkeypatch.setattr(engine.generator, "_start", recording)
    before = request(engine, ["7", "The answer is", "What is 29+1"], seed=3, max_new_tokens=6)
    group = request(engine, GROUP, seed=11)
    after = request(engine, ["What is 3+4? The"] * 2, seed=5, max_new_tokens=14)
    served(engine, before, group, after)
    assert outputs(group) == outputs(alone)  # exact: no tolerance
    assert len(batches) == 3 and all(len(b) == 1 for b in batches), batches


def test_continuous_batching_changes_the_last_bits_that_batching_per_request_keeps(
    engine: CpuEngine,
) -> None:
    """Why batching per request exists: the same group decoded next to another request's
    rows (one batch) gives other logprob bits than decoded alone."""
    alone = request(engine, GROUP, seed=11)
    engine.generator.run(alone)
    group = request(engine, GROUP, seed=11)
    other = request(engine, ["7", "The answer is", "What is 29+1"], seed=3)
    engine.generator.run(group + other)
    assert [r.logprobs for r in group] != [r.logprobs for r in alone]
    for mixed, single in zip(group, alone, strict=True):
        torch.testing.assert_close(mixed.logprobs, single.logprobs, atol=1e-4, rtol=0)


def test_a_request_larger_than_the_batch_cap_runs_in_batches_of_its_own(
    tiny_lm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = EngineSettings(
        model_path=str(tiny_lm_dir), seed=7, num_threads=1, max_batch_size=3,
        batch_per_request=True,
    )  # fmt: skip
    engine = CpuEngine(settings)
    try:
        sizes: list[tuple[int, set[int]]] = []
        start = engine.generator._start

        def recording(rows: Sequence[Row]) -> Any:
            sizes.append((len(rows), {r.request for r in rows}))
            return start(rows)

        monkeypatch.setattr(engine.generator, "_start", recording)
        big = request(engine, [*GROUP, "7"], seed=1, max_new_tokens=3)
        small = request(engine, ["What is 29+1"], seed=2, max_new_tokens=3)
        served(engine, big, small)
        assert [n for n, _ in sizes] == [3, 2, 1]
        assert [r for _, r in sizes] == [{big[0].request}] * 2 + [{small[0].request}]
    finally:
        engine.shutdown()
