"""The four seed runs plan exactly as the seeds give them, and match their golden plans.

Regenerate the golden files after an intended change to the planner:

    RLPOST_UPDATE_GOLDEN=1 .venv/bin/pytest tests/config/test_seed_plans.py

then review `git diff tests/config/golden/`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from rlpost.plan import Plan, build_plan, render_plan
from rlpost.schema import RunConfig

GOLDEN_DIR = Path(__file__).parent / "golden"
UPDATE = os.environ.get("RLPOST_UPDATE_GOLDEN") == "1"

SEEDS = {
    "glm4-9b_h100x8": ("glm4-9b", "h100x8"),
    "qwen3-4b_h100x8": ("qwen3-4b", "h100x8"),
    "glm4.5-355b-a32b_h100x64": ("glm4.5-355b-a32b", "h100x64"),
    "glm4.7-flash_h100x8": ("glm4.7-flash", "h100x8"),
}


SeedPlan = Callable[[str], Plan]


@pytest.fixture
def seed_plan(compose_run: Callable[..., RunConfig]) -> SeedPlan:
    """`seed_plan("qwen3-4b_h100x8") -> Plan` for the seed's model and hardware."""

    def plan_seed(seed: str) -> Plan:
        model, hardware = SEEDS[seed]
        return build_plan(compose_run(f"model={model}", "recipe=grpo_dapo", f"hardware={hardware}"))

    return plan_seed


@pytest.mark.parametrize("seed", sorted(SEEDS))
def test_plan_matches_golden(seed: str, seed_plan: SeedPlan) -> None:
    actual = json.loads(render_plan(seed_plan(seed), "json"))
    path = GOLDEN_DIR / f"{seed}.json"
    if UPDATE:
        path.write_text(json.dumps(actual, indent=2) + "\n")
    assert path.exists(), f"no golden plan {path}; run with RLPOST_UPDATE_GOLDEN=1"
    expected = flatten(json.loads(path.read_text()))
    got = flatten(actual)
    changed = {
        k: (expected.get(k), got.get(k))
        for k in expected.keys() | got.keys()
        if expected.get(k) != got.get(k)
    }
    assert not changed, "golden -> now:\n" + "\n".join(
        f"  {k}: {old!r} -> {new!r}" for k, (old, new) in sorted(changed.items())
    )


def flatten(value: object, prefix: str = "") -> dict[str, object]:
    """{'a': {'b': [1]}} -> {'a.b.0': 1}, so a mismatch names its key."""
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = ((str(i), v) for i, v in enumerate(value))
    else:
        return {prefix: value}
    flat: dict[str, object] = {}
    for key, item in items:
        flat.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def summary(plan: Plan) -> dict[str, object]:
    p, par = plan.placement, plan.parallel
    return {
        "colocate": p.colocate,
        "train_gpus": p.train_gpus,
        "rollout_gpus": p.rollout_gpus,
        "tp": par.tp,
        "sp": par.sequence_parallel,
        "pp": par.pp,
        "cp": par.cp,
        "ep": par.ep,
        "etp": par.etp,
        "dp": par.dp,
        "engines": (p.num_engines, p.gpus_per_engine),
        "max_tokens_per_gpu": plan.batch.max_tokens_per_gpu,
    }


# The table of seed runs in slime-facts (placement, parallelism, engines, tokens per GPU).
EXPECTED = {
    "glm4-9b_h100x8": dict(
        colocate=False,
        train_gpus=4,
        rollout_gpus=4,
        tp=2,
        sp=True,
        pp=1,
        cp=2,
        ep=1,
        etp=1,
        dp=1,
        engines=(2, 2),
        max_tokens_per_gpu=4608,
    ),
    "qwen3-4b_h100x8": dict(
        colocate=True,
        train_gpus=8,
        rollout_gpus=8,
        tp=2,
        sp=True,
        pp=1,
        cp=1,
        ep=1,
        etp=1,
        dp=4,
        engines=(4, 2),
        max_tokens_per_gpu=9216,
    ),
    "glm4.5-355b-a32b_h100x64": dict(
        colocate=True,
        train_gpus=64,
        rollout_gpus=64,
        tp=8,
        sp=True,
        pp=4,
        cp=2,
        ep=16,
        etp=1,
        dp=1,
        engines=(2, 32),
        max_tokens_per_gpu=16384,
    ),
    "glm4.7-flash_h100x8": dict(
        colocate=True,
        train_gpus=8,
        rollout_gpus=8,
        tp=1,
        sp=False,
        pp=1,
        cp=1,
        ep=8,
        etp=1,
        dp=8,
        engines=(1, 8),
        max_tokens_per_gpu=8192,
    ),
}


@pytest.mark.parametrize("seed", sorted(SEEDS))
def test_seed_matches_the_slime_facts_table(seed: str, seed_plan: SeedPlan) -> None:
    assert summary(seed_plan(seed)) == EXPECTED[seed]


def test_seed_engine_options(seed_plan: SeedPlan) -> None:
    qwen = seed_plan("qwen3-4b_h100x8").engine
    assert qwen.mem_fraction_static == 0.7
    glm45 = seed_plan("glm4.5-355b-a32b_h100x64").engine
    assert (glm45.dp_size, glm45.attention_tp, glm45.mem_fraction_static) == (4, 8, 0.7)
    flash = seed_plan("glm4.7-flash_h100x8").engine
    assert (flash.dp_size, flash.attention_tp) == (8, 1)


def test_seed_optimizer_placement(seed_plan: SeedPlan) -> None:
    for seed in ("glm4-9b_h100x8", "qwen3-4b_h100x8"):
        assert seed_plan(seed).memory.train.host_optimizer_gib == 0  # Adam on the GPU
    for seed in ("glm4.5-355b-a32b_h100x64", "glm4.7-flash_h100x8"):
        memory = seed_plan(seed).memory
        assert memory.train.optimizer_gib == 0 and memory.train.host_optimizer_gib > 0


@pytest.mark.parametrize("seed", sorted(SEEDS))
def test_seed_runs_fit(seed: str, seed_plan: SeedPlan) -> None:
    plan = seed_plan(seed)
    assert plan.memory.fits, render_plan(plan)
    assert plan.batch.steps_per_rollout == 1  # 32 prompts x 8 samples = one global batch


def test_seed_engines_sit_after_train_ranks_when_decoupled(seed_plan: SeedPlan) -> None:
    plan = seed_plan("glm4-9b_h100x8")
    train_gpus = {(s.node, s.gpu) for s in plan.placement.train_slots}
    engine_gpus = [(s.node, s.gpu) for e in plan.placement.engines for s in e.slots]
    assert train_gpus == {(0, g) for g in range(4)}
    assert engine_gpus == [(0, 4), (0, 5), (0, 6), (0, 7)]


def test_two_node_flash_alternative_splits_47_layers_unevenly(
    compose_run: Callable[..., RunConfig],
) -> None:
    # GLM-4.7-Flash seed, multi-node: TP4 PP2 CP2 EP8 on 2 x 8, no CPU Adam
    run = compose_run("model=glm4.7-flash", "recipe=grpo_dapo", "hardware=h100x16")
    plan = build_plan(run)
    par = plan.parallel
    assert (par.tp, par.pp, par.cp, par.ep, par.dp) == (4, 2, 2, 8, 1)
    assert plan.pipeline_stages == (24, 23)
    assert plan.memory.train.optimizer_gib > 0 and plan.memory.train.host_optimizer_gib == 0


SHIPPED_LAYOUTS = sorted(
    p.stem for p in (Path(__file__).parents[2] / "conf" / "layout").glob("*.yaml")
)


@pytest.mark.parametrize("layout", [name for name in SHIPPED_LAYOUTS if name != "auto"])
def test_no_shipped_layout_leaves_gpus_idle(
    layout: str, compose_run: Callable[..., RunConfig]
) -> None:
    """Each shipped layout, on the model and hardware its name gives, places a train rank or
    an engine on every GPU (the plan notes GPUs it leaves idle)."""
    model, hardware = layout.removesuffix("_async").split("_")
    recipe = "grpo_dapo_async" if layout.endswith("_async") else "grpo_dapo"
    if hardware == "cpu":
        recipe = "grpo_tiny_math"
    groups = (f"model={model}", f"recipe={recipe}", f"hardware={hardware}", f"layout={layout}")
    plan = build_plan(compose_run(*groups))
    assert plan.layout == layout
    assert not [note for note in plan.notes if "sit idle" in note], plan.notes
