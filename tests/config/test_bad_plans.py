"""Configurations that validate but cannot be planned: each names the key, value and fix."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

import pytest

from rlpost.errors import UserError
from rlpost.plan import build_plan
from rlpost.schema import RunConfig


class Bad(NamedTuple):
    name: str
    overrides: tuple[str, ...]
    key: str
    fragment: str


GLM9 = ("model=glm4-9b", "recipe=grpo_dapo", "hardware=h100x8")
QWEN = ("model=qwen3-4b", "recipe=grpo_dapo", "hardware=h100x8")
FLASH = ("model=glm4.7-flash", "recipe=grpo_dapo", "hardware=h100x8")
TINY = ("model=qwen3-tiny", "recipe=grpo_tiny_math", "hardware=cpu")

CASES = [
    Bad(
        "explicit dp disagrees",
        (*QWEN, "++layout.train.dp=2"),
        "layout.train.dp",
        "tp x pp x cp x dp = 2 x 1 x 1 x 2 = 4",
    ),
    Bad(
        "train gpus not whole replicas",
        (*GLM9, "layout.train.num_gpus=3"),
        "layout.train.num_gpus",
        "do not split into tp x pp x cp",
    ),
    Bad(
        "decoupled asks for too many gpus",
        (*GLM9, "layout.rollout.num_gpus=6"),
        "layout.rollout.num_gpus",
        "4 train + 6 rollout = 10 GPUs",
    ),
    Bad(
        "colocated pool larger than hardware",
        (*QWEN, "layout.train.num_gpus=16"),
        "layout.train.num_gpus",
        "share 16 GPUs",
    ),
    Bad(
        "decoupled without rollout gpus",
        (*GLM9, "layout.rollout.num_gpus=0"),
        "layout.rollout.num_gpus",
        "leaves no GPUs for the engines",
    ),
    Bad(
        "query groups not divisible by tp",
        (*GLM9, "layout.train.tp=4", "layout.train.cp=1"),
        "layout.train.tp",
        "2 query groups",
    ),
    Bad(
        "mla heads not divisible by tp",
        (*FLASH, "layout.train.tp=8", "layout.train.ep=1"),
        "layout.train.tp",
        "multi-latent attention splits the 20 attention heads",
    ),
    Bad(
        "experts not divisible by ep",
        (*FLASH, "layout.train.ep=3"),
        "layout.train.ep",
        "64 experts do not split evenly over ep=3",
    ),
    Bad(
        "expert grid does not fit the world",
        (*FLASH, "layout.train.etp=2"),
        "layout.train.ep",
        "etp x ep x pp grid",
    ),
    Bad(
        "expert parallelism on a dense model",
        (*QWEN, "layout.train.ep=2"),
        "layout.train.ep",
        "is dense",
    ),
    Bad(
        "pp does not divide layers",
        (
            *GLM9,
            "layout.train.pp=3",
            "layout.train.num_gpus=3",
            "layout.train.tp=1",
            "layout.train.cp=1",
            "layout.train.sequence_parallel=false",
        ),
        "layout.train.pp",
        "40 layers do not split evenly over pp=3",
    ),
    Bad(
        "uneven stages without pipeline",
        (*QWEN, "++layout.train.num_layers_in_last_pipeline_stage=4"),
        "layout.train.num_layers_in_last_pipeline_stage",
        "need more than one stage",
    ),
    Bad(
        "47 layers on two stages without an uneven split",
        (
            "model=glm4.7-flash",
            "recipe=grpo_dapo",
            "hardware=h100x16",
            "layout.train.num_layers_in_last_pipeline_stage=null",
        ),
        "layout.train.pp",
        "47 layers do not split evenly over pp=2",
    ),
    Bad(
        "engine does not divide rollout gpus",
        (*GLM9, "layout.rollout.gpus_per_engine=3"),
        "layout.rollout.gpus_per_engine",
        "do not split into engines of 3",
    ),
    Bad(
        "engine crosses a node boundary",
        (
            "model=glm4-9b",
            "recipe=grpo_dapo",
            "hardware=h100x16",
            "++layout.colocate=false",
            "++layout.train.num_gpus=6",
            "++layout.rollout.num_gpus=8",
            "++layout.rollout.gpus_per_engine=4",
            "++layout.train.tp=2",
            "++layout.train.cp=1",
        ),
        "layout.rollout.gpus_per_engine",
        "crossing from node 0 to node 1",
    ),
    Bad(
        "multi-node engine not whole nodes",
        (
            "model=glm4-9b",
            "recipe=grpo_dapo",
            "hardware=h100x16",
            "++layout.colocate=false",
            "++layout.train.num_gpus=4",
            "++layout.rollout.num_gpus=12",
            "++layout.rollout.gpus_per_engine=12",
        ),
        "layout.rollout.gpus_per_engine",
        "must cover",
    ),
    Bad(
        "sequence parallel without tp",
        (
            "model=qwen3-4b",
            "recipe=grpo_dapo",
            "hardware=h200x1",
            "++layout.train.sequence_parallel=true",
        ),
        "layout.train.sequence_parallel",
        "which has size tp=1",
    ),
    Bad(
        "expert and tensor parallel without sp",
        (*FLASH, "layout.train.tp=2"),
        "layout.train.sequence_parallel",
        "requires sequence parallelism",
    ),
    Bad(
        "context parallel without packing",
        (
            *GLM9,
            "recipe.train.use_dynamic_batch_size=false",
            "recipe.train.max_tokens_per_gpu=null",
        ),
        "layout.train.cp",
        "packing is off",
    ),
    Bad(
        "async loop on a colocated layout",
        ("model=qwen3-4b", "recipe=grpo_dapo_async", "hardware=h100x8"),
        "recipe.loop.mode",
        "needs separate train and rollout GPUs",
    ),
    Bad(
        "dp attention size does not divide the engine",
        (*FLASH, "layout.rollout.sglang.dp_size=3"),
        "layout.rollout.sglang.dp_size",
        "does not divide them",
    ),
    Bad(
        "dp size without dp attention",
        (*FLASH, "layout.rollout.sglang.enable_dp_attention=false"),
        "layout.rollout.sglang.dp_size",
        "replicas of 8 GPUs",
    ),
    Bad(
        "engine attention tp does not divide heads",
        (
            *FLASH,
            "layout.rollout.sglang.enable_dp_attention=false",
            "layout.rollout.sglang.dp_size=1",
        ),
        "layout.rollout.gpus_per_engine",
        "20 attention heads",
    ),
    Bad(
        "sglang ep size does not divide the engine",
        (*FLASH, "++layout.rollout.sglang.ep_size=3"),
        "layout.rollout.sglang.ep_size",
        "ep_size must divide tp_size",
    ),
    Bad(
        "sglang ep size on a dense model",
        (*QWEN, "++layout.rollout.sglang.ep_size=2"),
        "layout.rollout.sglang.ep_size",
        "is dense",
    ),
    Bad(
        "global batch not divisible by dp",
        (*FLASH, "recipe.train.global_batch_size=4"),
        "recipe.train.global_batch_size",
        "over dp=8",
    ),
    Bad(
        "rollout too small for the engines",
        (
            *GLM9,
            "recipe.rollout.batch_size=1",
            "recipe.rollout.n_samples_per_prompt=1",
            "recipe.train.global_batch_size=1",
            "recipe.algo.advantage_estimator=reinforce_plus_plus",
        ),
        "recipe.rollout.batch_size",
        "cannot keep 2 engines busy",
    ),
    Bad(
        "moe token dispatcher on a dense model",
        (*GLM9, "++layout.train.moe_token_dispatcher_type=alltoall"),
        "layout.train.moe_token_dispatcher_type",
        "is dense (no model.moe)",
    ),
    Bad(
        "expert tensor parallelism on a dense model",
        (*GLM9, "layout.train.etp=2"),
        "layout.train.etp",
        "splits each MoE expert's weights, and glm4-9b is dense",
    ),
    Bad(
        "uniform recompute groups that overrun the model's layers",
        (*GLM9, "layout.train.recompute.num_layers=3"),
        "layout.train.recompute.num_layers",
        "the model's 40 layers are not a multiple of 3",
    ),
    Bad(
        "uniform recompute groups that overrun a pipeline stage",
        (
            *QWEN,
            "layout.train.pp=2",
            "layout.train.tp=1",
            "layout.train.sequence_parallel=false",
            "layout.train.recompute.num_layers=4",
        ),
        "layout.train.recompute.num_layers",
        "stages of 18 layers (of [18, 18]) are not a multiple of 4",
    ),
    Bad(
        "speculative decoding with no draft model",
        (*QWEN, "++layout.rollout.sglang.speculative_algorithm=EAGLE"),
        "layout.rollout.sglang.speculative_algorithm",
        "qwen3-4b has none (model.mtp_num_layers=0)",
    ),
    Bad(
        "EAGLE3 with no draft model",
        (*GLM9, "++layout.rollout.sglang.speculative_algorithm=EAGLE3"),
        "layout.rollout.sglang.speculative_algorithm",
        "EAGLE3 drafts with a model of its own",
    ),
    Bad(
        "engines given another tokenizer",
        (*GLM9, "++layout.rollout.sglang.tokenizer_path=/root/other-tokenizer"),
        "layout.rollout.sglang.tokenizer_path",
        "another tokenizer than the trainer",
    ),
    Bad(
        "cpu engine with tensor parallelism",
        (*TINY, "++layout.rollout.gpus_per_engine=2"),
        "layout.rollout.gpus_per_engine",
        "CPU engine runs in one device slot",
    ),
    Bad(
        "model too large for the hardware",
        ("model=glm4.5-355b-a32b", "recipe=grpo_dapo", "hardware=h100x8"),
        "layout.train.tp",
        "no tensor-parallel size fits",
    ),
    Bad(
        "no engine size leaves room for the kv cache",
        ("model=glm4.5-355b-a32b", "recipe=grpo_dapo", "hardware=h100x8"),
        "layout.rollout.gpus_per_engine",
        "leaves a KV cache for one",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_plan_is_rejected(case: Bad, compose_run: Callable[..., RunConfig]) -> None:
    cfg = compose_run(*case.overrides)
    with pytest.raises(UserError) as info:
        build_plan(cfg)
    matching = [issue for issue in info.value.issues if issue.key == case.key]
    assert matching, f"no issue at {case.key}: {info.value.render()}"
    assert any(case.fragment in issue.message for issue in matching), info.value.render()
    assert all(issue.fix for issue in info.value.issues)


def test_all_issues_are_reported_at_once(compose_run: Callable[..., RunConfig]) -> None:
    cfg = compose_run(
        *FLASH,
        "layout.train.ep=3",
        "recipe.train.global_batch_size=4",
        "layout.rollout.sglang.dp_size=3",
    )
    with pytest.raises(UserError) as info:
        build_plan(cfg)
    keys = {issue.key for issue in info.value.issues}
    assert {
        "layout.train.ep",
        "recipe.train.global_batch_size",
        "layout.rollout.sglang.dp_size",
    } <= keys
    text = info.value.render()
    assert text.startswith("rlpost: ") and "fix:" in text


@pytest.mark.parametrize(
    ("overrides", "fix", "fixed"),
    [
        (("layout.train.tp=16",), "use a layout.train.tp that divides 8: 1, 2, 4, 8", "tp=8"),
        (("layout.train.tp=3",), "use a layout.train.tp that divides 8: 1, 2, 4, 8", "tp=4"),
        (
            ("layout.train.tp=2", "layout.train.pp=3"),
            "use a multiple of 6 train GPUs that h100x8 has (layout.train.num_gpus: 6)",
            "num_gpus=6",
        ),
    ],
)
def test_a_train_grid_fix_names_what_the_hardware_holds(
    overrides: tuple[str, ...], fix: str, fixed: str, compose_run: Callable[..., RunConfig]
) -> None:
    on_h100x8 = ("model=qwen3-8b", "recipe=grpo_dapo", "hardware=h100x8", *overrides)
    with pytest.raises(UserError) as info:
        build_plan(compose_run(*on_h100x8))
    (issue,) = [i for i in info.value.issues if i.key == "layout.train.num_gpus"]
    assert issue.fix.startswith(fix), issue.fix
    assert max(int(n) for n in re.findall(r"\d+", issue.fix.replace("h100x8", ""))) <= 8
    build_plan(compose_run(*on_h100x8, f"layout.train.{fixed}"))  # the fix it names plans


FIRST = "layout.train.num_layers_in_first_pipeline_stage"
LAST = "layout.train.num_layers_in_last_pipeline_stage"
PP4 = (*QWEN, "layout.train.pp=4", "layout.train.tp=2")  # 36 layers, 8 GPUs


@pytest.mark.parametrize(
    ("overrides", "key", "says", "fixes"),
    [
        (
            (*PP4, f"++{FIRST}=10"),
            FIRST,
            "the first stage is set to 10 layers of the model's 36, which leaves 26 for the 3 "
            "stages between, and 26 does not split evenly over 3",
            [((f"{LAST}=6",), (10, 10, 10, 6)), ((f"{FIRST}=null",), (9, 9, 9, 9))],
        ),
        (
            (*QWEN, "layout.train.pp=2", f"++{FIRST}=40"),
            FIRST,
            "the first stage is set to 40 layers of the model's 36, which leaves none for the "
            "other stage",
            [((f"{FIRST}=null",), (18, 18))],
        ),
        (
            (*PP4, f"++{FIRST}=8", f"++{LAST}=9"),
            FIRST,
            "the first and last stages are set to 8 + 9 = 17 layers of the model's 36, which "
            "leaves 19 for the 2 stages between",
            [((f"{LAST}=8",), (8, 10, 10, 8)), ((f"{FIRST}=null", f"{LAST}=null"), (9, 9, 9, 9))],
        ),
    ],
    ids=["first stage leaves an odd rest", "first stage past the layers", "both set, odd rest"],
)
def test_an_uneven_split_that_does_not_split_names_its_stage_count_and_splits_that_do(
    overrides: tuple[str, ...],
    key: str,
    says: str,
    fixes: list[tuple[tuple[str, ...], tuple[int, ...]]],
    compose_run: Callable[..., RunConfig],
) -> None:
    with pytest.raises(UserError) as info:
        build_plan(compose_run(*overrides))
    (issue,) = [i for i in info.value.issues if i.key == key]
    assert says in issue.message and "None" not in issue.message, issue.message
    # each split the fix names, applied, plans with the stages it says
    for settings, stages in fixes:
        words = " and ".join(
            f"{s.split('=')[0]}: {s.split('=')[1]}" for s in settings if not s.endswith("null")
        )
        assert words in issue.fix and f"for {', '.join(map(str, stages))}" in issue.fix, issue.fix
        assert build_plan(compose_run(*overrides, *settings)).pipeline_stages == stages


@pytest.mark.parametrize(
    ("model", "names_ep"), [("model=glm4-9b", False), ("model=qwen3-30b-a3b", True)]
)
def test_a_tp_that_does_not_fit_names_expert_parallel_only_for_a_model_with_experts(
    compose_run: Callable[..., RunConfig], model: str, names_ep: bool
) -> None:
    with pytest.raises(UserError) as info:
        build_plan(compose_run(model, "recipe=grpo_dapo", "hardware=h100x1"))
    (issue,) = [i for i in info.value.issues if i.key == "layout.train.tp"]
    assert "a hardware profile with " in issue.fix, issue.fix
    assert ("layout.train.ep" in issue.fix) is names_ep, issue.fix
    assert ("MoE" in issue.fix) is False, issue.fix


def test_the_memory_a_refused_tp_still_needs_adds_up(compose_run: Callable[..., RunConfig]) -> None:
    cfg = compose_run("model=deepseek-v3", "recipe=grpo_dapo", "hardware=h100x64")
    with pytest.raises(UserError) as info:
        build_plan(cfg)
    (issue,) = [i for i in info.value.issues if "no tensor-parallel size fits" in i.message]
    found = re.search(r"still needs ([\d.]+) GiB per GPU \((.*)\)$", issue.message)
    assert found is not None, issue.message
    terms = dict(re.findall(r"([a-zA-Z +]+?) ([\d.]+)(?:, |$)", found.group(2)))
    assert "CUDA context and workspaces" in terms and "grouped experts" in terms
    assert sum(map(float, terms.values())) == pytest.approx(float(found.group(1)), abs=0.25)


@pytest.mark.parametrize(
    "overrides",
    [
        (*GLM9, "layout.train.recompute.num_layers=4"),  # 40 layers in groups of 4
        (*GLM9, "layout.train.recompute.num_layers=3", "layout.train.recompute.method=block"),
        (*GLM9, "layout.train.etp=1"),
        (
            *QWEN,
            "++layout.rollout.sglang.speculative_algorithm=EAGLE3",
            "++layout.rollout.sglang.speculative_draft_model_path=/root/Qwen3-4B-eagle3",
        ),
        (*QWEN, "++layout.rollout.sglang.speculative_algorithm=NGRAM"),
        # EAGLE drafts with the checkpoint's own MTP layers
        (
            "model=glm4.5-355b-a32b",
            "recipe=grpo_dapo",
            "hardware=h100x64",
            "++layout.rollout.sglang.speculative_algorithm=EAGLE",
        ),
    ],
    ids=lambda o: " ".join(o[3:]),
)
def test_what_those_checks_leave_alone_plans(
    overrides: tuple[str, ...], compose_run: Callable[..., RunConfig]
) -> None:
    build_plan(compose_run(*overrides))


DECOUPLED_ONE = ("layout.colocate=false", "layout.train.num_gpus=1", "layout.rollout.num_gpus=1")


@pytest.mark.parametrize(
    ("overrides", "key", "says"),
    [
        (
            ("layout.train.tp=2",),
            "layout.train.num_gpus",
            "1 train device slot does not split into tp x pp x cp",
        ),
        (("++layout.train.dp=2",), "layout.train.dp", "but there is 1 train device slot"),
        (
            ("layout.rollout.gpus_per_engine=2",),
            "layout.rollout.gpus_per_engine",
            "1 rollout device slot does not split into engines of 2 device slots",
        ),
    ],
    ids=["train grid", "dp", "engine size"],
)
def test_a_count_of_one_device_reads_in_the_singular(
    overrides: tuple[str, ...], key: str, says: str, compose_run: Callable[..., RunConfig]
) -> None:
    with pytest.raises(UserError) as info:
        build_plan(compose_run(*TINY, *DECOUPLED_ONE, *overrides))
    assert any(says in i.message for i in info.value.issues if i.key == key), info.value.render()


COLOCATED = ("layout.colocate=true", "layout.train.num_gpus=null", "layout.rollout.num_gpus=null")


@pytest.mark.parametrize(
    ("run", "overrides", "tp", "says", "fixes"),
    [
        (
            TINY,
            DECOUPLED_ONE,
            "layout.train.tp=2",
            "cpu has 2 device slots and the rollout takes 1: set layout.colocate: true and "
            "remove layout.train.num_gpus and layout.rollout.num_gpus",
            [COLOCATED],
        ),
        (
            QWEN,
            ("layout.colocate=false", "layout.train.num_gpus=3", "layout.rollout.num_gpus=5"),
            "layout.train.tp=4",
            "h100x8 has 8 GPUs and the rollout takes 5: set layout.colocate: true and remove "
            "layout.train.num_gpus and layout.rollout.num_gpus (training and rollout then share "
            "all 8), or layout.train.num_gpus: 4 with layout.rollout.num_gpus: 4",
            [COLOCATED, ("layout.train.num_gpus=4", "layout.rollout.num_gpus=4")],
        ),
    ],
    ids=["cpu", "h100x8"],
)
def test_a_replica_the_rollout_crowds_out_is_fixed_by_giving_training_room(
    run: tuple[str, ...],
    overrides: tuple[str, ...],
    tp: str,
    says: str,
    fixes: list[tuple[str, ...]],
    compose_run: Callable[..., RunConfig],
) -> None:
    """Decoupled, the rollout's devices leave training fewer than one model replica, on
    hardware that holds one: the fix is to colocate or move devices to training, not the
    larger hardware profile it named before."""
    with pytest.raises(UserError) as info:
        build_plan(compose_run(*run, *overrides, tp))
    (issue,) = [i for i in info.value.issues if i.key == "layout.train.num_gpus"]
    assert says in issue.fix, issue.fix
    assert "hardware profile" not in issue.fix, issue.fix
    for fix in fixes:
        build_plan(compose_run(*run, *overrides, tp, *fix))  # each fix it names plans


def test_uneven_stages_given_to_the_torch_trainer_are_refused_as_its_own_not_as_a_pp_to_raise(
    compose_run: Callable[..., RunConfig],
) -> None:
    """trainer.backend=torch has no pipeline stages: told to raise layout.train.pp, the user
    would meet its data-parallel-only refusal next. Under auto, pp >= 2 makes the trainer
    megatron's, and that stays the fix."""
    given = ("model=qwen3-8b", "recipe=grpo_dapo", "hardware=h100x8")
    stage = "layout.train.num_layers_in_first_pipeline_stage"
    with pytest.raises(UserError) as info:
        build_plan(compose_run(*given, "trainer.backend=torch", f"{stage}=10"))
    (issue,) = info.value.issues
    assert issue.key == stage and "trainer.backend is torch: it would be ignored" in issue.message
    assert issue.fix.startswith("remove it (the torch trainer has no pipeline stages")
    assert issue.fix.endswith("or set trainer.backend=megatron with layout.train.pp >= 2")
    with pytest.raises(UserError) as info:
        build_plan(compose_run(*given, f"{stage}=10"))
    (issue,) = info.value.issues
    assert issue.key == stage and issue.fix == "remove it, or set layout.train.pp >= 2"
    plan = build_plan(compose_run(*given, f"{stage}=10", "layout.train.pp=2"))
    assert plan.trainer_backend == "megatron"
