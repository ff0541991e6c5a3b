"""trainer.backend against the layout and the hardware, checked with the plan."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pydantic import ValidationError

from rlpost.errors import UserError
from rlpost.plan import build_plan, plan_config
from rlpost.plan.backends import resolve_trainer_backend
from rlpost.schema import RunConfig

ComposeRun = Callable[..., RunConfig]

TINY = ("model=qwen3-tiny", "recipe=grpo_tiny_math", "hardware=cpu")
QWEN = ("model=qwen3-4b", "recipe=grpo_dapo", "hardware=h100x8")  # a shipped layout, TP2
QWEN8 = ("model=qwen3-8b", "recipe=grpo_dapo", "hardware=h100x8")  # no shipped layout


@pytest.mark.parametrize(
    ("overrides", "backend"),
    [
        (TINY, "torch"),  # data parallel on CPU
        ((*TINY, "layout.train.tp=2"), "megatron"),  # the model is split
        (QWEN, "megatron"),  # GPUs
        ((*TINY, "trainer.backend=megatron"), "megatron"),
    ],
    ids=["cpu-dp", "cpu-tp2", "gpu", "explicit"],
)
def test_auto_picks_a_backend_that_can_train_the_layout(
    compose_run: ComposeRun, overrides: tuple[str, ...], backend: str
) -> None:
    cfg = compose_run(*overrides)
    plan = build_plan(cfg)
    assert resolve_trainer_backend(cfg, plan.parallel) == backend


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ((*TINY, "trainer.backend=torch", "layout.train.tp=2"), "data parallel only"),
        ((*QWEN, "trainer.backend=torch"), "data parallel only"),
    ],
    ids=["torch-tp2", "torch-tp2-on-gpus"],
)
def test_a_backend_that_cannot_train_the_layout_is_refused(
    compose_run: ComposeRun, overrides: tuple[str, ...], fragment: str
) -> None:
    with pytest.raises(UserError) as caught:
        build_plan(compose_run(*overrides))
    (issue,) = [i for i in caught.value.issues if fragment in i.message]
    assert issue.key == "trainer.backend" and "trainer.backend=megatron" in issue.fix


@pytest.mark.parametrize(
    ("overrides", "shown"),
    [
        ((*TINY, "layout.train.distributed_optimizer=false"), {"distributed_optimizer": False}),
        (
            ("model=qwen3-0.6b", "recipe=grpo_dapo", "hardware=h200x1", "layout=auto",
             "recipe.optim.cpu_offload=true", "recipe.optim.precision_aware_optimizer=true"),
            {"cpu_offload": True, "precision_aware_optimizer": True},
        ),
        (
            ("model=qwen3-30b-a3b", "recipe=grpo_dapo", "hardware=h100x8", "layout=auto",
             "++layout.train.moe_token_dispatcher_type=flex",
             "++layout.train.moe_enable_deepep=true"),
            {"moe_token_dispatcher_type": "flex", "moe_enable_deepep": True},
        ),
        # a dense model: the dense-model refusal alone names the key
        ((*TINY, "++layout.train.moe_token_dispatcher_type=alltoall"), {}),
    ],
    ids=["distributed-optimizer", "cpu-adam", "moe-dispatch", "dense-dispatch"],
)  # fmt: skip
def test_megatron_only_settings_are_refused_once_with_their_values(
    compose_run: ComposeRun, overrides: tuple[str, ...], shown: dict[str, object]
) -> None:
    with pytest.raises(UserError) as caught:
        build_plan(compose_run(*overrides, "trainer.backend=torch"))
    keys = [issue.key for issue in caught.value.issues]
    assert len(keys) == len(set(keys)), keys
    ignored = {
        i.key.rsplit(".", 1)[-1]: i.value for i in caught.value.issues if "be ignored" in i.message
    }
    assert ignored == shown


def test_following_the_data_parallel_refusals_fix_gives_a_plan(compose_run: ComposeRun) -> None:
    """The shipped qwen3-4b layout has TP2 with sequence parallelism: the refusal names both,
    so that one round of its fix plans."""
    with pytest.raises(UserError) as caught:
        build_plan(compose_run(*QWEN, "trainer.backend=torch"))
    (issue,) = [i for i in caught.value.issues if "data parallel only" in i.message]
    assert "layout.train.tp" in issue.fix and "sequence_parallel: false" in issue.fix
    assert "layout=auto" in issue.fix
    searched = build_plan(compose_run(*QWEN, "trainer.backend=torch", "layout=auto"))
    assert searched.trainer_backend == "torch" and searched.parallel.tp == 1
    plan = build_plan(
        compose_run(
            *QWEN, "trainer.backend=torch", "layout.train.tp=1",
            "layout.train.sequence_parallel=false",
        )
    )  # fmt: skip
    assert plan.parallel.dp == 8
    assert "remove layout.train.tp" in issue.fix


def test_full_recompute_on_the_torch_trainer_is_planned(compose_run: ComposeRun) -> None:
    """The torch trainer checkpoints decoder layers: every one, or the first few (block)."""
    for extra in (
        (),
        ("layout.train.recompute.method=block", "layout.train.recompute.num_layers=1"),
    ):
        plan = build_plan(compose_run(*TINY, "layout.train.recompute.granularity=full", *extra))
        assert plan.parallel.recompute == "full"


@pytest.mark.parametrize(
    ("overrides", "key", "fragment"),
    [
        (("layout.train.recompute.granularity=selective",), "granularity", "selective"),
        (
            ("layout.train.recompute.granularity=full", "layout.train.recompute.num_layers=2"),
            "num_layers",
            "groups of 2 layers",
        ),
    ],
    ids=["selective", "uniform-groups"],
)
def test_recompute_the_torch_trainer_cannot_express_is_refused(
    compose_run: ComposeRun, overrides: tuple[str, ...], key: str, fragment: str
) -> None:
    with pytest.raises(UserError) as caught:
        build_plan(compose_run(*TINY, *overrides))
    (issue,) = caught.value.issues
    assert issue.key == f"layout.train.recompute.{key}" and fragment in issue.message
    plan = build_plan(compose_run(*TINY, *overrides, "trainer.backend=megatron"))
    assert plan.parallel.recompute == overrides[0].rpartition("=")[2]


def test_fsdp_options_plan_for_the_torch_trainer(compose_run: ComposeRun) -> None:
    cfg = compose_run(*TINY, "layout.train.fsdp.shard_group_size=1")
    assert build_plan(cfg).parallel.dp == 2
    # on a CPU profile everything is in host memory already: FSDP2's CPU offload moves nothing
    with pytest.raises(ValidationError, match="already live in host memory"):
        compose_run(*TINY, "layout.train.fsdp.cpu_offload=true")


@pytest.mark.parametrize(
    ("overrides", "key", "fragment"),
    [
        (
            ("trainer.backend=megatron", "layout.train.fsdp.shard_group_size=1"),
            "shard_group_size",
            "would ignore it",
        ),
        (("layout.train.fsdp.shard_group_size=3",), "shard_group_size", "does not divide"),
    ],
    ids=["megatron", "not-a-divisor"],
)
def test_fsdp_options_the_run_would_not_honour_are_refused(
    compose_run: ComposeRun, overrides: tuple[str, ...], key: str, fragment: str
) -> None:
    with pytest.raises(UserError) as caught:
        build_plan(compose_run(*TINY, *overrides))
    (issue,) = caught.value.issues
    assert issue.key == f"layout.train.fsdp.{key}" and fragment in issue.message


GENERIC = ("model.family=generic", "model.hf_architecture=MistralForCausalLM")


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_a_generic_model_trains_with_the_torch_trainer_on_cpu(
    compose_run: ComposeRun, backend: str
) -> None:
    cfg = compose_run(*TINY, *GENERIC, f"trainer.backend={backend}")
    plan = build_plan(cfg)
    assert resolve_trainer_backend(cfg, plan.parallel) == "torch"
    (note,) = [n for n in plan.notes if "generic" in n]
    assert "MistralForCausalLM" in note and "can fall short" in note


def test_megatron_is_refused_for_a_generic_model(compose_run: ComposeRun) -> None:
    with pytest.raises(UserError) as caught:
        build_plan(compose_run(*TINY, *GENERIC, "trainer.backend=megatron"))
    (issue,) = caught.value.issues
    assert issue.key == "trainer.backend" and issue.value == "megatron"
    assert "no layer spec" in issue.message and "trainer.backend=torch" in issue.fix


@pytest.mark.parametrize("layout", [(), ("layout=auto",)], ids=["derived", "layout-search"])
def test_a_generic_model_on_gpus_trains_with_torch_and_megatron_is_refused(
    compose_run: ComposeRun, layout: tuple[str, ...]
) -> None:
    """The torch trainer is a GPU trainer: auto picks it for a generic model on GPUs, and
    megatron (no layer spec) is refused with one issue, the layout search included."""
    cfg, plan = plan_config(compose_run(*QWEN8, *layout, *GENERIC, "trainer.backend=auto"))
    assert plan.trainer_backend == resolve_trainer_backend(cfg, plan.parallel) == "torch"
    with pytest.raises(UserError) as caught:
        plan_config(compose_run(*QWEN8, *layout, *GENERIC, "trainer.backend=megatron"))
    (issue,) = caught.value.issues
    assert "no layer spec" in issue.message and "trainer.backend=torch" in issue.fix


def test_slime_arguments_for_a_generic_model_are_refused(compose_run: ComposeRun) -> None:
    with pytest.raises(ValueError, match="slime trains with megatron-core, which has no layer"):
        compose_run(*TINY, *GENERIC, "mode=slime_args")


def test_mtp_training_of_a_generic_model_is_refused(compose_run: ComposeRun) -> None:
    """The torch trainer, the only one that builds it, would train the main model alone."""
    generic_mtp = (*GENERIC, "model.mtp_num_layers=1", "recipe.train.mtp_training=true")
    with pytest.raises(ValueError, match="is family generic: only the torch trainer builds it"):
        compose_run(*TINY, *generic_mtp)


def test_fp16_is_refused_for_the_torch_trainer_and_bf16_or_fp32_plan(
    compose_run: ComposeRun,
) -> None:
    """The torch trainer has no loss scale; megatron's fp16 optimizer has one."""
    on_gpus = ("model=qwen3-0.6b", "recipe=grpo_dapo", "hardware=h200x1", "trainer.backend=torch")
    with pytest.raises(UserError) as caught:
        build_plan(compose_run(*on_gpus, "model.params_dtype=fp16"))
    (issue,) = caught.value.issues
    assert (issue.key, issue.value) == ("model.params_dtype", "fp16")
    assert "loss scale" in issue.message
    assert "model.params_dtype: bf16" in issue.fix and "trainer.backend=megatron" in issue.fix
    for dtype in ("bf16", "fp32"):
        plan = build_plan(compose_run(*on_gpus, f"model.params_dtype={dtype}"))
        assert plan.trainer_backend == "torch"
    megatron = compose_run(*on_gpus[:3], "trainer.backend=megatron", "model.params_dtype=fp16")
    assert build_plan(megatron).trainer_backend == "megatron"


def test_a_cpu_plan_says_its_trainers_compute_in_float32_whatever_params_dtype_says(
    compose_run: ComposeRun,
) -> None:
    def dtype_notes(*overrides: str) -> list[str]:
        return [n for n in build_plan(compose_run(*TINY, *overrides)).notes if "float32" in n]

    assert dtype_notes() == []  # qwen3-tiny ships fp32
    (note,) = dtype_notes("model.params_dtype=bf16")
    assert note.startswith("model.params_dtype=bf16 is for GPUs: on CPU the trainers")
    assert dtype_notes("model.params_dtype=bf16", "trainer.backend=megatron") == [note]


def _issues(key: str, cfg: RunConfig) -> list[str]:
    """The messages of the plan's refusals on `key`."""
    try:
        build_plan(cfg)
    except UserError as exc:
        return [i.message for i in exc.issues if i.key == key]
    return []


def _router_issues(cfg: RunConfig) -> list[str]:
    return _issues("model.moe.router_dtype", cfg)


def _grouped_issues(cfg: RunConfig) -> list[str]:
    return _issues("model.moe.grouped_gemm", cfg)


def test_bf16_routing_is_refused_where_the_gpu_trainer_would_route_otherwise(
    compose_run: ComposeRun,
) -> None:
    """Qwen3-MoE's transformers router computes in the layer's dtype, GLM-4.7-Flash's in
    float32 whatever it is told; megatron routes in params_dtype unless told fp32."""
    bf16 = "model.moe.router_dtype=bf16"
    qwen = ("model=qwen3-30b-a3b", "recipe=grpo_dapo", "hardware=h100x8")
    flash = ("model=glm4.7-flash", "recipe=grpo_dapo", "hardware=h100x8")
    assert _router_issues(compose_run(*qwen, "trainer.backend=torch", bf16)) == []
    assert _router_issues(compose_run(*qwen, "trainer.backend=megatron", bf16)) == []
    (torch_issue,) = _router_issues(compose_run(*flash, "trainer.backend=torch", bf16))
    assert "Glm4MoeLiteForCausalLM router, which computes in float32" in torch_issue
    fp32 = compose_run(*qwen, "trainer.backend=megatron", bf16, "model.params_dtype=fp32")
    (megatron_issue,) = _router_issues(fp32)
    assert "model.params_dtype is fp32" in megatron_issue
    assert _router_issues(compose_run(*flash, "trainer.backend=torch")) == []  # fp32 routing
    cpu = compose_run(*flash[:2], "hardware=cpu", "trainer.backend=torch", bf16)
    assert _router_issues(cpu) == []  # float32 throughout there, as the plan says


def test_architectures_megatron_would_compute_differently_are_refused_before_the_run(
    compose_run: ComposeRun,
) -> None:
    """Refused by the plan, each naming its key and the torch trainer as the way out (before,
    the megatron trainer refused them as it was built, after Ray and the engines started)."""
    qwen = ("model=qwen3-4b", "recipe=grpo_dapo", "hardware=h100x8")
    with pytest.raises(UserError) as caught:
        build_plan(compose_run(*qwen, "model.activation=gelu"))
    (issue,) = caught.value.issues
    assert (issue.key, issue.value) == ("model.activation", "gelu")
    assert "SwiGLU" in issue.message and "trainer.backend=torch" in issue.fix
    moe = ("model=qwen3-30b-a3b", "recipe=grpo_dapo", "hardware=h100x8")
    sigmoid = ("model.moe.router_score=sigmoid", "model.moe.norm_topk_prob=false")
    with pytest.raises(UserError) as caught:
        build_plan(compose_run(*moe, *sigmoid))
    assert [i.key for i in caught.value.issues] == ["model.moe.norm_topk_prob"]
    flash = ("model=glm4.7-flash", "recipe=grpo_dapo", "hardware=h100x8")
    llama3 = (
        "+model.rope_scaling={type: llama3, factor: 8.0, original_max_position_embeddings: 8192}"
    )
    with pytest.raises(UserError) as caught:
        build_plan(compose_run(*flash, llama3))
    assert "YaRN only" in next(
        i.message for i in caught.value.issues if i.key == "model.rope_scaling.type"
    )


def test_scaled_rope_models_plan_with_megatron(compose_run: ComposeRun) -> None:
    """Llama 3.1's RoPE scaling on rlpost's rotary table, DeepSeek-V3's YaRN in megatron-core's
    multi-latent attention (test_parity checks both against transformers)."""
    from rlpost.backends.megatron.config import transformer_config
    from rlpost.plan.layout import ParallelLayout

    llama = compose_run("model=llama3.1-8b", "recipe=grpo_dapo", "hardware=h100x8")
    assert llama.model.rope_scaling is not None
    assert build_plan(llama).trainer_backend == "megatron"
    deepseek = compose_run("model=deepseek-v3", "recipe=grpo_dapo", "hardware=h100x8").model
    assert deepseek.rope_scaling is not None
    config = transformer_config(deepseek, ParallelLayout.single_process(), on_gpu=True)
    assert (config.rope_type, config.rotary_scaling_factor) == ("yarn", 40.0)
    assert config.original_max_position_embeddings == 4096


@pytest.mark.parametrize("backend", ["megatron", "torch"])
def test_grouped_experts_are_refused_where_torchs_grouped_gemm_cannot_run_as_asked(
    compose_run: ComposeRun, backend: str
) -> None:
    """Both trainers' grouped experts call torch's grouped GEMM: bf16 only on CUDA, rows every
    16 bytes."""
    moe = (
        "model=qwen3-30b-a3b",
        "recipe=grpo_dapo",
        "hardware=h100x8",
        f"trainer.backend={backend}",
    )
    off = "model.moe.grouped_gemm=false"
    assert _grouped_issues(compose_run(*moe)) == []
    (fp32,) = _grouped_issues(compose_run(*moe, "model.params_dtype=fp32"))
    assert "bf16 only, and model.params_dtype is fp32" in fp32
    assert _grouped_issues(compose_run(*moe, "model.params_dtype=fp32", off)) == []
    odd = "model.moe.expert_ffn_hidden_size=764"  # 4 mod 8
    (rows,) = _grouped_issues(compose_run(*moe, odd))
    assert "the expert FFN per rank 764 is not" in rows and "multiples of 8" in rows
    assert _grouped_issues(compose_run(*moe, odd, off)) == []
    cpu = ("model=qwen3-30b-a3b", "recipe=grpo_dapo", "hardware=cpu", f"trainer.backend={backend}")
    assert _grouped_issues(compose_run(*cpu, odd)) == []  # float32 there: multiples of 4


def test_megatrons_grouped_experts_refuse_biases(compose_run: ComposeRun) -> None:
    moe = ("model=qwen3-30b-a3b", "recipe=grpo_dapo", "hardware=h100x8")
    (issue,) = _grouped_issues(compose_run(*moe, "model.add_bias_linear=true"))
    assert "have no biases" in issue
    bias = ("model.add_bias_linear=true", "model.moe.grouped_gemm=false")
    assert _grouped_issues(compose_run(*moe, *bias)) == []
    assert (
        _grouped_issues(compose_run(*moe, "model.add_bias_linear=true", "trainer.backend=torch"))
        == []
    )
