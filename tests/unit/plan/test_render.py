"""Plan output: readable tables with derived values marked, and the JSON contract."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest

from rlpost.plan import build_plan, render_plan
from rlpost.plan.table import ranges, render_table
from rlpost.schema import RunConfig

Runs = Callable[..., RunConfig]

JSON_KEYS = {
    "placement": ["colocate", "train_gpus", "rollout_gpus", "gpus_per_engine", "num_engines"],
    "parallel": ["tp", "pp", "cp", "ep", "etp", "dp"],
    "batch": [
        "rollout_batch_size",
        "n_samples_per_prompt",
        "global_batch_size",
        "steps_per_rollout",
        "max_tokens_per_gpu",
    ],
    "memory": [
        "train_gib_per_gpu",
        "rollout_weights_gib_per_gpu",
        "kv_cache_tokens_per_engine",
        "gpu_gib",
        "fits",
    ],
}


def test_table_aligns_numbers_right() -> None:
    text = render_table(["name", "GiB"], [["weights", 1.5], ["total", 12.25]], "Memory")
    lines = text.splitlines()
    assert lines[0] == "Memory"
    assert lines[-1].endswith("12.25") and lines[-2].endswith(" 1.50")
    assert len({len(line) for line in lines[1:]}) <= 2


def test_ranges_collapse_runs() -> None:
    assert ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


def test_json_has_the_documented_keys(run_config: Runs) -> None:
    plan = build_plan(run_config("glm4-9b", "h100x8"))
    data = json.loads(render_plan(plan, "json"))
    for section, keys in JSON_KEYS.items():
        for key in keys:
            assert key in data[section], f"{section}.{key}"
    assert data["placement"]["colocate"] is False
    assert data["parallel"]["tp"] == 2 and data["batch"]["steps_per_rollout"] == 1
    assert isinstance(data["memory"]["fits"], bool)


def test_tables_cover_every_section_and_mark_derived(run_config: Runs) -> None:
    plan = build_plan(run_config("qwen3-4b", "h200x1"))
    text = render_plan(plan)
    for heading in (
        "Placement",
        "Parallel layout",
        "Engines",
        "Batch arithmetic",
        "Memory",
        "Verdict",
    ):
        assert heading in text
    tp_line = next(line for line in text.splitlines() if line.strip().startswith("TP (tensor)"))
    assert "1*" in tp_line
    assert "engine 0" in text and "KV cache" in text


def test_user_values_are_not_marked(run_config: Runs) -> None:
    text = render_plan(build_plan(run_config("qwen3-4b", "h100x8")))
    tp_line = next(line for line in text.splitlines() if line.strip().startswith("TP (tensor)"))
    assert "*" not in tp_line


def test_unknown_format_is_rejected(run_config: Runs) -> None:
    with pytest.raises(ValueError, match="unknown plan format"):
        render_plan(build_plan(run_config("qwen3-4b", "h100x8")), "yaml")


@pytest.mark.parametrize(
    ("overrides", "requests", "why"),
    [
        ({}, "group", ""),
        ({"run__deterministic": True}, "sample", "run.deterministic"),
        (
            {"recipe__rollout__generate_function": "rlpost.envs.calculator.generate"},
            "sample",
            "recipe.rollout.generate_function",
        ),
    ],
)
def test_the_plan_says_how_a_groups_samples_travel(
    run_config: Runs, overrides: dict[str, object], requests: str, why: str
) -> None:
    plan = build_plan(run_config("qwen3-4b", "h100x8", **overrides))
    assert plan.runtime.requests == requests
    assert why in plan.runtime.requests_why
    rendered = render_plan(plan)
    expected = "one per group (its 8 samples together)" if requests == "group" else why
    assert expected in rendered


@pytest.mark.parametrize(
    ("args", "overrides", "shared"),
    [
        (("qwen3-tiny", "cpu", "grpo_tiny_math"), {}, True),
        (
            ("qwen3-tiny", "cpu", "grpo_tiny_math"),
            {
                "recipe__rollout__n_samples_per_prompt": 1,
                "recipe__train__global_batch_size": 8,
                "recipe__algo__advantage_estimator": "reinforce_plus_plus",
            },
            False,
        ),
        (("qwen3-tiny", "cpu", "grpo_tiny_math"), {"trainer__backend": "megatron"}, False),
        (("qwen3-4b", "h100x8"), {}, False),  # megatron-core
    ],
)
def test_the_plan_decides_whether_a_groups_prompt_is_packed_once(
    run_config: Runs, args: tuple[str, ...], overrides: dict[str, object], shared: bool
) -> None:
    plan = build_plan(run_config(*args, **overrides))
    assert plan.work.share_prompts is shared
    expected = "packed once per micro-batch" if shared else "packed with each of its samples"
    assert expected in render_plan(plan)


def test_a_tiny_models_parameters_are_counted_in_millions(run_config: Runs) -> None:
    plan = build_plan(run_config("qwen3-tiny", "cpu", "grpo_tiny_math"))
    millions = plan.memory.params_total / 1e6
    assert 1 < millions < 1000
    assert f"GiB; {millions:.2f}M parameters, {millions:.2f}M active)" in render_plan(plan)
    large = render_plan(build_plan(run_config("qwen3-4b", "h100x8")))
    assert "B parameters" in large and "0.00B" not in large


def test_the_memory_prediction_says_it_leaves_out_the_overhead(run_config: Runs) -> None:
    plan = build_plan(run_config("qwen3-4b", "h100x8"))
    t = plan.memory.train
    assert t.overhead_gib > 0
    line = next(x for x in render_plan(plan).splitlines() if "perf/memory_vs_plan" in x)
    assert (
        f"{t.total_gib - t.overhead_gib:.2f} GiB per GPU (perf/memory_vs_plan): the memory "
        f"table's {t.total_gib:.2f} less its {t.overhead_gib:.2f} of CUDA context and workspaces"
    ) in line
    cpu = render_plan(build_plan(run_config("qwen3-tiny", "cpu", "grpo_tiny_math")))
    assert "(perf/memory_vs_plan)\n" in cpu  # no overhead on CPU: nothing to explain


def test_a_cap_below_the_longest_sample_says_such_a_sample_trains_alone(run_config: Runs) -> None:
    from rlpost.algo.packing import pack_micro_batches

    plan = build_plan(
        run_config("qwen3-tiny", "cpu", "grpo_tiny_math", recipe__train__max_tokens_per_gpu=1)
    )
    longest = plan.batch.longest_sample_tokens
    row = next(x for x in render_plan(plan).splitlines() if "tokens per micro-batch" in x)
    assert row.endswith(f" 1; a longer sample alone, up to {longest}")
    # what the trainers do with such a cap: every sample whole, one micro-batch each
    lengths = [longest, longest, 3]
    assert pack_micro_batches(lengths, dynamic=True, max_tokens=1, micro_batch_size=1) == [
        [0],
        [1],
        [2],
    ]
    roomy = render_plan(build_plan(run_config("qwen3-tiny", "cpu", "grpo_tiny_math")))
    assert "a longer sample alone" not in roomy


TINY = ("qwen3-tiny", "cpu", "grpo_tiny_math")
DECOUPLED = {
    "layout__colocate": False,
    "layout__train__num_gpus": 1,
    "layout__rollout__num_gpus": 1,
}
SEARCHED = {"layout": False, "layout__name": "auto", "layout__search": True}


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        DECOUPLED,
        {"mode": "eval"},
        {"mode": "eval", **DECOUPLED},
        {"mode": "eval", "model__load": "/ckpt/step100"},
        SEARCHED,
        {"mode": "eval", **SEARCHED},
    ],
    ids=[
        "colocated",
        "decoupled",
        "eval",
        "eval decoupled",
        "eval of weights",
        "auto",
        "auto eval",
    ],
)
def test_a_cpu_plan_names_its_devices_device_slots(
    run_config: Runs, overrides: dict[str, object]
) -> None:
    """On hardware kind cpu a rank's or an engine's device is a device slot (a bundle of CPU
    cores and a share of host memory), as rlpost validate says: the header, placement,
    layout, batch, memory and search sections and the notes call it so, not a GPU, through
    rlpost.schema.hardware.device_word; a GPU profile's plans are the seed goldens."""
    from rlpost.plan import plan_config

    _, plan = plan_config(run_config(*TINY, **overrides))
    shown = render_plan(plan)
    assert "GPU" not in shown, [line for line in shown.splitlines() if "GPU" in line]
    lines = shown.splitlines()
    [split] = [line for line in lines if line.startswith(("colocated", "decoupled"))]
    [placement] = [line for line in lines if line.startswith("  role ")]
    assert "device slot" in split and "device slots  ports" in placement
    assert re.search(r"^Memory \(device slot 8\.0 GiB", shown, re.M)
    assert ", per device slot" in shown or ", per engine device slot" in shown


def test_counts_of_one_read_in_the_singular(run_config: Runs) -> None:
    """A decoupled CPU plan has engines of one TP rank, one train rank and an unsharded
    optimizer: '1 TP rank', '(1 rank)', 'not sharded', never '1 TP ranks' or '/1 shards'."""
    shown = render_plan(build_plan(run_config(*TINY, **DECOUPLED)))
    assert re.search(r"^  engine 0  1 TP rank  ", shown, re.M), shown
    assert "optimizer (master + Adam, not sharded)" in shown
    assert "offloaded optimizer (1 rank)" in shown
    assert not re.search(r"\b1 (TP )?ranks\b|/1 shards", shown), shown
    two = render_plan(build_plan(run_config(*TINY)))
    assert "optimizer (master + Adam, /2 shards)" in two and "(2 ranks)" in two


def test_runners_up_the_cost_model_cannot_tell_from_the_choice_are_called_ties(
    run_config: Runs,
) -> None:
    """On the CPU default TP2 and CP2 predict the choice's (DP2) time to the millisecond:
    the cost model charges their collectives by bytes, which a tiny model hardly moves. The
    plan says they tie and that such a split would train with megatron-core, not that they
    rank second and third on merit; a GPU search whose runners-up are slower says nothing."""
    from rlpost.plan import plan_config

    _, plan = plan_config(run_config(*TINY, **SEARCHED))
    assert plan.search is not None and plan.search.chosen is not None
    assert plan.search.chosen.parallel.dp == 2
    shown = render_plan(plan)
    assert "ranks 2-3 tie with the choice to 10 ms" in shown, shown
    assert "trains with megatron-core over gloo (trainer.backend=auto)" in shown
    gpu = render_plan(plan_config(run_config("llama3.1-8b", "h200x1", "grpo_dapo", **SEARCHED))[1])
    assert "with the choice to 10 ms" not in gpu and "over gloo" not in gpu


@pytest.mark.parametrize(
    ("overrides", "row"),
    [
        ({}, "3600 s, then the run stops"),
        ({"recipe__rollout__episode_timeout_s": 90}, "90 s, then the run stops"),
        ({"recipe__rollout__episode_timeout_s": None}, "unlimited"),
    ],
    ids=["default", "set", "unlimited"],
)
def test_the_plan_says_how_long_a_generate_function_call_may_run(
    run_config: Runs, overrides: dict[str, object], row: str
) -> None:
    limit = "a generate function call's own time (engine requests aside)"
    plan = build_plan(run_config("qwen3-tiny", "cpu", "grpo_tiny_calculator", **overrides))
    shown = render_plan(plan)
    assert limit in shown and row in shown.split(limit)[1].splitlines()[0]
    assert limit not in render_plan(build_plan(run_config("qwen3-tiny", "cpu", "grpo_tiny_math")))


@pytest.mark.parametrize(
    ("overrides", "row"),
    [
        ({}, "32 (2048 prompts), then the run stops"),
        ({"recipe__rollout__max_draws_per_rollout": None}, "unlimited"),
    ],
    ids=["default", "unlimited"],
)
def test_the_plan_says_how_many_draws_a_filtered_rollout_may_take(
    run_config: Runs, overrides: dict[str, object], row: str
) -> None:
    plan = build_plan(run_config("qwen3-4b", "h100x8", "grpo_dapo_dynamic_sampling", **overrides))
    assert plan.runtime.loop.dynamic_sampling
    assert "a rollout's draws through the filter" in render_plan(plan)
    assert row in render_plan(plan)
    unfiltered = render_plan(build_plan(run_config("qwen3-4b", "h100x8")))
    assert "a rollout's draws through the filter" not in unfiltered
