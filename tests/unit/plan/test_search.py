"""layout=auto: the search finds what fits, rates the seeds' own layouts beside its choice, and
the chosen layout is what the run plans (and trains) with."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from rlpost.errors import UserError
from rlpost.plan import plan_config, render_plan
from rlpost.plan.candidates import candidate_key
from rlpost.plan.choice import choose_layout
from rlpost.plan.engine_fit import fit_engines
from rlpost.plan.layout import ParallelLayout
from rlpost.plan.remedies import profile_gpus, train_gpu_counts
from rlpost.plan.search import search_layout
from rlpost.plan.search_space import gpu_splits
from rlpost.plan.split_options import Searcher
from rlpost.schema import RunConfig
from rlpost.schema.layout import LayoutConfig

SEEDS = {
    "glm4-9b_h100x8": ("glm4-9b", "h100x8"),
    "qwen3-4b_h100x8": ("qwen3-4b", "h100x8"),
    "glm4.5-355b-a32b_h100x64": ("glm4.5-355b-a32b", "h100x64"),
    "glm4.7-flash_h100x8": ("glm4.7-flash", "h100x8"),
}


MakeRun = Callable[..., RunConfig]


def searching(cfg: RunConfig, **layout: object) -> RunConfig:
    """The same run with its layout left to the search (fields in `layout` fixed)."""
    return cfg.model_copy(
        update={"layout": LayoutConfig.model_validate({"name": "auto", "search": True, **layout})}
    )


@pytest.mark.parametrize("seed", sorted(SEEDS))
def test_the_seeds_layout_is_a_candidate_and_the_choice_rates_at_least_as_well(
    seed: str, run_config: MakeRun
) -> None:
    model, hardware = SEEDS[seed]
    shipped = run_config(model, hardware)  # the seed's layout, and its recipe settings
    search = search_layout(searching(shipped), reference=(seed, shipped))
    ref, chosen = search.reference, search.chosen
    assert chosen is not None and ref is not None and ref.step_s is not None
    assert ref.rank is not None, f"{seed}: {ref.description} is not among the feasible layouts"
    assert chosen.step_s <= ref.step_s + 0.01
    assert search.feasible >= ref.rank >= 1
    if ref.rank > 1:  # where they differ, the output says by how much and where
        assert ref.reason.startswith("the choice is ") and " less" in ref.reason
    assert search.enumerated >= search.feasible > 0


def test_holding_the_seeds_recompute_and_sglang_options_the_search_picks_its_layout(
    run_config: MakeRun,
) -> None:
    """Where the search and glm4.7-flash's seed differ is recompute (the search drops it where
    its memory estimate allows) and the seed's engine caps (max_running_requests 64), not the
    grid: with both held, the seed's layout is the choice (README, "layout=auto")."""
    shipped = run_config("glm4.7-flash", "h100x8")
    held = searching(
        shipped,
        train={"recompute": shipped.layout.train.recompute.model_dump()},
        rollout={"sglang": shipped.layout.rollout.sglang},
    )
    search = search_layout(held, reference=("glm4.7-flash_h100x8", shipped))
    ref, chosen = search.reference, search.chosen
    assert ref is not None and chosen is not None and ref.step_s is not None
    assert ref.rank == 1 and ref.step_s == pytest.approx(chosen.step_s)


@pytest.mark.parametrize(
    ("model", "hardware"),
    [("qwen3-30b-a3b", "h100x16"), ("llama3.1-8b", "h200x1"), ("qwen3-8b", "h100x8")],
)
def test_pairs_without_a_shipped_layout_get_one_that_fits(
    model: str, hardware: str, run_config: MakeRun
) -> None:
    cfg = searching(run_config(model, hardware, layout=False))
    chosen_cfg, plan = plan_config(cfg)
    assert plan.memory.fits
    assert plan.search is not None and plan.search.chosen is not None
    par = plan.parallel
    assert (chosen_cfg.layout.train.tp, chosen_cfg.layout.train.pp) == (par.tp, par.pp)
    # the plan marks what the search filled in
    assert plan.is_derived("layout.train.tp") and plan.is_derived("recipe.optim.cpu_offload")
    # the runners-up are slower or tied, never faster
    steps = [c.step_s for c in plan.search.ranked]
    assert steps[0] == pytest.approx(min(steps), abs=0.01)


def test_fixed_fields_stay_fixed(run_config: MakeRun) -> None:
    cfg = searching(run_config("qwen3-8b", "h100x8", layout=False), train={"tp": 2, "pp": 1})
    chosen, plan = plan_config(cfg)
    assert (plan.parallel.tp, plan.parallel.pp) == (2, 1)
    assert not plan.is_derived("layout.train.tp")
    assert chosen.layout.search  # searching again finds the same layout
    again, _ = choose_layout(chosen)
    assert again.layout == chosen.layout


def test_async_loops_search_decoupled_splits_only(run_config: MakeRun) -> None:
    cfg = searching(run_config("qwen3-4b", "h100x8", "grpo_dapo_async", layout=False))
    _, plan = plan_config(cfg)
    assert not plan.placement.colocate
    assert plan.search is not None and plan.search.chosen is not None
    assert plan.search.chosen.cost.overlapped  # rollout overlaps training in the estimate
    refused = [r for r in plan.search.rejected if r.description.startswith("colocated")]
    assert refused and "recipe.loop.mode" in refused[0].reason


def test_nothing_fits_says_what_would(run_config: MakeRun) -> None:
    cfg = searching(run_config("glm4.5-355b-a32b", "h100x8", layout=False))
    with pytest.raises(UserError) as caught:
        plan_config(cfg)
    text = caught.value.issues[0].fix
    assert "use a hardware profile with 32 GPUs of 79.6 GiB (4 node(s) of 8)" in text


def test_splits_follow_the_layout(run_config: MakeRun) -> None:
    base = run_config("qwen3-4b", "h100x16", layout=False)
    splits = gpu_splits(searching(base))
    assert splits[0].colocate and splits[0].train_gpus == 16
    # several nodes: decoupled splits are whole nodes
    assert [(s.train_gpus, s.rollout_gpus) for s in splits[1:]] == [(8, 8)]
    assert all(not s.colocate for s in gpu_splits(searching(base, colocate=False)))


def test_the_plan_shows_the_search_in_both_formats(run_config: MakeRun) -> None:
    _, plan = plan_config(searching(run_config("qwen3-8b", "h100x8", layout=False)))
    text = render_plan(plan, "table")
    assert text.startswith("Layout search (layout=auto): ")
    assert "chosen: colocated on 8" in text and "runners-up" in text
    data = json.loads(render_plan(plan, "json"))
    search = data["search"]
    assert search["chosen"]["overrides"]["layout.train.tp"] == plan.parallel.tp
    assert search["feasible"] > len(search["runners_up"]) > 0
    assert search["chosen"]["step_s"] <= min(r["step_s"] for r in search["runners_up"]) + 0.01


def test_candidate_keys_tell_layouts_apart(run_config: MakeRun) -> None:
    _, plan = plan_config(searching(run_config("qwen3-8b", "h100x8", layout=False)))
    assert plan.search is not None
    keys = {c.key for c in plan.search.ranked}
    assert len(keys) == len(plan.search.ranked)
    chosen = plan.search.chosen
    assert chosen is not None
    assert chosen.key == candidate_key(
        chosen.sizes, plan.parallel, plan.memory.host.optimizer_gib > 0, chosen.engine
    )


def test_the_launcher_plans_and_runs_the_chosen_layout() -> None:
    """`launch.py layout=auto`: the config the run gets is the chosen one (the CPU default's
    search picks its shipped layout: two train ranks, two engines of one slot)."""
    import subprocess
    import sys
    from pathlib import Path

    from rlpost.cli.planning import plan_run
    from rlpost.config.loader import compose_run_config

    cfg, sources = compose_run_config(["layout=auto"])
    run, plan = plan_run(cfg, sources)
    assert run.layout.search and run.layout.train.num_gpus == plan.placement.train_gpus == 2
    assert (run.layout.train.tp, run.layout.rollout.gpus_per_engine) == (1, 1)
    assert plan.search is not None and plan.search.reference is not None
    assert plan.search.reference.reason == "the search chose this layout"
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, str(root / "launch.py"), "layout=auto", "mode=plan", "plan.format=json"],
        capture_output=True,
        text=True,
        cwd=root,
    )
    assert done.returncode == 0, done.stderr
    assert '"search": {' in done.stdout


def test_cpu_adam_chosen_by_the_search_is_the_seeds_and_exports_to_slime(
    run_config: MakeRun,
) -> None:
    """The seeds' CPU Adam is three flags; Megatron-LM refuses --optimizer-cpu-offload alone."""
    from rlpost.plan.search_space import with_adam
    from rlpost.plan.slime_args import check_exportable

    gpu_adam = with_adam(run_config("glm4.7-flash", "h100x8"), False)
    assert not gpu_adam.recipe.optim.precision_aware_optimizer
    cpu_adam = with_adam(gpu_adam, True).recipe.optim
    assert (cpu_adam.cpu_offload, cpu_adam.precision_aware_optimizer) == (True, True)
    check_exportable(with_adam(gpu_adam, True))


def test_an_evaluation_searches_by_its_own_work(run_config: MakeRun) -> None:
    """layout=auto in mode=eval ranks by generation and the one weight push, with the train
    side held to the weights it sends: qwen3-8b's training fits one H100 only with Adam on
    the host, its evaluation of a checkpoint needs no Adam at all; no candidate counts
    training time, and every GPU serves the engines (a decoupled split would take one from
    them for nothing)."""
    from rlpost.plan import plan_config
    from rlpost.plan.plan import eval_search_note

    fraction = {"rollout": {"sglang": {"mem_fraction_static": 0.6}}}
    training = search_layout(searching(run_config("qwen3-8b", "h100x1"), **fraction)).chosen
    assert training is not None and training.train.cpu_offload
    evaluation = run_config("qwen3-8b", "h100x1", mode="eval", model__load="/ckpt/step100")
    search = search_layout(searching(evaluation, **fraction))
    assert search.chosen is not None and not search.chosen.train.cpu_offload
    assert search.chosen.train.memory.optimizer_gib == 0
    assert all(c.cost.train.total_s == 0 and c.cost.offload_s == 0 for c in search.ranked)
    assert all(c.cost.sync_s > 0 for c in search.ranked)
    _, plan = plan_config(searching(evaluation, **fraction))
    assert eval_search_note(evaluation) in plan.notes and plan.memory.train.optimizer_gib == 0
    shown = render_plan(plan)  # the whole evaluation is what is timed, not a rollout
    assert " s per evaluation predicted (generation " in shown and "s per rollout pre" not in shown
    assert "offload" not in shown.split("Placement")[0]
    eight = run_config("qwen3-4b", "h100x8", mode="eval", model__load="/ckpt/step100")
    chosen = search_layout(searching(eight)).chosen
    assert chosen is not None and chosen.sizes.colocate
    assert chosen.engine.gpus_per_engine * chosen.engine.num_engines == 8
    shipped = run_config("qwen3-4b", "h100x8", mode="eval")
    served = search_layout(searching(shipped), reference=("qwen3-4b_h100x8", shipped))
    assert served.ranked and all(c.cost.sync_s == 0 for c in served.ranked)
    # the shipped layout is rated as the candidates are: no offload around a rollout it never
    # runs (it cost the colocated layout 0.72 s it does not pay, and a worse rank)
    assert served.reference is not None
    reason = served.reference.reason
    assert "generation" in reason and "offload" not in reason and "rollout" not in reason


def test_an_evaluation_that_fits_nowhere_is_told_what_it_holds(run_config: MakeRun) -> None:
    """mode=eval trains nothing: where nothing fits, the suggestions name what it holds (the
    weights its train ranks send, the engines), never training's memory (gradients, Adam,
    recipe.train.max_tokens_per_gpu); the same run in training is told training's."""
    training = ("gradients", "optimizer", "Adam", "max_tokens_per_gpu", "training layout")
    sends = run_config("glm4.5-355b-a32b", "h100x8", mode="eval", model__load="/ckpt/step100")
    [weights] = search_layout(searching(sends)).suggestions
    assert weights.startswith("the train ranks that load the evaluated weights and send them")
    assert "(model.hf_checkpoint, without model.load or run.resume)" in weights
    served = run_config("glm4.5-355b-a32b", "h100x8", mode="eval")
    [engines] = search_layout(searching(served)).suggestions
    assert engines.startswith("no engine holds one sample")
    assert not [word for word in training if word in weights + engines]
    told = " ".join(search_layout(searching(run_config("glm4.5-355b-a32b", "h100x8"))).suggestions)
    assert "megatron-core's estimate fits training on 32 GPUs" in told


@pytest.mark.parametrize(
    ("model", "hardware", "settings", "gpus", "nodes"),
    [
        ("qwen3-30b-a3b", "h100x8", {"hardware__gpu_memory_gib": 20}, 16, 2),
        ("qwen3-30b-a3b", "h100x1", {}, 4, 4),
        ("glm4-9b", "h100x1", {}, 2, 2),  # its GPU holds it; the host does not
        ("qwen3-8b", "h100x8", {"hardware__gpu_memory_gib": 8}, 24, 3),  # TP8 PP3: 36 layers
        # 24 GPUs train it, but no engine fits beside training: one of 8 on a node of its own
        ("qwen3-30b-a3b", "h100x8", {"hardware__gpu_memory_gib": 16}, 32, 4),
    ],
    ids=["gpu-memory", "experts", "host-memory", "three-nodes", "engines-apart"],
)
def test_where_nothing_fits_the_gpus_it_names_are_where_the_search_finds_a_layout(
    run_config: MakeRun,
    model: str,
    hardware: str,
    settings: dict[str, object],
    gpus: int,
    nodes: int,
) -> None:
    """The GPUs named where no layout fits are the fewest whole nodes of the profile on which
    a split of the model fits megatron-core's estimate and the host's memory per node: the
    search finds a layout on a profile of that many nodes, and none on one node fewer (not
    the count of GPUs that would hold the weights, gradients and optimizer state if nothing
    else took memory; nor the next doubling: three nodes of 8 where they do). A layout its
    GPUs hold but its host does not is told so, without a shorter max_tokens_per_gpu, which
    frees no host memory. The engines count: where none fits beside training, the named
    profile holds the training GPUs and whole nodes for the engines."""
    told = " ".join(search_layout(searching(run_config(model, hardware, **settings))).suggestions)
    assert f"use a hardware profile with {gpus} GPUs of " in told, told
    if gpus == 32 and model == "qwen3-30b-a3b":  # engines of 16 beside it on 32, or 8 apart
        assert "engines of 16 beside it" in told or "the engines on 8 of their own" in told
    assert f" GiB ({nodes} node(s) of " in told
    assert "megatron-core's estimate fits training on" in told
    larger = run_config(model, hardware, hardware__num_nodes=nodes, **settings)
    assert search_layout(searching(larger)).chosen is not None
    fewer = run_config(model, hardware, hardware__num_nodes=nodes - 1, **settings)
    assert search_layout(searching(fewer)).chosen is None
    if model == "glm4-9b":
        assert "of host memory per node (has 128)" in told and "usable" not in told
        assert "max_tokens_per_gpu" not in told


def test_where_the_search_finds_a_layout_on_fewer_nodes_than_the_remedy_the_report_names_them(
    run_config: MakeRun,
) -> None:
    """The remedy's grid (even pipeline stages, one etp, the largest ep) needs 4 nodes of 8
    GPUs of 16 GiB for the 30B MoE with the default recipe; layout=auto's own search finds a
    layout on 3 and none on 2. The report names the 3, with the layout the search chooses
    there, not the grid's 4."""
    settings: dict[str, object] = {"hardware__gpu_memory_gib": 16}
    cfg = run_config("qwen3-30b-a3b", "h100x8", "grpo_tiny_math", **settings)
    told = " ".join(search_layout(searching(cfg)).suggestions)
    three = run_config(
        "qwen3-30b-a3b", "h100x8", "grpo_tiny_math", hardware__num_nodes=3, **settings
    )
    chosen = search_layout(searching(three)).chosen
    assert chosen is not None
    assert (
        f"layout=auto finds a layout on 24 GPUs of 16 GiB ({chosen.describe()}): "
        "use a hardware profile with 24 GPUs of 16 GiB (3 node(s) of 8)"
    ) in told, told
    assert "megatron-core's estimate fits training on" not in told
    two = run_config("qwen3-30b-a3b", "h100x8", "grpo_tiny_math", hardware__num_nodes=2, **settings)
    assert search_layout(searching(two)).chosen is None


def test_on_cpu_hardware_the_layouts_say_adam_runs_on_the_device_slots(
    run_config: MakeRun,
) -> None:
    """On hardware kind cpu a rank's device is a device slot: no candidate, rejected layout or
    the shipped one is labelled GPU Adam; on a GPU profile the label stays."""
    shipped = run_config("qwen3-tiny", "cpu", "grpo_tiny_math")
    search = search_layout(searching(shipped), reference=("qwen3-tiny_cpu", shipped))
    assert search.chosen is not None and search.reference is not None
    described = [c.describe() for c in search.ranked] + [search.reference.description]
    described += [r.description for r in search.rejected]
    assert all("Adam on the device slots" in text for text in described[: len(search.ranked)])
    assert not [text for text in described if "GPU" in text]
    gpu = search_layout(searching(run_config("qwen3-4b", "h100x8")))
    assert gpu.chosen is not None and "GPU Adam" in gpu.chosen.describe()


def test_on_cpu_hardware_what_would_fit_counts_device_slots(run_config: MakeRun) -> None:
    """Nothing fits a CPU profile's device slots: the suggestions count device slots, not
    GPUs."""
    tight = run_config("qwen3-tiny", "cpu", "grpo_tiny_math", hardware__gpu_memory_gib=0.001)
    search = search_layout(searching(tight))
    assert search.chosen is None and search.suggestions
    told = " ".join(search.suggestions)
    assert "per device slot" in told and "device slots of 0.001 GiB" in told
    assert "GPU" not in told, told


def test_an_evaluation_that_starts_no_train_rank_searches_its_engines_alone(
    run_config: MakeRun,
) -> None:
    """mode=eval of model.hf_checkpoint starts no train rank: layouts that differ only in
    training's choices (the grid, recompute, where Adam runs) are one candidate, so the search
    enumerates each split's engines once (15 for qwen3-4b on h100x8, where it counted 1,312),
    and its table shows what the evaluation reads, each engine's memory, and no train side;
    one that sends other weights keeps the grid that sends them (neither recompute, CP nor
    Adam), and training is searched as before (the seed goldens)."""
    shipped = run_config("qwen3-4b", "h100x8", mode="eval")
    search = search_layout(searching(shipped), reference=("qwen3-4b_h100x8", shipped))
    assert search.enumerated == search.feasible == 15
    keys = [c.key for c in search.ranked]
    assert len(set(keys)) == len(keys)
    described = [c.describe() for c in search.ranked]
    assert described[0] == "colocated on 8; 1 engine(s) of 8"
    assert not [d for d in described if "TP" in d or "Adam" in d or "recompute" in d]
    assert search.reference is not None and search.reference.rank == 4
    assert search.reference.description == "colocated on 8; 4 engine(s) of 2"
    _, plan = plan_config(searching(shipped))
    shown = render_plan(plan).split("\n\n")[0].splitlines()
    assert shown[2].endswith("(generation 2237.04, weight sync 0.00); engine 78.6 GiB per GPU")
    assert shown[4] == "  rank  s/evaluation  engine GiB  layout"

    sends = run_config("qwen3-4b", "h100x8", mode="eval", model__load="/ckpt/step100")
    sent = search_layout(searching(sends))
    assert sent.chosen is not None and sent.chosen.describe().count(";") == 2
    sent_described = [c.describe() for c in sent.ranked]
    assert not [d for d in sent_described if "CP" in d or "Adam" in d or "recompute" in d]
    shown = render_plan(plan_config(searching(sends))[1]).splitlines()
    assert shown[4] == "  rank  s/evaluation  train GiB  layout"

    training = search_layout(searching(run_config("qwen3-4b", "h100x8")))
    assert training.enumerated == 1282 and "recompute" in training.ranked[0].describe()


def test_where_training_fits_but_no_engine_does_the_report_says_so(run_config: MakeRun) -> None:
    """On three nodes of 16 GiB GPUs a colocated split trains qwen3-30b-a3b, but no engine
    fits beside it: the report says that (not a training layout's memory, nor a shorter
    max_tokens_per_gpu), and names four nodes: training on 24 GPUs and an engine of 8."""
    cfg = run_config("qwen3-30b-a3b", "h100x8", hardware__gpu_memory_gib=16, hardware__num_nodes=3)
    search = search_layout(searching(cfg))
    assert search.chosen is None
    told = " ".join(search.suggestions)
    assert told.startswith("training fits colocated on 24 ("), told
    assert "but no engine fits beside it" in told
    assert "the leanest training layout" not in told and "max_tokens_per_gpu" not in told
    assert "use a hardware profile with 32 GPUs of 16 GiB (4 node(s) of 8)" in told


def test_where_no_engine_fits_its_gpus_the_report_says_so_and_names_no_gpu_count(
    run_config: MakeRun,
) -> None:
    """qwen3-30b-a3b on 8 GiB GPUs: no engine holds its weights, CUDA context and one sample
    under SGLang's default mem_fraction_static at any size, beside training or apart, so more
    GPUs of 8 GiB are not named; the fraction that leaves SGLang its reserve is, with the
    engine it makes fit, and with it set the engines fit GPUs of their own."""
    cfg = run_config("qwen3-30b-a3b", "h100x8", hardware__gpu_memory_gib=8)
    told = " ".join(search_layout(searching(cfg)).suggestions)
    assert "no engine fits 8 GiB GPUs up to 1024 GPUs per engine" in told, told
    assert "needs 4.9 GiB per GPU of SGLang's static pool (3.6 of weights" in told
    assert "use GPUs with more memory" in told
    assert "hardware profile" not in told and "no engine holds one sample" not in told
    fix = "layout.rollout.sglang.mem_fraction_static=0.56 (engines of 32 on GPUs of their own"
    assert fix in told
    probe = ParallelLayout.single_process(dp=8)
    assert fit_engines(Searcher(searching(cfg)), False, probe).engine is None
    raised = searching(cfg, rollout={"sglang": {"mem_fraction_static": 0.56}})
    assert fit_engines(Searcher(raised), False, probe).gpus == 32


def test_train_counts_leave_the_engines_their_own_gpus(run_config: MakeRun) -> None:
    """A count within a node is tried only where the engines' own GPUs fit beside it; past
    a node, training takes whole nodes and the engines whole nodes of their own."""
    hardware = run_config("qwen3-4b", "h100x8").hardware
    assert train_gpu_counts(hardware, 1)[:4] == [2, 4, 8, 16]
    assert train_gpu_counts(hardware, 1, beside=4)[:3] == [2, 4, 8]
    assert train_gpu_counts(hardware, 1, beside=8)[:2] == [8, 16]
    assert profile_gpus(hardware, 4, beside=4) == 8
    assert profile_gpus(hardware, 24, beside=8) == 32
    assert profile_gpus(hardware, 24, beside=2) == 32
    assert profile_gpus(hardware, 16, beside=16) == 32
