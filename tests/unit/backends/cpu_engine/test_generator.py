"""The batched decoding loop against one-by-one decoding and a plain forward pass."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from rlpost.backends.cpu_engine.engine import CpuEngine, EngineSettings
from rlpost.backends.cpu_engine.generator import Row
from rlpost.backends.cpu_engine.protocol import parse_generate_request
from rlpost.backends.cpu_engine.row import FinishReason
from rlpost.backends.cpu_engine.sampling import SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_lm_dir: Path) -> Iterator[CpuEngine]:
    threads = torch.get_num_threads()
    engine = CpuEngine(EngineSettings(model_path=str(tiny_lm_dir), seed=7, num_threads=1))
    yield engine
    engine.shutdown()
    torch.set_num_threads(threads)


def prompts(engine: CpuEngine) -> list[list[int]]:
    texts = ["What is 3+4?", "The answer", "What is 12+19? The", "7", "What is 29+1"]
    return [engine.encode(t) for t in texts]


def make_row(prompt: list[int], seed: int = 0, **params: object) -> Row:
    generator = torch.Generator().manual_seed(seed)
    return Row(
        rid=f"r{seed}", prompt_ids=prompt, params=SamplingParams(**params), generator=generator
    )  # type: ignore[arg-type]


def run(engine: CpuEngine, rows: list[Row]) -> list[Row]:
    engine.generator.run(rows)
    assert all(r.finish is not None and r.done.done() for r in rows)
    return rows


def recompute_logprobs(engine: CpuEngine, row: Row, temperature: float) -> torch.Tensor:
    ids = torch.tensor([row.prompt_ids + row.output_ids])
    with torch.inference_mode():
        logits = engine.model(input_ids=ids).logits[0].float()
    start = len(row.prompt_ids)
    scaled = logits[start - 1 : -1] / (temperature or 1.0)
    logprobs = torch.log_softmax(scaled, dim=-1)
    return logprobs.gather(1, torch.tensor(row.output_ids).unsqueeze(1)).squeeze(1)


def admitting(arrivals: list[list[Row]], admitted: list[Row]) -> Callable[[int], list[Row]]:
    """An `admit` callback: the next step's arrivals each time it is asked (none once they
    run out), each also recorded in `admitted`."""

    def admit(num_running: int) -> list[Row]:
        rows = arrivals.pop(0) if arrivals else []
        admitted.extend(rows)
        return rows

    return admit


def test_batched_greedy_equals_one_by_one(engine: CpuEngine) -> None:
    params = {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}
    batched = run(engine, [make_row(p, **params) for p in prompts(engine)])
    for row in batched:
        single = run(engine, [make_row(row.prompt_ids, **params)])[0]
        assert single.output_ids == row.output_ids
        torch.testing.assert_close(single.logprobs, row.logprobs, atol=1e-5, rtol=0)


def test_seeded_sampling_does_not_depend_on_batch(engine: CpuEngine) -> None:
    params = {"max_new_tokens": 10, "temperature": 0.9, "top_p": 0.95, "ignore_eos": True}
    batch = [make_row(p, seed=i, **params) for i, p in enumerate(prompts(engine))]
    batched = run(engine, batch)
    alone = run(engine, [make_row(batch[2].prompt_ids, seed=2, **params)])[0]
    assert alone.output_ids == batched[2].output_ids
    other_seed = run(engine, [make_row(batch[2].prompt_ids, seed=99, **params)])[0]
    assert other_seed.output_ids != alone.output_ids


def test_a_groups_prompt_is_prefilled_once_and_every_row_samples_as_if_alone(
    engine: CpuEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three prompts, four rows each, interleaved and with their own seeds and lengths: the
    prefill runs over the three distinct prompts only, and each row's tokens and logprobs
    are those it gets decoded on its own."""
    params = {"temperature": 1.0, "ignore_eos": True}
    group_prompts = prompts(engine)[:3]
    rows = [
        make_row(group_prompts[i % 3], seed=i, max_new_tokens=4 + i % 5, **params)
        for i in range(12)
    ]
    prefills: list[int] = []
    forward = engine.generator._forward

    def counting(input_ids: torch.Tensor, *args: object) -> torch.Tensor:
        if input_ids.shape[1] > 1:  # a prefill, not a one-token decode step
            prefills.append(input_ids.shape[0])
        return forward(input_ids, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(engine.generator, "_forward", counting)
    run(engine, rows)
    assert prefills == [3]
    monkeypatch.undo()
    for i, row in enumerate(rows):
        alone = run(engine, [make_row(row.prompt_ids, seed=i, max_new_tokens=4 + i % 5, **params)])[
            0
        ]
        assert alone.output_ids == row.output_ids
        torch.testing.assert_close(alone.logprobs, row.logprobs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.3])
def test_logprobs_match_a_forward_pass(engine: CpuEngine, temperature: float) -> None:
    params = {"max_new_tokens": 9, "temperature": temperature, "ignore_eos": True}
    rows = run(engine, [make_row(p, seed=i, **params) for i, p in enumerate(prompts(engine))])
    for row in rows:
        expected = recompute_logprobs(engine, row, temperature)
        torch.testing.assert_close(torch.tensor(row.logprobs), expected, atol=1e-4, rtol=0)


def test_rows_stop_at_their_own_max_new_tokens(engine: CpuEngine) -> None:
    rows = [
        make_row(p, max_new_tokens=n, temperature=0.0, ignore_eos=True)
        for p, n in zip(prompts(engine), [1, 3, 7, 0, 5], strict=True)
    ]
    run(engine, rows)
    assert [len(r.output_ids) for r in rows] == [1, 3, 7, 0, 5]
    assert all(r.finish is not None and r.finish.kind == "length" for r in rows)
    assert [r.finish.length for r in rows if r.finish] == [1, 3, 7, 0, 5]


def test_stop_token_ids_end_a_row_and_min_new_tokens_defers_it(engine: CpuEngine) -> None:
    prompt = prompts(engine)[0]
    free = run(engine, [make_row(prompt, max_new_tokens=8, temperature=0.0, ignore_eos=True)])[0]
    stop = free.output_ids[3]
    first = free.output_ids.index(stop)
    stopped = run(
        engine, [make_row(prompt, max_new_tokens=8, temperature=0.0, stop_token_ids=(stop,))]
    )[0]
    assert stopped.output_ids == free.output_ids[: first + 1]
    assert stopped.finish is not None and stopped.finish.to_json() == {
        "type": "stop",
        "matched": stop,
    }
    deferred = make_row(
        prompt, max_new_tokens=8, temperature=0.0, stop_token_ids=(stop,), min_new_tokens=first + 2
    )
    run(engine, [deferred])
    assert len(deferred.output_ids) >= first + 2
    assert stop not in deferred.output_ids[: first + 2]


def test_eos_ends_a_row_unless_ignored(engine: CpuEngine) -> None:
    eos = sorted(engine.generator.eos_ids)
    assert len(eos) == 2  # tokenizer EOS plus the generation_config's extra id
    prompt = prompts(engine)[1]
    bias = tuple((token, 50.0) for token in eos[1:])
    stopped = run(engine, [make_row(prompt, max_new_tokens=5, temperature=0.0, logit_bias=bias)])
    assert stopped[0].output_ids == [eos[1]] and stopped[0].finish.kind == "stop"  # type: ignore[union-attr]
    ignored = run(
        engine,
        [make_row(prompt, max_new_tokens=5, temperature=0.0, logit_bias=bias, ignore_eos=True)],
    )
    assert ignored[0].output_ids == [eos[1]] * 5


def test_stop_strings_end_a_row(engine: CpuEngine) -> None:
    prompt = prompts(engine)[2]
    free = run(engine, [make_row(prompt, max_new_tokens=10, temperature=0.0, ignore_eos=True)])[0]
    text = engine.decode(free.output_ids, True)
    stop = text[4:6]
    assert stop.strip(), f"pick a printable stop string from {text!r}"
    row = run(
        engine,
        [make_row(prompt, max_new_tokens=10, temperature=0.0, ignore_eos=True, stop=(stop,))],
    )[0]
    assert row.finish is not None and row.finish.matched == stop
    assert stop in engine.decode(row.output_ids, True)
    assert len(row.output_ids) <= len(free.output_ids)


def test_abort_flag_finishes_rows_with_partial_output(engine: CpuEngine) -> None:
    rows = [
        make_row(p, max_new_tokens=50, temperature=0.0, ignore_eos=True) for p in prompts(engine)
    ]
    steps = 0

    def abort_second_after_three_steps() -> None:
        nonlocal steps
        steps += 1
        if steps == 3:
            rows[1].abort = FinishReason("abort", message="stop now")

    engine.generator.run(rows, abort_second_after_three_steps)
    assert rows[1].finish is not None and rows[1].finish.kind == "abort"
    assert len(rows[1].output_ids) == 3
    assert all(len(r.output_ids) == 50 for i, r in enumerate(rows) if i != 1)


def test_rows_admitted_mid_run_match_one_by_one(engine: CpuEngine) -> None:
    ps = prompts(engine)
    greedy = {"temperature": 0.0, "ignore_eos": True}
    sampled = {"temperature": 0.8, "top_k": 20, "ignore_eos": True}
    # The longest prompt finishes first, so the padding it needed is trimmed mid-run.
    first = [
        make_row(ps[2], max_new_tokens=2, **greedy),
        make_row(ps[0], max_new_tokens=12, **greedy),
    ]
    arrivals = [
        [make_row(ps[1], seed=1, max_new_tokens=9, **sampled)],
        [],
        [
            make_row(ps[3], max_new_tokens=7, **greedy),
            make_row(ps[4], seed=4, max_new_tokens=5, **sampled),
        ],
    ]
    admitted: list[Row] = []
    engine.generator.run(first, admit=admitting(arrivals, admitted))
    for row in first + admitted:
        assert row.finish is not None and row.finish.kind == "length"
        seed = int(row.rid[1:])
        alone = make_row(row.prompt_ids, seed=seed, **vars(row.params))
        run(engine, [alone])
        assert alone.output_ids == row.output_ids
        torch.testing.assert_close(alone.logprobs, row.logprobs, atol=1e-5, rtol=0)
    assert len(admitted) == 3


def test_a_row_admitted_mid_run_that_finishes_on_its_first_token_gets_no_second(
    engine: CpuEngine,
) -> None:
    """Newcomers joining a running batch whose first token ends them (a stop token, or
    max_new_tokens of 1) leave with that one token, as they do when they start a batch."""
    ps = prompts(engine)
    greedy = {"temperature": 0.0, "ignore_eos": True}
    first_token = run(engine, [make_row(ps[1], max_new_tokens=1, **greedy)])[0].output_ids[0]
    running = [make_row(ps[0], max_new_tokens=6, **greedy)]
    arrivals = [
        [
            make_row(ps[1], seed=1, max_new_tokens=6, stop_token_ids=[first_token], **greedy),
            make_row(ps[3], seed=2, max_new_tokens=1, **greedy),
        ]
    ]
    admitted: list[Row] = []
    engine.generator.run(running, admit=admitting(arrivals, admitted))
    stopped, one = admitted
    assert stopped.output_ids == [first_token] and len(stopped.logprobs) == 1
    assert stopped.finish is not None and stopped.finish.kind == "stop"
    assert len(one.output_ids) == 1 and one.finish is not None and one.finish.kind == "length"
    assert len(running[0].output_ids) == 6


def test_engine_seed_makes_unseeded_sampling_reproducible(tiny_lm_dir: Path) -> None:
    body = {"input_ids": [[40, 41], [42]], "sampling_params": {"max_new_tokens": 8, "n": 2}}

    def sample_with(seed: int) -> list[list[int]]:
        fresh = CpuEngine(EngineSettings(model_path=str(tiny_lm_dir), seed=seed, num_threads=1))
        try:
            rows = fresh.make_rows(parse_generate_request(body, fresh.encode, fresh.context_len))
            return [r.output_ids for r in run(fresh, rows)]
        finally:
            fresh.shutdown()

    first = sample_with(3)
    assert sample_with(3) == first
    assert sample_with(4) != first
    assert first[0] != first[1]  # the n samples of one prompt differ
