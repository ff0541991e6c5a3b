"""The cost model's generation time in mode=eval is the evaluation sets': each set in turn at
its own prompt and response bounds and samples, never training's rollout batch and lengths
(rlpost.plan.generation)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rlpost.plan import build_plan, plan_config, render_plan
from rlpost.plan.cost import rollout_time
from rlpost.plan.generation import EVAL_PROMPTS_PER_SET, eval_generations, sliced_rows
from rlpost.plan.params import count_params
from rlpost.schema import RunConfig
from rlpost.schema.layout import LayoutConfig

MakeRun = Callable[..., RunConfig]
AIME = {"name": "aime", "path": "/data/aime-2024.jsonl@[0:30]"}
MATH = {"name": "math500", "path": "/data/math-500.jsonl@[0:60]"}


def generation_s(cfg: RunConfig) -> float:
    """The generation time of the plan's own layout, as layout=auto's search counts it."""
    plan = build_plan(cfg)
    params = count_params(cfg.model)
    return rollout_time(cfg, plan.engine, plan.memory.rollout, plan.batch, params).total_s


def evaluating(run_config: MakeRun, *datasets: dict[str, Any], **overrides: Any) -> RunConfig:
    return run_config(
        "qwen3-4b", "h100x8", mode="eval", recipe__eval__datasets=list(datasets), **overrides
    )


def test_an_evaluation_is_timed_at_its_sets_lengths_not_trainings(run_config: MakeRun) -> None:
    """A set of 16384-token responses generates 16x the decode steps of one of 1024 (and the
    engines hold fewer of its samples at once): its time follows the set's length, whatever
    training's rollout.max_response_len, batch and prompt bound say; training is timed at its
    own, whatever the sets'."""
    short = generation_s(evaluating(run_config, AIME, recipe__eval__max_response_len=1024))
    long = generation_s(evaluating(run_config, AIME, recipe__eval__max_response_len=16384))
    assert long > 12 * short
    trainings = {
        "recipe__rollout__max_response_len": 1024,
        "recipe__rollout__batch_size": 256,
        "recipe__data__max_prompt_len": 8192,
    }
    for key, value in trainings.items():
        changed = evaluating(run_config, AIME, recipe__eval__max_response_len=16384, **{key: value})
        assert generation_s(changed) == pytest.approx(long), key
    prompted = evaluating(
        run_config, AIME, recipe__eval__max_response_len=16384, recipe__eval__max_prompt_len=8192
    )
    assert generation_s(prompted) > long  # the sets' prompt bound is prefilled
    training = generation_s(run_config("qwen3-4b", "h100x8"))
    sets_long = run_config("qwen3-4b", "h100x8", recipe__eval__max_response_len=30000)
    assert generation_s(sets_long) == pytest.approx(training)


def test_each_set_adds_its_own_generation_as_its_size_says(run_config: MakeRun) -> None:
    """Sets are generated one after another: a second set adds its own time, twice the
    prompts (its row slice's count) adding about twice a set's; a set whose path counts no
    rows is timed at EVAL_PROMPTS_PER_SET prompts, and its n_samples_per_prompt multiplies them."""
    one = generation_s(evaluating(run_config, AIME))
    other = generation_s(evaluating(run_config, MATH))
    both = generation_s(evaluating(run_config, AIME, MATH))
    assert both == pytest.approx(one + other)
    assert other > 1.5 * one
    whole = {"name": "aime", "path": "/data/aime-2024.jsonl"}
    sliced = {"name": "aime", "path": f"/data/aime-2024.jsonl@[0:{EVAL_PROMPTS_PER_SET}]"}
    assert generation_s(evaluating(run_config, whole)) == pytest.approx(
        generation_s(evaluating(run_config, sliced))
    )
    fewer = {**AIME, "n_samples_per_prompt": 2}  # of the section's 16
    assert generation_s(evaluating(run_config, fewer, MATH)) - other < one / 4


def test_a_sets_prompts_are_counted_by_its_row_slice_or_assumed_and_said(
    run_config: MakeRun,
) -> None:
    """The plan reads no data file: a row slice that counts its rows by its bounds gives the
    count (at most), any other set is assumed at EVAL_PROMPTS_PER_SET, and layout=auto's note
    says which for each set, with its samples and lengths."""
    counts = {
        "a.jsonl@[10:60]": 50,
        "a.jsonl@[:500]": 500,
        "a.parquet@[-100:]": 100,
        "a.jsonl@[-50:-10]": 40,
        "a.jsonl@[100:]": None,
        "a.jsonl@[10:-5]": None,
        "a.jsonl@[:-5]": None,
        "a.jsonl": None,
    }
    assert {path: sliced_rows(path) for path in counts} == counts
    whole = {"name": "math500", "path": "/data/math-500.jsonl", "max_response_len": 4096}
    cfg = evaluating(run_config, AIME, whole)
    aime, math500 = eval_generations(cfg.recipe)
    assert (aime.prompts, aime.samples, aime.response_tokens) == (30, 480, 16384)
    assert (math500.prompts, math500.response_tokens) == (EVAL_PROMPTS_PER_SET, 4096)
    searched = cfg.model_copy(
        update={"layout": LayoutConfig.model_validate({"name": "auto", "search": True})}
    )
    [note] = [n for n in plan_config(searched)[1].notes if n.startswith("layout=auto in mode=eval")]
    assert "aime: 30 prompts (its row slice's, at most) x 16 samples" in note
    assert f"math500: {EVAL_PROMPTS_PER_SET} prompts (assumed: its file is not read" in note
    assert "responses up to 4096" in note and "rollout batch" not in note


def test_an_evaluations_plan_shows_its_sets_in_place_of_trainings_batch(
    run_config: MakeRun,
) -> None:
    """mode=eval runs no training rollout or optimizer step: its plan shows what each set
    generates (prompts and how they were counted, samples, token bounds), not training's
    batch arithmetic; a training plan shows the batch and no evaluation."""
    whole = {"name": "math500", "path": "/data/math-500.jsonl", "max_response_len": 4096}
    plan = build_plan(evaluating(run_config, AIME, whole))
    text = render_plan(plan)
    assert "Evaluation sets" in text and "Batch arithmetic" not in text
    rows = {w[0]: " ".join(w[1:]) for w in map(str.split, text.splitlines()) if w}
    assert rows["aime"] == "30 (its row slice's, at most) 16 480 unset (counted 0) 16,384"
    assert rows["math500"].startswith(f"{EVAL_PROMPTS_PER_SET} (assumed) 16 ")
    assert [g["prompts"] for g in plan.to_dict()["evaluation"]] == [30, EVAL_PROMPTS_PER_SET]
    training = build_plan(run_config("qwen3-4b", "h100x8"))
    assert "Batch arithmetic" in render_plan(training) and "evaluation" not in training.to_dict()


def test_the_clients_bound_on_requests_in_flight_slows_generation_as_it_shrinks(
    run_config: MakeRun,
) -> None:
    """The rollout client sends at most recipe.rollout.max_concurrency samples at once over
    all the engines (a group sent whole holding a slot per sample, or all of them): below the
    rollout's samples, each halving of the bound makes generation slower, in training and in
    an evaluation alike; at or above them, it is what the engines alone allow."""
    cfg = run_config("qwen3-4b", "h100x8")
    assert build_plan(cfg).batch.samples_per_rollout == 256
    unbound = generation_s(cfg)
    capped = [
        generation_s(run_config("qwen3-4b", "h100x8", recipe__rollout__max_concurrency=cap))
        for cap in (4096, 256, 128, 64, 16)
    ]
    assert capped[:2] == [pytest.approx(unbound)] * 2
    assert unbound < capped[2] < capped[3] < capped[4]
    tiny = run_config("qwen3-4b", "h100x8", recipe__rollout__max_concurrency=4)
    group = run_config("qwen3-4b", "h100x8", recipe__rollout__max_concurrency=8)
    assert generation_s(tiny) == pytest.approx(generation_s(group))  # a group of 8 goes whole
    sets = [evaluating(run_config, AIME, recipe__rollout__max_concurrency=cap) for cap in (480, 64)]
    assert generation_s(sets[0]) == pytest.approx(generation_s(evaluating(run_config, AIME)))
    assert generation_s(sets[1]) > 1.2 * generation_s(sets[0])


def test_an_evaluations_runtime_says_what_an_evaluation_does(run_config: MakeRun) -> None:
    """mode=eval's runtime section speaks of the evaluation: each set's own samples per
    prompt in a request, the weights sent once (by the train ranks) or not at all, a SIGTERM
    that stops it with nothing to save; none of training's loop, weight interval, buffer or
    save on SIGTERM. A training plan keeps them."""
    fewer = {**MATH, "n_samples_per_prompt": 4}

    def runtime(cfg: RunConfig) -> str:
        text = render_plan(build_plan(cfg))
        start = text.index("Runtime")
        return text[start : text.index("\n\n", start)]

    served = runtime(evaluating(run_config, AIME, fewer, recipe__rollout__n_samples_per_prompt=3))
    assert "aime 16, math500 4" in served and "3 samples" not in served
    assert "none sent: the engines load model.hf_checkpoint's" in served
    assert "train ranks meet" not in served
    assert "nothing is saved" in served
    rows = ("  loop ", "engines every", "staleness", "buffered", "release memory", "save every")
    for training_row in rows:
        assert training_row not in served, training_row
    loaded = runtime(evaluating(run_config, AIME, model__load="/other"))
    assert "once, before the evaluation: the train ranks load them" in loaded
    assert "train ranks meet through" in loaded
    training = runtime(run_config("qwen3-4b", "h100x8"))
    assert "one per group (its 8 samples together)" in training
    assert "weights to the engines every" in training and "save every finished rollout" in training
