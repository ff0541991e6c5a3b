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


def test_an_evaluations_runtime_leaves_out_the_training_loop(run_config: MakeRun) -> None:
    """mode=eval runs no training loop and saves nothing: its Runtime table has no loop,
    buffer or staleness rows, a SIGTERM that stops, requests at the sets' own samples per
    prompt, and, with no train rank, no weight sync; training's table keeps them all."""
    from rlpost.plan.render import render_runtime

    def rows(plan: Any) -> dict[str, str]:
        lines = render_runtime(plan).splitlines()[3:]
        return {line[2:38].strip(): line[38:].strip() for line in lines}

    training = rows(build_plan(run_config("qwen3-4b", "h100x8")))
    assert "save every finished rollout" in training["on SIGTERM (exit status 143)"]
    assert "groups buffered ahead of the trainer" in training
    served = build_plan(evaluating(run_config, AIME))
    shown = render_runtime(served)
    for row in ("loop ", "groups buffered", "staleness", "release memory", "train ranks meet"):
        assert f"  {row}" not in shown
    assert "on SIGTERM (exit status 143)  stop (an evaluation saves nothing)" in shown
    assert "weight sync                   none (the engines load model.hf_checkpoint" in shown
    assert "8 samples" not in shown and "its set's samples per prompt together" in shown
    sent = render_runtime(build_plan(evaluating(run_config, AIME, model__load="/ckpt/s")))
    assert "train ranks meet through" in sent and "  loop " not in sent
