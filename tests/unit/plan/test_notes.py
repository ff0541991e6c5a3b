"""Plan notes on what a valid layout leaves unused (rlpost.plan.notes)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from rlpost.plan import Plan, build_plan
from rlpost.schema import RunConfig

Runs = Callable[..., RunConfig]
IDLE = "sit idle for the whole run"
TRAINED_UNUSED = "no engine drafts with them"
DRAFT_DRIFTS = "fewer and fewer drafted tokens are accepted"


def said(plan: Plan, part: str) -> str | None:
    return next((note for note in plan.notes if part in note), None)


def test_a_colocated_layout_on_part_of_the_gpus_is_noted_with_the_idle_count(
    run_config: Runs,
) -> None:
    plan = build_plan(run_config("qwen3-4b", "h100x8", layout__train__num_gpus=4))
    note = said(plan, IDLE)
    assert note is not None and note.startswith("4 of the 8 GPUs sit idle")
    assert "share layout.train.num_gpus=4, and h100x8 has 8 GPUs" in note
    assert "layout.train.num_gpus: 8 (whole tp x pp x cp = 2-GPU replicas" in note
    assert "layout.colocate: false with layout.rollout.num_gpus: 4" in note
    # the fix it names plans, and without the note
    assert (
        said(build_plan(run_config("qwen3-4b", "h100x8", layout__train__num_gpus=8)), IDLE) is None
    )
    decoupled = run_config(
        "qwen3-4b", "h100x8", layout__colocate=False, layout__train__num_gpus=4,
        layout__rollout__num_gpus=4,
    )  # fmt: skip
    assert said(build_plan(decoupled), IDLE) is None


def test_a_colocated_layout_whose_replicas_cannot_grow_names_only_the_decoupled_fix(
    run_config: Runs,
) -> None:
    # 6 of 8 in replicas of 2 x 3 = 6 GPUs: no whole-replica count above 6 fits 8
    plan = build_plan(
        run_config(
            "qwen3-4b", "h100x8", layout__train__num_gpus=6, layout__train__tp=2,
            layout__train__sequence_parallel=True, layout__train__cp=3,
            recipe__train__max_tokens_per_gpu=9216,
        )
    )  # fmt: skip
    note = said(plan, IDLE)
    assert note is not None and note.startswith("2 of the 8 GPUs sit idle")
    assert "layout.train.num_gpus:" not in note
    assert "layout.colocate: false with layout.rollout.num_gpus: 2" in note


def test_a_decoupled_split_short_of_the_gpus_is_noted(run_config: Runs) -> None:
    plan = build_plan(
        run_config(
            "qwen3-4b", "h100x8", layout__colocate=False, layout__train__num_gpus=2,
            layout__rollout__num_gpus=4,
        )
    )  # fmt: skip
    note = said(plan, IDLE)
    assert note is not None and note.startswith("2 of the 8 GPUs sit idle")
    assert "2 train and 4 generate" in note and "layout.rollout.num_gpus: 6" in note


def test_the_cpu_profile_counts_device_slots(run_config: Runs) -> None:
    plan = build_plan(run_config("qwen3-tiny", "cpu", "grpo_tiny_math", layout__train__num_gpus=1))
    note = said(plan, IDLE)
    assert note is not None and note.startswith("1 of the 2 device slots sit idle")
    replicated = build_plan(
        run_config(
            "qwen3-tiny", "cpu", "grpo_tiny_math", hardware__gpus_per_node=4,
            trainer__backend="megatron", layout__train__num_gpus=2, layout__train__tp=2,
        )
    )  # fmt: skip
    note = said(replicated, IDLE)
    assert note is not None and "whole tp x pp x cp = 2-device-slot replicas" in note
    assert "GPU" not in note


@pytest.mark.parametrize(
    ("model", "hardware"),
    [*itertools.product(["qwen3-4b", "glm4-9b"], ["h100x8", "h100x16"]), ("qwen3-4b", "h200x1")],
)
def test_derived_and_searched_layouts_use_every_gpu(
    model: str, hardware: str, run_config: Runs
) -> None:
    derived = build_plan(run_config(model, hardware, layout=False))
    assert said(derived, IDLE) is None
    searched = build_plan(run_config(model, hardware, layout=False, layout__search=True))
    assert said(searched, IDLE) is None


SPECULATIVE = {
    "layout__rollout__sglang__speculative_algorithm": "EAGLE",
    "layout__rollout__sglang__speculative_num_steps": 2,
    "layout__rollout__sglang__speculative_eagle_topk": 1,
    "layout__rollout__sglang__speculative_num_draft_tokens": 3,
}


def test_mtp_training_with_no_engine_drafting_is_noted(run_config: Runs) -> None:
    plan = build_plan(run_config("glm4.7-flash", "h100x8", recipe__train__mtp_training=True))
    note = said(plan, TRAINED_UNUSED)
    assert note is not None and "the rollouts gain nothing from them" in note
    assert "layout.rollout.sglang speculative_algorithm: EAGLE" in note
    assert "recipe.train.mtp_training: false leaves them out" in note
    both = run_config("glm4.7-flash", "h100x8", recipe__train__mtp_training=True, **SPECULATIVE)
    assert not [n for n in build_plan(both).notes if "MTP" in n]
    # a draft model of its own does not draft with the MTP layers
    own = run_config(
        "glm4.7-flash", "h100x8", recipe__train__mtp_training=True,
        layout__rollout__sglang__speculative_algorithm="EAGLE3",
        layout__rollout__sglang__speculative_draft_model_path="/ckpt/draft",
    )  # fmt: skip
    assert said(build_plan(own), TRAINED_UNUSED) is not None


def test_an_mtp_draft_that_is_not_trained_is_noted(run_config: Runs) -> None:
    plan = build_plan(run_config("glm4.7-flash", "h100x8", **SPECULATIVE))
    note = said(plan, DRAFT_DRIFTS)
    assert note is not None
    assert note.startswith("layout.rollout.sglang.speculative_algorithm=EAGLE drafts with")
    assert "recipe.train.mtp_training: true" in note and "it is the speed that suffers" in note
    nextn = run_config(
        "glm4.7-flash", "h100x8", layout__rollout__sglang__speculative_algorithm="nextn"
    )
    assert said(build_plan(nextn), DRAFT_DRIFTS) is not None
    # nothing about MTP where nothing drafts with it, or a draft model of its own does
    assert not [n for n in build_plan(run_config("glm4.7-flash", "h100x8")).notes if "MTP" in n]
    own = run_config(
        "glm4.7-flash", "h100x8",
        layout__rollout__sglang__speculative_algorithm="EAGLE3",
        layout__rollout__sglang__speculative_draft_model_path="/ckpt/draft",
    )  # fmt: skip
    assert not [n for n in build_plan(own).notes if "MTP" in n]


LOPSIDED = "sets the pace and the memory peak"


def test_a_stage_count_kept_from_another_pp_is_noted_with_a_balanced_one(run_config: Runs) -> None:
    # glm4.7-flash_h100x16 splits 47 layers 24 + 23 over pp=2 (last stage 23); at pp=4 the
    # kept last stage leaves 8, 8, 8 for the others
    shipped = run_config("glm4.7-flash", "h100x16")
    assert said(build_plan(shipped), LOPSIDED) is None
    repiped = {"layout__train__pp": 4, "layout__train__tp": 2, "layout__train__ep": 4}
    note = said(build_plan(run_config("glm4.7-flash", "h100x16", **repiped)), LOPSIDED)
    assert note is not None and note.startswith("the 4 pipeline stages hold 8, 8, 8, 23 of")
    assert "(layout.train.num_layers_in_last_pipeline_stage=23 with pp=4)" in note
    assert "holds at most 12 a stage" in note
    assert note.endswith(
        "set layout.train.num_layers_in_last_pipeline_stage: 11 for 12, 12, 12, 11"
    )
    # the split it names plans, and without the note
    fixed = run_config(
        "glm4.7-flash", "h100x16", **repiped, layout__train__num_layers_in_last_pipeline_stage=11
    )
    assert build_plan(fixed).pipeline_stages == (12, 12, 12, 11)
    assert said(build_plan(fixed), LOPSIDED) is None


def test_uneven_stages_where_pp_splits_the_layers_evenly_name_their_removal(
    run_config: Runs,
) -> None:
    stages = {
        "layout__train__pp": 4, "layout__train__tp": 2,
        "layout__train__num_layers_in_first_pipeline_stage": 3,
        "layout__train__num_layers_in_last_pipeline_stage": 3,
    }  # fmt: skip
    note = said(build_plan(run_config("qwen3-4b", "h100x8", **stages)), LOPSIDED)
    assert note is not None and "hold 3, 15, 15, 3 of the model's 36 layers" in note
    assert note.endswith(
        "remove layout.train.num_layers_in_first_pipeline_stage and "
        "layout.train.num_layers_in_last_pipeline_stage for 9, 9, 9, 9"
    )
    # a stage a few layers off the even share (the embedding's or the loss's room) is meant
    near = {**stages, "layout__train__num_layers_in_first_pipeline_stage": 7,
            "layout__train__num_layers_in_last_pipeline_stage": 9}  # fmt: skip
    assert said(build_plan(run_config("qwen3-4b", "h100x8", **near)), LOPSIDED) is None


CLIP_INERT = "never bind"


def test_clip_bounds_on_one_step_a_rollout_are_noted_as_never_binding(run_config: Runs) -> None:
    # grpo_dapo: 32 prompts x 8 samples = 256 = global_batch_size, one step a rollout
    note = said(build_plan(run_config("qwen3-4b", "h100x8")), CLIP_INERT)
    assert note is not None and note.startswith("recipe.algo.eps_clip_high=0.28 never binds")
    assert "its ratio pi/pi_old is 1 (no update has moved the policy yet)" in note
    assert note.endswith("recipe.train.global_batch_size: 128 gives 2 steps a rollout, from the "
                         "second of which the ratio moves")  # fmt: skip
    dual = run_config("qwen3-4b", "h100x8", recipe__algo__eps_clip_c=3.0)
    assert said(build_plan(dual), "eps_clip_high=0.28 and recipe.algo.eps_clip_c=3 never bind")
    # the fix it names plans, and without the note; eps_clip alone (a default) is not noted
    halved = run_config("qwen3-4b", "h100x8", recipe__train__global_batch_size=128)
    assert said(build_plan(halved), CLIP_INERT) is None
    symmetric = run_config("qwen3-4b", "h100x8", recipe__algo__eps_clip_high=None)
    assert said(build_plan(symmetric), CLIP_INERT) is None


@pytest.mark.parametrize("recipe", ["grpo_tiny_math", "grpo_tiny_calculator"])
def test_the_shipped_cpu_recipes_set_no_clip_bound_that_never_binds(
    run_config: Runs, recipe: str
) -> None:
    # one optimizer step a rollout: the CPU default's own plan says nothing of its clip
    plan = build_plan(run_config("qwen3-tiny", "cpu", recipe))
    assert said(plan, CLIP_INERT) is None, plan.notes


def test_a_save_interval_beyond_the_run_is_noted_as_one_save_at_the_end(run_config: Runs) -> None:
    long = run_config(
        "qwen3-4b", "h100x8", recipe__save__interval=5000, recipe__save__save_hf_interval=4000
    )
    notes = [n for n in build_plan(long).notes if "is beyond the run's 3000 rollouts" in n]
    assert len(notes) == 2, build_plan(long).notes
    assert notes[0].startswith("recipe.save.interval=5000 is beyond the run's 3000 rollouts: the "
                               "one checkpoint is written after the last rollout with the "
                               "optimizer's state")  # fmt: skip
    assert "recipe.save.interval: null writes no checkpoint" in notes[0]
    assert notes[1].startswith("recipe.save.save_hf_interval=4000")
    # an interval within the run, and the run's own length, are not noted
    for interval in (20, 3000):
        within = run_config("qwen3-4b", "h100x8", recipe__save__interval=interval)
        assert said(build_plan(within), "is beyond the run's") is None


def test_an_eval_interval_beyond_the_run_is_noted_as_evaluating_at_the_ends(
    run_config: Runs,
) -> None:
    plan = build_plan(run_config("qwen3-4b", "h100x8", recipe__eval__interval=5000))
    note = said(plan, "recipe.eval.interval=5000 is beyond the run's 3000 rollouts")
    assert note is not None
    assert "evaluated before training and after the last rollout only" in note
    assert "recipe.eval.datasets: [] with recipe.eval.interval: null evaluates none" in note
    skipped = run_config(
        "qwen3-4b", "h100x8", recipe__eval__interval=5000, recipe__eval__skip_before_train=True
    )
    assert "evaluated after the last rollout only" in (said(build_plan(skipped), "5000") or "")
    # the shipped interval (20), and no evaluation sets, are not noted
    assert said(build_plan(run_config("qwen3-4b", "h100x8")), "recipe.eval.interval") is None
    none = run_config("qwen3-4b", "h100x8", recipe__eval__interval=None, recipe__eval__datasets=[])
    assert said(build_plan(none), "recipe.eval.interval") is None


KL_UNREAD = "estimates a KL that is never computed"


def test_a_kl_estimator_with_no_kl_computed_is_noted_with_what_computes_one(
    run_config: Runs,
) -> None:
    # grpo_dapo, as slime's seed scripts: use_kl_loss, kl_loss_coef 0, low_var_kl
    note = said(build_plan(run_config("qwen3-4b", "h100x8")), KL_UNREAD)
    assert note is not None and note.startswith(
        f"recipe.algo.kl_loss_type=low_var_kl {KL_UNREAD}: use_kl_loss with kl_loss_coef 0 "
        "weighs it nothing in the loss, the reward carries none (kl_coef 0)"
    )
    assert "neither loaded nor run (slime, given --use-kl-loss, loads the reference" in note
    assert note.endswith("recipe.algo.kl_metric_interval: N logs the KL with this estimator "
                         "every N rollouts, kl_loss_coef above 0 puts it in the loss")  # fmt: skip
    # each fix it names computes a KL, with this estimator, and the note goes
    for fix in ({"recipe__algo__kl_metric_interval": 5}, {"recipe__algo__kl_loss_coef": 0.01}):
        assert said(build_plan(run_config("qwen3-4b", "h100x8", **fix)), KL_UNREAD) is None
    off = build_plan(run_config("qwen3-4b", "h100x8", recipe__algo__use_kl_loss=False))
    assert (said(off, KL_UNREAD) or "").startswith(
        f"recipe.algo.kl_loss_type=low_var_kl {KL_UNREAD}: use_kl_loss is false, the reward"
    )
    # one note on the unread KL: the estimator's says what use_kl_loss's alone would
    plan = build_plan(run_config("qwen3-4b", "h100x8"))
    assert [n for n in plan.notes if "kl_loss_coef 0" in n] == [note]
    # the default estimator (k1) is not named; an evaluation, which trains nothing, notes none
    k1 = build_plan(run_config("qwen3-4b", "h100x8", recipe__algo__kl_loss_type="k1"))
    assert said(k1, KL_UNREAD) is None
    assert [n for n in k1.notes if "kl_loss_coef 0" in n] == [
        "recipe.algo.use_kl_loss with kl_loss_coef 0: the KL weighs nothing in the loss, so "
        "the reference model is neither loaded nor run (recipe.algo.kl_metric_interval: N "
        "logs the KL every N rollouts)"
    ]
    assert said(build_plan(run_config("qwen3-4b", "h100x8", mode="eval")), KL_UNREAD) is None


BALANCE_INERT = "recipe.train.balance_data=true partitions nothing"


def test_balancing_data_over_one_data_parallel_rank_is_noted(run_config: Runs) -> None:
    # seed 000: TP2 x CP2 on 4 train GPUs, dp=1; seed 001: dp=4
    glm = build_plan(run_config("glm4-9b", "h100x8"))
    assert glm.parallel.dp == 1
    note = said(glm, BALANCE_INERT)
    assert note is not None
    assert "the layout has one data-parallel rank (dp=1), which trains every sample" in note
    assert note.endswith("it evens the ranks' tokens once dp is above 1 (more train GPUs, or a "
                         "smaller tp x pp x cp)")  # fmt: skip
    assert said(build_plan(run_config("qwen3-4b", "h100x8")), BALANCE_INERT) is None
    unbalanced = run_config("glm4-9b", "h100x8", recipe__train__balance_data=False)
    assert said(build_plan(unbalanced), BALANCE_INERT) is None
    # the torch trainer's replica is one GPU: a smaller one is not what leaves more ranks
    one = run_config(
        "qwen3-tiny",
        "cpu",
        "grpo_tiny_math",
        layout__train__num_gpus=1,
        recipe__train__balance_data=True,
    )
    torch = build_plan(one)
    assert torch.trainer_backend == "torch" and torch.parallel.dp == 1
    note = said(torch, BALANCE_INERT)
    assert note is not None and note.endswith("once dp is above 1 (more train device slots)")


ONE_ENGINE = "has one engine to choose"


def test_a_router_policy_with_one_engine_is_noted(run_config: Runs) -> None:
    # seed 003: one engine on all 8 GPUs; seed 001: four engines
    one = build_plan(run_config("glm4.7-flash", "h100x8", engine__router_policy="cache_aware"))
    assert one.placement.num_engines == 1
    note = said(one, ONE_ENGINE)
    assert note is not None and note.startswith(
        f"engine.router_policy=cache_aware {ONE_ENGINE}: the plan starts one, and the router "
        "sends it every request"
    )
    # an evaluation routes its requests too
    evaluated = run_config(
        "glm4.7-flash", "h100x8", engine__router_policy="cache_aware", mode="eval"
    )
    assert said(build_plan(evaluated), ONE_ENGINE) is not None
    # more engines, or the default policy, are not noted
    four = run_config("qwen3-4b", "h100x8", engine__router_policy="cache_aware")
    assert said(build_plan(four), ONE_ENGINE) is None
    assert said(build_plan(run_config("glm4.7-flash", "h100x8")), ONE_ENGINE) is None
