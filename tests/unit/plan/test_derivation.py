"""Layouts the planner derives where no shipped layout specialises a model x hardware pair."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from rlpost.backends.fp8_format import Fp8Format
from rlpost.errors import UserError
from rlpost.plan import Plan, build_plan
from rlpost.plan.parallel import powers_of_two
from rlpost.plan.render import render_json, render_runtime
from rlpost.schema import RunConfig

Runs = Callable[..., RunConfig]


def test_qwen3_4b_on_one_h200_colocates_everything(run_config: Runs) -> None:
    plan = build_plan(run_config("qwen3-4b", "h200x1"))
    p, par = plan.placement, plan.parallel
    assert (p.colocate, p.train_gpus, p.rollout_gpus) == (True, 1, 1)
    assert (par.tp, par.pp, par.cp, par.ep, par.dp) == (1, 1, 1, 1, 1)
    assert not par.sequence_parallel
    assert (p.gpus_per_engine, p.num_engines) == (1, 1)
    assert plan.memory.fits
    for key in (
        "layout.colocate",
        "layout.train.tp",
        "layout.train.dp",
        "layout.rollout.gpus_per_engine",
        "layout.rollout.sglang.mem_fraction_static",
    ):
        assert plan.is_derived(key), key


def test_glm4_9b_on_two_nodes_gets_a_valid_grid(run_config: Runs) -> None:
    plan = build_plan(run_config("glm4-9b", "h100x16"))
    par, p = plan.parallel, plan.placement
    assert p.colocate and p.train_gpus == 16
    assert par.tp * par.pp * par.cp * par.dp == 16
    assert par.tp in powers_of_two(8) and 32 % par.tp == 0 and 2 % par.tp == 0
    assert par.sequence_parallel == (par.tp > 1)
    assert plan.memory.train_fits
    assert 16 % p.gpus_per_engine == 0 and p.gpus_per_engine <= 8


def test_smallest_fitting_tp_is_chosen(run_config: Runs) -> None:
    # 9.4B dense on one 80 GB GPU per rank does not fit with a long packed micro-batch at
    # tp=1 without sharding; the planner moves up until it does
    run = run_config("glm4-9b", "h100x8", layout=False, recipe__train__max_tokens_per_gpu=32768)
    plan = build_plan(run)
    assert plan.parallel.tp >= 2
    assert plan.memory.train_fits


def test_moe_ep_is_the_largest_expert_divisor_that_fits_the_grid(run_config: Runs) -> None:
    plan = build_plan(run_config("glm4.7-flash", "h100x8", layout=False))
    assert plan.parallel.ep == 8  # 64 experts over 8 GPUs
    assert plan.parallel.etp == 1
    assert plan.parallel.moe_token_dispatcher_type == "alltoall"


def test_async_loop_splits_gpus_by_node(run_config: Runs) -> None:
    plan = build_plan(run_config("glm4-9b", "h100x16", "grpo_dapo_async"))
    p = plan.placement
    assert not p.colocate
    assert (p.train_gpus, p.rollout_gpus) == (8, 8)
    assert {s.node for s in p.train_slots} == {0}
    assert {s.node for e in p.engines for s in e.slots} == {1}


def test_one_side_given_the_other_gets_the_rest(run_config: Runs) -> None:
    run = run_config(
        "qwen3-4b", "h100x8", layout=False, layout__colocate=False, layout__train__num_gpus=2
    )
    plan = build_plan(run)
    assert (plan.placement.train_gpus, plan.placement.rollout_gpus) == (2, 6)
    assert plan.is_derived("layout.rollout.num_gpus")


def test_cpu_hardware_uses_single_slots(run_config: Runs) -> None:
    plan = build_plan(run_config("qwen3-tiny", "cpu", "grpo_tiny_math", layout=False))
    par = plan.parallel
    assert (par.tp, par.pp, par.cp, par.ep, par.etp) == (1, 1, 1, 1, 1)
    assert par.dp == 2 and par.recompute == "none"
    assert (plan.placement.gpus_per_engine, plan.placement.num_engines) == (1, 2)


def test_model_too_large_names_what_to_set(run_config: Runs) -> None:
    with pytest.raises(UserError) as info:
        build_plan(run_config("glm4.5-355b-a32b", "h100x8"))
    keys = {issue.key for issue in info.value.issues}
    assert keys == {"layout.train.tp", "layout.rollout.gpus_per_engine"}
    tp_issue = next(i for i in info.value.issues if i.key == "layout.train.tp")
    assert "no tensor-parallel size fits" in tp_issue.message
    # no split of 8 GPUs fits even with the optimizer on the host: more GPUs, with it there
    assert "a hardware profile with 32 GPUs" in tp_issue.fix and "cpu_offload" in tp_issue.fix


def test_user_values_are_kept_and_not_marked_derived(run_config: Runs) -> None:
    plan = build_plan(run_config("qwen3-4b", "h100x8"))
    assert not plan.is_derived("layout.train.tp")
    assert plan.is_derived("layout.train.dp")
    assert plan.engine.mem_fraction_static == 0.7


REWARD_ACTOR = {
    "recipe__rollout__reward__type": "model",
    "recipe__rollout__reward__model": "my_rm.Model",
    "recipe__rollout__reward__model_placement": "actor",
}


def test_a_reward_model_actor_gets_a_slot_of_its_own(run_config: Runs) -> None:
    cfg = run_config(
        "qwen3-tiny", "cpu", "grpo_tiny_math", hardware__gpus_per_node=3, **REWARD_ACTOR
    )
    p = build_plan(cfg).placement
    assert (p.train_gpus, p.num_engines) == (2, 2)
    assert p.reward_slot is not None and (p.reward_slot.node, p.reward_slot.gpu) == (0, 2)
    assert p.reward_slot not in p.train_slots
    # in the driver, it takes none
    in_driver = {**REWARD_ACTOR, "recipe__rollout__reward__model_placement": "driver"}
    assert build_plan(run_config("qwen3-4b", "h100x8", **in_driver)).placement.reward_slot is None


def test_a_reward_model_actor_is_counted_in_the_gpu_budget(run_config: Runs) -> None:
    with pytest.raises(UserError) as info:
        build_plan(run_config("qwen3-4b", "h100x8", **REWARD_ACTOR))
    issue = info.value.issues[0]
    assert issue.key == "layout.train.num_gpus"
    assert "h100x8 has 7 GPUs (1 x 8, less 1 for the reward model)" in issue.message
    cfg = run_config("qwen3-4b", "h100x8", layout__train__num_gpus=4, **REWARD_ACTOR)
    p = build_plan(cfg).placement
    assert p.train_gpus == 4 and p.reward_slot is not None and p.reward_slot.gpu == 4


CPU_REFUSALS = {
    "reward model actor": ({"layout__train__num_gpus": 2, **REWARD_ACTOR}, "layout.train.num_gpus"),
    "colocated beyond the slots": ({"layout__train__num_gpus": 4}, "layout.train.num_gpus"),
    "decoupled without rollout": (
        {"layout__colocate": False, "layout__train__num_gpus": 2, "layout__rollout__num_gpus": 0},
        "layout.rollout.num_gpus",
    ),
    "decoupled beyond the slots": (
        {"layout__colocate": False, "layout__train__num_gpus": 2, "layout__rollout__num_gpus": 1},
        "layout.rollout.num_gpus",
    ),
    "offload decoupled": (
        {
            "layout__colocate": False,
            "layout__train__num_gpus": 1,
            "layout__rollout__num_gpus": 1,
            "engine__offload": True,
        },
        "engine.offload",
    ),
    "async colocated": (
        {"recipe__loop__mode": "async", "layout__colocate": True},
        "recipe.loop.mode",
    ),
    "replicas that do not divide": (
        {"layout__train__pp": 2, "layout__train__num_gpus": 1},
        "layout.train.num_gpus",
    ),
    "dp off the count": ({"layout__train__dp": 2, "layout__train__num_gpus": 1}, "layout.train.dp"),
    "engines that do not divide": (
        {
            "layout__colocate": False,
            "layout__train__num_gpus": 1,
            "layout__rollout__num_gpus": 1,
            "layout__rollout__gpus_per_engine": 2,
        },
        "layout.rollout.gpus_per_engine",
    ),
}


@pytest.mark.parametrize("overrides, key", CPU_REFUSALS.values(), ids=CPU_REFUSALS)
def test_a_cpu_profiles_refusals_name_device_slots_not_gpus(
    run_config: Runs, overrides: dict[str, object], key: str
) -> None:
    """hardware=cpu's devices are device slots (a bundle of CPU cores), so a refusal over how
    many there are counts device slots, as the plan does (rlpost.schema.hardware.device_word)."""
    with pytest.raises(UserError) as info:
        build_plan(run_config("qwen3-tiny", "cpu", "grpo_tiny_math", **overrides))
    issues = [i for i in info.value.issues if i.key == key]
    assert issues, info.value.render()
    shown = info.value.render()
    assert "device slot" in issues[0].message and "GPU" not in shown, shown


def test_a_cpu_profiles_memory_refusal_counts_per_device_slot(run_config: Runs) -> None:
    from rlpost.plan.fit import memory_issues

    cfg = run_config("qwen3-tiny", "cpu", "grpo_tiny_math", hardware__gpu_memory_gib=0.001)
    issues = memory_issues(cfg, build_plan(cfg))
    [train] = [i for i in issues if i.key == "layout.train"]
    assert "GiB per device slot and cpu has" in train.message
    assert not [i for i in issues if "GPU" in i.message + i.fix]


def test_a_cpu_profiles_colocated_layout_with_rollout_slots_is_refused_in_device_slots(
    run_config: Runs,
) -> None:
    overrides = {"layout__colocate": True, "layout__rollout__num_gpus": 1}
    with pytest.raises(ValidationError) as info:
        run_config("qwen3-tiny", "cpu", "grpo_tiny_math", **overrides)
    assert "colocate: true shares the train device slots" in str(info.value)
    assert "GPU" not in str(info.value)
    with pytest.raises(ValidationError) as info:
        run_config("qwen3-4b", "h100x8", **overrides)
    assert "colocate: true shares the train GPUs" in str(info.value)


def test_engines_serving_an_fp8_checkpoint_hold_a_byte_a_weight_plus_scales(
    run_config: Runs, tmp_path: Path
) -> None:
    """The plan reads the checkpoint's quantization_config: the engines' weights take one byte
    per parameter, a float32 scale per 128 x 128 block, and bf16 embeddings; the KV cache gets
    the rest; every weight update is quantised to the same blocks."""
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    }}))  # fmt: skip
    bf16 = build_plan(run_config("qwen3-4b", "h200x1"))
    fp8 = build_plan(run_config("qwen3-4b", "h200x1", model__hf_checkpoint=str(tmp_path)))
    assert bf16.runtime.fp8 is None and fp8.runtime.fp8 == Fp8Format((128, 128))
    model, params = fp8.memory.rollout, bf16.memory.rollout.params_per_gpu
    cfg = run_config("qwen3-4b", "h200x1").model
    embeddings = cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)
    expected = (params * (1 + 4 / 128**2) + embeddings) / 2**30
    assert model.weights_gib == pytest.approx(expected)
    assert 0.5 < model.weights_gib / bf16.memory.rollout.weights_gib < 0.6
    assert model.kv_cache_gib > bf16.memory.rollout.kv_cache_gib
    assert "FP8 e4m3 (blocks 128x128)" in render_runtime(fp8)
    assert json.loads(render_json(fp8))["runtime"]["fp8"] == {"block_size": [128, 128]}
    # the plan says what an FP8 rollout without the bf16 weights or a correction costs
    assert any("model.load is not set" in note for note in fp8.notes)
    assert any("off_policy_correction is none" in note for note in fp8.notes)
    assert not any("FP8" in note for note in bf16.notes)


def test_a_run_that_writes_no_policy_says_so(run_config: Runs) -> None:
    """Neither checkpoints nor HF exports: the trained policy ends with the run."""

    def says(**overrides: object) -> bool:
        plan = build_plan(run_config("qwen3-4b", "h200x1", **overrides))
        return any("writes no checkpoint and no HF export" in note for note in plan.notes)

    assert not says()  # grpo_dapo saves every 20 rollouts
    assert says(recipe__save__interval=None)
    assert not says(recipe__save__interval=None, recipe__save__save_hf_interval=50)


def test_the_plan_says_which_reward_scores(run_config: Runs) -> None:
    """grpo_dapo names reward type deepscaler; a custom function set on top of it scores."""

    def notes(**overrides: object) -> list[str]:
        plan = build_plan(run_config("qwen3-4b", "h200x1", **overrides))
        return [note for note in plan.notes if note.startswith("recipe.rollout.reward")]

    fn = "recipe__rollout__reward__custom_function"
    assert notes() == []
    (note,) = notes(**{fn: "my_pkg.rm.score"})
    assert note.startswith("recipe.rollout.reward.custom_function (my_pkg.rm.score) scores")
    assert "not recipe.rollout.reward.type=deepscaler" in note and "--rm-type" in note
    assert "scores every sample, before a prompt line's metadata rm_type" in note
    (grouped,) = notes(**{fn: "my_pkg.rm.rank", "recipe__rollout__reward__group": True})
    assert "called once per group" in grouped
    assert notes(**{fn: "my_pkg.rm.score", "recipe__rollout__reward__type": "math"}) == []


def test_the_plan_says_which_sets_the_evaluations_functions_score(run_config: Runs) -> None:
    """A set's own custom_reward_function, else recipe.eval's, scores it before anything
    training scores with; the plan names each set so scored and what names its function."""

    def notes(**overrides: object) -> list[str]:
        plan = build_plan(run_config("qwen3-4b", "h200x1", **overrides))
        return [note for note in plan.notes if "evaluation sets scored" in note]

    sets = [
        {"name": "aime", "path": "/d/aime.jsonl", "custom_reward_function": "my_pkg.rm.aime"},
        {"name": "gpqa", "path": "/d/gpqa.jsonl"},
        {"name": "math", "path": "/d/math.jsonl", "reward_type": "math"},
    ]
    assert notes() == []
    assert notes(recipe__eval__datasets=sets[1:]) == []
    wide = "my_pkg.rm.any"
    (note,) = notes(recipe__eval__datasets=sets[:2], recipe__eval__custom_reward_function=wide)
    assert note.endswith(
        "aime by my_pkg.rm.aime (recipe.eval.datasets.0.custom_reward_function); gpqa by "
        "my_pkg.rm.any (recipe.eval.custom_reward_function)"
    )


def test_the_plan_says_what_a_sigterm_does(run_config: Runs) -> None:
    saving = build_plan(run_config("qwen3-4b", "h200x1"))
    stopping = build_plan(run_config("qwen3-4b", "h200x1", run__on_sigterm="stop"))
    assert (saving.runtime.on_sigterm, stopping.runtime.on_sigterm) == ("save", "stop")
    assert "save every finished rollout, then stop" in render_runtime(saving)
    assert "stop at once, keeping the checkpoints saved so far" in render_runtime(stopping)
    assert json.loads(render_json(stopping))["runtime"]["on_sigterm"] == "stop"
    # a run without periodic saves is told that a SIGTERM still saves
    quiet = build_plan(run_config("qwen3-4b", "h200x1", recipe__save__interval=None))
    assert any("a SIGTERM still saves" in note for note in quiet.notes)


def test_stale_tokens_without_a_correction_are_noted(run_config: Runs) -> None:
    """Tokens trained by a later policy version than the one that sampled them (the async
    loops, or weights pushed every few rollouts) are trained as the policy's own unless the
    recipe corrects for them: the plan says so, with the bound."""

    def note(recipe: str = "grpo_dapo", **overrides: object) -> str | None:
        cfg = run_config("qwen3-4b", "h100x8", recipe, **overrides)
        plan = build_plan(cfg)
        return next((n for n in plan.notes if "policy version(s) after" in n), None)

    decoupled = {"layout__colocate": False, "layout__train__num_gpus": 4,
                 "layout__rollout__num_gpus": 4}  # fmt: skip
    assert note() is None  # sync, weights pushed every rollout: nothing is stale
    said = note(recipe__loop__mode="async", **decoupled)
    assert said is not None and "up to 1 policy version(s)" in said
    assert "recipe.loop.mode=async)" in said and "tis or decoupled_ppo" in said
    said = note(recipe__loop__update_weights_interval=3)
    assert said is not None and "up to 2 policy version(s)" in said
    assert "recipe.loop.mode=sync, update_weights_interval=3" in said
    assert note(recipe__loop__mode="async", recipe__algo__off_policy_correction="tis",
                **decoupled) is None  # fmt: skip
    assert note("grpo_dapo_fully_async", **decoupled) is None  # decoupled_ppo


def test_tokens_partial_rollouts_carry_over_are_noted_as_off_policy(run_config: Runs) -> None:
    """A partial rollout continues a cut group in a later rollout under newer weights: the
    tokens it carries over are outside the staleness bound, which the plan says (the loop
    rows and a note) unless they are masked or reweighted."""

    def planned(**overrides: object) -> Plan:
        return build_plan(
            run_config("qwen3-4b", "h100x8", "grpo_dapo_dynamic_sampling", **overrides)
        )

    def note(plan: Plan) -> str | None:
        return next((n for n in plan.notes if "partial_rollout continues" in n), None)

    plan = planned()
    said = note(plan)
    assert said is not None and "trained as the trained policy's own" in said
    assert "a group cut short again is carried again" in said
    runtime = render_runtime(plan)
    assert "0, but for the tokens partial rollouts carry over (unbounded)" in runtime
    assert "partial rollouts continue cut groups later" in runtime
    assert note(planned(recipe__rollout__mask_offpolicy_in_partial_rollout=True)) is None
    assert note(planned(recipe__algo__off_policy_correction="tis")) is None
    whole = planned(recipe__rollout__partial_rollout=False, recipe__rollout__buffer_filter=None)
    assert note(whole) is None and "unbounded" not in render_runtime(whole)


def test_a_decay_that_ends_before_the_run_is_noted_with_where(run_config: Runs) -> None:
    """A decay shorter than the run, holding at min_lr after it, can be meant: the plan says
    at which step and rollout it ends."""

    def note(**overrides: object) -> str | None:
        cfg = run_config("qwen3-4b", "h100x8", "grpo_dapo", **overrides)
        return next((n for n in build_plan(cfg).notes if "ends the cosine decay" in n), None)

    decay = {"recipe__optim__lr_decay_style": "cosine", "recipe__optim__min_lr": 1e-7}
    said = note(recipe__train__global_batch_size=64, recipe__optim__lr_decay_steps=6000, **decay)
    assert said is not None
    assert "at optimizer step 6000 of 12000 (rollout 1500 of 3000)" in said
    assert "trains at min_lr=1e-07" in said
    assert note(recipe__optim__lr_decay_steps=3000, **decay) is None  # the whole run


def test_an_evaluation_that_starts_no_trainer_is_not_held_to_training(run_config: Runs) -> None:
    """mode=eval of model.hf_checkpoint's own weights starts no train rank: qwen3-8b's
    training (147 GiB a GPU) does not fit one H100, and its evaluation there plans with the
    training side shown, unchecked and noted. Training, or an evaluation whose train ranks
    hand the engines other weights (model.load), is held to what its train ranks do (the
    test below)."""
    from rlpost.plan.fit import memory_issues, timeout_issues
    from rlpost.plan.plan import NO_TRAINING_NOTE
    from rlpost.plan.render import render_memory

    cfg = run_config("qwen3-8b", "h100x1", mode="eval")
    plan = build_plan(cfg)
    assert not plan.trains and NO_TRAINING_NOTE in plan.notes
    assert not plan.memory.train_fits and plan.memory.rollout_fits
    assert memory_issues(cfg, plan) == []
    assert timeout_issues(cfg, plan) == []
    shown = render_memory(plan)
    assert "not run (mode=eval of model.hf_checkpoint's weights" in shown
    assert "Verdict: the run fits" in shown
    with pytest.raises(UserError) as caught:
        build_plan(run_config("qwen3-8b", "h100x1"))
    assert [i.key for i in caught.value.issues] == ["layout.train.tp"]
    assert build_plan(run_config("qwen3-4b", "h100x8", mode="eval")).trains is False
    assert build_plan(run_config("qwen3-4b", "h100x8")).trains is True


def test_an_evaluation_that_starts_no_train_rank_notes_the_train_gpus_it_leaves_idle(
    run_config: Runs,
) -> None:
    """Decoupled, an evaluation of model.hf_checkpoint's weights leaves layout.train's GPUs
    idle, and the plan says so with the layout that gives them to engines (which plans);
    one whose train ranks send model.load's weights, or training, is not noted."""
    decoupled = {
        "layout__colocate": False,
        "layout__train__num_gpus": 2,
        "layout__train__tp": 2,
        "layout__rollout__num_gpus": 6,
        "layout__rollout__gpus_per_engine": 2,
    }

    def idle(**overrides: object) -> list[str]:
        plan = build_plan(run_config("qwen3-4b", "h100x8", **{**decoupled, **overrides}))
        return [n for n in plan.notes if "layout.train's" in n]

    (note,) = idle(mode="eval")
    assert note.startswith("layout.train's 2 GPUs sit idle for the whole evaluation")
    assert "layout.rollout.num_gpus: null runs engines on all 8 of h100x8" in note
    assert idle(mode="eval", model__load="/ckpt/mcore") == [] and idle() == []
    fixed = {"layout__colocate": True, "layout__train__num_gpus": None}
    fixed["layout__rollout__num_gpus"] = None
    plan = build_plan(run_config("qwen3-4b", "h100x8", mode="eval", **{**decoupled, **fixed}))
    assert plan.placement.num_engines == 4 and not [n for n in plan.notes if "idle" in n]


def test_checkpoints_without_optimizer_state_are_noted(run_config: Runs) -> None:
    """Weights-only checkpoints (slime's --no-save-optim) resume with Adam's moments at zero:
    the plan says so, naming the restarts that would meet it."""

    def note(**overrides: object) -> str | None:
        plan = build_plan(run_config("qwen3-4b", "h100x8", **overrides))
        return next((n for n in plan.notes if "save_optimizer is false" in n), None)

    assert note() is None
    said = note(recipe__save__save_optimizer=False, run__max_restarts=2, run__dir="runs/x")
    assert said is not None and "a restart (run.max_restarts=2) or a resume" in said
    assert "Adam's moments at zero" in said
    said = note(recipe__save__save_optimizer=False)
    assert said is not None and "so a resume continues" in said


def test_an_evaluation_on_the_training_prompts_or_shorter_than_training_is_noted(
    run_config: Runs,
) -> None:
    """Two evaluations that measure less than they seem to: a set that is the training prompt
    file (nothing held out), and responses cut shorter than training lets them run."""

    def notes(**overrides: object) -> list[str]:
        cfg = run_config("qwen3-tiny", "cpu", "grpo_tiny_math", **overrides)
        return [n for n in build_plan(cfg).notes if "recipe.eval" in n]

    assert notes() == []
    cfg = run_config("qwen3-tiny", "cpu", "grpo_tiny_math")
    (same,) = notes(recipe__eval__datasets=[{"name": "train", "path": cfg.recipe.data.prompt_data}])
    assert "recipe.eval.datasets.0 (train) is the training prompt file" in same
    train = cfg.recipe.data.prompt_data
    held_out = {"recipe__data__prompt_data": f"{train}@[:-100]"}
    last = [{"name": "train", "path": f"{train}@[-100:]"}]
    assert notes(**held_out, recipe__eval__datasets=last) == []  # rows apart: may be held out
    (within,) = notes(recipe__eval__datasets=last)  # rows of the whole file trained on
    assert "is the training prompt file" in within
    (short,) = notes(recipe__eval__max_response_len=8)
    assert short.startswith("recipe.eval.max_response_len=8 is below")
    assert "recipe.rollout.max_response_len=16" in short


def test_run_deterministic_switches_on_sglangs_seeded_sampling(run_config: Runs) -> None:
    """SGLang samples with a request's seed only in its deterministic inference mode: with
    run.deterministic the plan gives the engines that mode (and says it derived it); an
    engine told otherwise is refused, and the CPU engine, which seeds every request, is
    given nothing."""
    option = "layout.rollout.sglang.enable_deterministic_inference"
    plan = build_plan(run_config("qwen3-4b", "h100x8", run__deterministic=True))
    assert dict(plan.engine.sglang)["enable_deterministic_inference"] is True
    assert plan.is_derived(option)
    plain = build_plan(run_config("qwen3-4b", "h100x8"))
    assert "enable_deterministic_inference" not in dict(plain.engine.sglang)
    cpu = build_plan(run_config("qwen3-tiny", "cpu", "grpo_tiny_math", run__deterministic=True))
    assert "enable_deterministic_inference" not in dict(cpu.engine.sglang)
    with pytest.raises(UserError) as refused:
        build_plan(
            run_config(
                "qwen3-4b", "h100x8", run__deterministic=True,
                layout__rollout__sglang__enable_deterministic_inference=False,
            )
        )  # fmt: skip
    assert option in str(refused.value) and "the seeds are dropped" in str(refused.value)


def test_a_reference_other_than_the_policys_start_is_noted_when_the_kl_is_read(
    run_config: Runs,
) -> None:
    def notes(**overrides: object) -> str:
        plan = build_plan(run_config("qwen3-4b", "h100x8", model__load="/sft", **overrides))
        return "\n".join(plan.notes)

    assert "model.ref_load=/root/Qwen3-4B_torch_dist, not the policy's start" in notes(
        recipe__algo__kl_loss_coef=0.01
    )
    assert "the KL's reference" not in notes()  # the shipped recipe's KL weighs nothing
    assert "the KL's reference" not in notes(
        recipe__algo__kl_loss_coef=0.01, model__ref_load="/sft"
    )


def test_an_evaluation_whose_train_ranks_send_weights_counts_only_that(run_config: Runs) -> None:
    """mode=eval of other weights (model.load, run.resume) starts train ranks that load them
    and send them to the engines, with no optimizer, reference or train step: qwen3-8b, whose
    training needs 147 GiB a GPU, evaluates a checkpoint on one H100, its train ranks counted
    as the weights, a weight bucket and the CUDA context, and no training time."""
    from rlpost.plan.fit import memory_issues, timeout_issues
    from rlpost.plan.render import render_memory, render_work
    from rlpost.plan.work import SEND_WEIGHTS

    fraction = {"layout__rollout__sglang__mem_fraction_static": 0.6}
    with pytest.raises(UserError):
        build_plan(run_config("qwen3-8b", "h100x1", **fraction))
    for weights in ({"model__load": "/ckpt/step100"}, {"run__resume": "/runs/a/ckpt/rollout_10"}):
        cfg = run_config("qwen3-8b", "h100x1", mode="eval", **weights, **fraction)
        plan = build_plan(cfg)
        t = plan.memory.train
        assert plan.train_ranks == SEND_WEIGHTS and plan.starts_train_ranks and not plan.trains
        assert t.grads_gib == t.optimizer_gib == t.activations_gib == t.logits_gib == 0
        assert t.total_gib == pytest.approx(t.weights_gib + t.weight_bucket_gib + t.overhead_gib)
        assert t.weight_bucket_gib > 0 and plan.memory.train_fits
        assert plan.work.reference_interval == 0 and plan.work.passes_per_rollout == 0
        assert plan.prediction.train_s == 0
        assert plan.memory.host.reference_weights_gib == 0
        assert memory_issues(cfg, plan) == [] and timeout_issues(cfg, plan) == []
        assert any("train ranks only load these weights" in n for n in plan.notes)
        shown = render_memory(plan)
        assert "train ranks (load and send weights), stage 0: fits" in shown
        assert "gradients" not in shown and "activations (" not in shown
        assert "train ranks' weights (colocated, mode=eval)" in shown
        assert "no train step" in render_work(plan)
    # colocated, the train ranks' weights stay beside the engine: a derived pool leaves room
    # for them (in place of the trainer's residue it leaves in training), so the evaluation
    # fits as it is; a pool the user sets stays as set, and the rollout verdict holds it
    trained = build_plan(run_config("qwen3-8b", "h100x8"))
    cfg = run_config("qwen3-8b", "h100x1", mode="eval", model__load="/ckpt/s")
    plan = build_plan(cfg)
    kept = plan.memory.rollout.trainer_residual_gib
    assert kept == plan.memory.train.weights_gib > 5
    assert plan.engine.mem_fraction_static == pytest.approx(
        trained.engine.mem_fraction_static - (kept - 5e9 / 2**30) / 79.6, abs=1e-3
    )
    assert plan.engine.options["mem_fraction_static"] == plan.engine.mem_fraction_static
    assert memory_issues(cfg, plan) == [] and plan.memory.rollout.total_gib <= 79.6
    told = {"layout__rollout__sglang__mem_fraction_static": trained.engine.mem_fraction_static}
    cfg = run_config("qwen3-8b", "h100x1", mode="eval", model__load="/ckpt/s", **told)
    assert [i.key for i in memory_issues(cfg, build_plan(cfg))] == ["layout.rollout"]
    # the torch trainer: float32 FSDP2 shards of the weights, nothing else
    torch_eval = run_config(
        "qwen3-8b",
        "h100x1",
        mode="eval",
        model__load="/ckpt/s",
        trainer__backend="torch",
        **fraction,
    )
    t = build_plan(torch_eval).memory.train
    assert t.grads_gib == t.optimizer_gib == 0 and t.weights_gib > 30


def test_an_evaluation_that_starts_no_train_rank_counts_no_trainer_beside_the_engines(
    run_config: Runs,
) -> None:
    """mode=eval of model.hf_checkpoint's own weights starts no train rank: nothing shares a
    colocated engine's GPU, so the rollout table counts no trainer residue and a derived
    mem_fraction_static is SGLang's own, the one a GPU of the engines' alone gets."""
    from rlpost.plan.work import NO_TRAIN_RANK

    alone = build_plan(run_config("qwen3-8b", "h100x8", layout__colocate=False))
    trained = build_plan(run_config("qwen3-8b", "h100x8"))
    plan = build_plan(run_config("qwen3-8b", "h100x8", mode="eval"))
    assert plan.train_ranks == NO_TRAIN_RANK and plan.placement.colocate
    assert trained.memory.rollout.trainer_residual_gib > 4
    assert plan.memory.rollout.trainer_residual_gib == 0
    assert plan.engine.mem_fraction_static == pytest.approx(
        alone.engine.mem_fraction_static,
        abs=2e-3,  # each rounded to 0.001
    )
    assert plan.engine.options["mem_fraction_static"] == plan.engine.mem_fraction_static
    told = {"layout__rollout__sglang__mem_fraction_static": 0.7}
    four_b = build_plan(run_config("qwen3-4b", "h100x8", mode="eval", **told)).memory.rollout
    assert four_b.trainer_residual_gib == 0 and four_b.mem_fraction_static == 0.7


def test_an_evaluation_counts_no_offloaded_optimizer_on_the_host(run_config: Runs) -> None:
    """mode=eval builds no optimizer: glm4.5-355b-a32b's layout offloads Adam to the host
    (710 GiB a node in training), and its evaluation's host table counts none of it, with
    or without train ranks."""
    trained = build_plan(run_config("glm4.5-355b-a32b", "h100x64")).memory.host
    assert trained.optimizer_gib > 700
    for weights in ({}, {"model__load": "/ckpt/s"}):
        plan = build_plan(run_config("glm4.5-355b-a32b", "h100x64", mode="eval", **weights))
        host = plan.memory.host
        assert host.optimizer_gib == 0 and host.total_gib == host.processes_gib


def test_a_kl_measured_only_at_the_first_rollout_is_noted_not_refused() -> None:
    """An interval at or past the run's length measures the KL at rollout 0 alone, before the
    first update: the plan says so; not refused, since against a reference other than the
    starting policy that one figure means something, and a one-rollout run has no other."""
    from rlpost.config.loader import compose_run_config

    def notes(*overrides: str) -> list[str]:
        cfg = compose_run_config(list(overrides))[0]
        return [n for n in build_plan(cfg).notes if "kl_metric_interval" in n]

    rollouts = compose_run_config([])[0].recipe.rollout.num_rollout
    (note,) = notes(f"recipe.algo.kl_metric_interval={rollouts}")
    assert f"is not below the run's {rollouts} rollouts" in note and "only at rollout 0" in note
    assert notes(f"recipe.algo.kl_metric_interval={rollouts - 1}") == []
    assert notes("recipe.algo.kl_metric_interval=1", "recipe.rollout.num_rollout=1") == []
