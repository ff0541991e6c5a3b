"""The torch trainer planned on GPUs: FSDP2's per-GPU memory, its refusals, and layout=auto.

Every memory figure is checked against a count made here from the model's config facts
(parameters x bytes / shards), not against the planner's own functions.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import replace

import pytest

from rlpost.errors import UserError
from rlpost.plan import Plan, build_plan, plan_config
from rlpost.plan.cost import RECOMPUTE_TIME, TrainTime, rollout_time, train_time
from rlpost.plan.engine_memory import GIB
from rlpost.plan.fsdp import FsdpOptions, FsdpTrainMemory, estimate_fsdp_train
from rlpost.plan.layout import Sizes
from rlpost.plan.memory import estimate_host
from rlpost.plan.params import count_params
from rlpost.plan.render import render_plan
from rlpost.plan.split_options import LEANER_WITHIN
from rlpost.schema import ModelConfig, RunConfig
from rlpost.schema.layout import TrainLayout

ComposeRun = Callable[..., RunConfig]

H100X8 = ("recipe=grpo_dapo", "hardware=h100x8")
# Mistral-7B-v0.3's config.json facts, on a model group without a shipped h100x8 layout
MISTRAL = (
    "model=llama3.1-8b",
    "model.name=mistral-7b",
    "model.family=generic",
    "model.hf_architecture=MistralForCausalLM",
    "model.vocab_size=32768",
    "model.max_position_embeddings=32768",
    "model.rotary_base=1000000",
    "model.rope_scaling=null",
    *H100X8,
)
QWEN3 = ("model=qwen3-8b", "trainer.backend=torch", *H100X8)
KL_IN_LOSS = "recipe.algo.kl_loss_coef=0.001"  # the reference model runs every rollout
TWO_NODES = (*MISTRAL[:-1], "hardware=h100x16", "layout=auto")
SLOW_NETWORK = "hardware.inter_node_gbps=5"  # a tenth of the profile's


def hand_params(m: ModelConfig) -> tuple[int, int, int]:
    """(all, root, one layer) of a llama-shaped decoder, from its config facts."""
    h, hd = m.hidden_size, m.kv_channels
    assert hd is not None
    attention = h * m.num_attention_heads * hd * 2 + h * m.num_query_groups * hd * 2
    mlp = 3 * h * m.ffn_hidden_size  # gate, up, down
    norms = 2 * h + (2 * hd if m.qk_layernorm else 0)
    layer = attention + mlp + norms
    root = m.vocab_size * h * (1 if m.tie_word_embeddings else 2) + h
    return root + m.num_layers * layer, root, layer


@pytest.mark.parametrize("overrides", [MISTRAL, QWEN3], ids=["mistral-generic", "qwen3-8b"])
def test_a_model_plans_with_torch_fsdp2_on_eight_gpus(
    compose_run: ComposeRun, overrides: tuple[str, ...]
) -> None:
    cfg = compose_run(*overrides, KL_IN_LOSS)
    plan = build_plan(cfg)
    par, t = plan.parallel, plan.memory.train
    assert plan.trainer_backend == "torch" and isinstance(t, FsdpTrainMemory)
    assert (par.tp, par.pp, par.cp, par.ep, par.dp) == (1, 1, 1, 1, 8)
    params, root, layer = hand_params(cfg.model)
    assert plan.memory.params_total == params
    shard = params / 8
    # float32 master, gradients and two Adam moments, each 1/8 of the model
    assert t.weights_gib == pytest.approx(4 * shard / GIB)
    assert t.grads_gib == pytest.approx(4 * shard / GIB)
    assert t.optimizer_gib == pytest.approx(8 * shard / GIB)
    assert t.reference_gib == pytest.approx(2 * shard / GIB)  # a bf16 no-grad shard
    # bf16 root and two layers gathered, one layer's bf16 gradients and their fp32 copy
    assert t.gathered_gib == pytest.approx((2 * root + 2 * 2 * layer + (2 + 4) * layer) / GIB)
    assert plan.memory.train_fits and "FSDP2" in " ".join(plan.notes)


def test_full_recompute_keeps_each_layers_input_and_one_layer(compose_run: ComposeRun) -> None:
    cfg = compose_run(*MISTRAL)
    full = build_plan(cfg)
    par = full.parallel
    none = estimate_fsdp_train(cfg, replace(par, recompute="none"), colocate=True)
    m, tokens = cfg.model, full.memory.train.tokens_per_gpu
    inputs = m.num_layers * tokens * m.hidden_size * 2  # bf16
    one_layer = none.activations_gib * GIB / m.num_layers  # every layer alike
    assert full.memory.train.activations_gib * GIB == pytest.approx(inputs + one_layer)


def test_cpu_offload_moves_the_shards_and_reference_to_the_host(compose_run: ComposeRun) -> None:
    cfg = compose_run(*MISTRAL, KL_IN_LOSS)
    plan = build_plan(cfg)
    on_gpu = plan.memory.train
    offload = estimate_fsdp_train(cfg, plan.parallel, True, options=FsdpOptions(cpu_offload=True))
    params, _, _ = hand_params(cfg.model)
    state, reference = 16 * params / 8 / GIB, 2 * params / 8 / GIB
    assert offload.weights_gib == offload.grads_gib == offload.optimizer_gib == 0.0
    assert offload.reference_gib == 0.0
    assert on_gpu.total_gib - offload.total_gib == pytest.approx(state + reference)
    p = plan.placement
    sizes = Sizes(p.colocate, p.total_gpus, p.train_gpus, p.rollout_gpus)
    host = estimate_host(cfg.model, cfg.recipe, cfg.hardware, offload, sizes)
    assert host.optimizer_gib == pytest.approx(8 * (state + reference))  # 8 ranks on the node
    assert host.reference_weights_gib == 0.0  # counted with the shards, not twice


@pytest.mark.skipif(
    "fsdp" not in TrainLayout.model_fields, reason="layout.train.fsdp is not in the schema yet"
)
def test_the_fsdp_layout_keys_reach_the_plan(compose_run: ComposeRun) -> None:
    base = build_plan(compose_run(*MISTRAL)).memory.train
    offload = build_plan(compose_run(*MISTRAL, "layout.train.fsdp.cpu_offload=true")).memory.train
    assert isinstance(offload, FsdpTrainMemory) and offload.cpu_offload
    assert offload.total_gib < base.total_gib and offload.host_optimizer_gib > 0
    hsdp = build_plan(compose_run(*MISTRAL, "layout.train.fsdp.shard_group_size=4")).memory.train
    assert isinstance(hsdp, FsdpTrainMemory) and hsdp.shards == 4
    assert hsdp.optimizer_gib == pytest.approx(2 * base.optimizer_gib)


# a 70B-shaped generic model: its float32 shards alone (16 bytes x 70B / 8) exceed an H100
BIG = (
    *MISTRAL,
    "model.name=big",
    "model.hidden_size=8192",
    "model.num_layers=80",
    "model.num_attention_heads=64",
    "model.ffn_hidden_size=28672",
)


@pytest.mark.parametrize(
    ("overrides", "remedy"),
    [
        (BIG, "layout.train.fsdp.cpu_offload: true"),
        (
            (
                *QWEN3,
                "layout.train.recompute.granularity=none",
                "recipe.train.max_tokens_per_gpu=32768",
            ),
            "layout.train.recompute.granularity: full",
        ),
    ],
    ids=["shards-too-large", "activations-too-large"],
)
def test_a_model_that_does_not_fit_is_refused_with_a_remedy_that_fits(
    compose_run: ComposeRun, overrides: tuple[str, ...], remedy: str
) -> None:
    cfg = compose_run(*overrides)
    with pytest.raises(UserError) as caught:
        build_plan(cfg)
    (issue,) = caught.value.issues
    assert issue.key == "layout.train" and "torch trainer (FSDP2 over 8 GPUs" in issue.message
    assert remedy in issue.fix
    needed = float(issue.message.split("needs ")[1].split(" GiB")[0])
    assert needed > cfg.hardware.gpu_memory_gib
    claimed = float(issue.fix.split(remedy + " (")[1].split(" GiB")[0])
    assert claimed <= cfg.hardware.gpu_memory_gib


def test_a_derived_torch_layout_that_does_not_fit_names_megatrons_split_for_a_shipped_family(
    compose_run: ComposeRun,
) -> None:
    """qwen3-8b with 262,144-token micro-batches on 8 H100s: FSDP2 cannot shrink the
    activations, megatron-core's tp=4 does (its estimate fits, and the plan then does); a
    generic model of the same shape is not told of megatron."""
    long = ("model=qwen3-8b", "hardware=h100x8", "recipe.train.max_tokens_per_gpu=262144")
    with pytest.raises(UserError) as caught:
        build_plan(compose_run(*long, "trainer.backend=torch"))
    (issue,) = caught.value.issues
    assert "torch trainer (FSDP2 over 8 GPUs" in issue.message
    assert "; trainer.backend=megatron with layout.train.tp=4 (" in issue.fix
    assert "layout.train.dp" not in issue.fix  # derived, it follows tp
    plan = build_plan(compose_run(*long, "trainer.backend=megatron", "layout.train.tp=4"))
    assert plan.trainer_backend == "megatron" and plan.memory.train_fits
    generic = ("model.family=generic", "model.hf_architecture=Qwen3ForCausalLM")
    with pytest.raises(UserError) as caught:
        build_plan(compose_run(*long, *generic))
    (issue,) = caught.value.issues
    assert "torch trainer (FSDP2" in issue.message and "megatron" not in issue.fix


LONG_QWEN3 = ("model=qwen3-8b", "hardware=h100x8", "recipe.train.max_tokens_per_gpu=262144")
LONG_MOE = ("model=qwen3-30b-a3b", "hardware=h100x8", "recipe.train.max_tokens_per_gpu=65536")
MEGATRON_REMEDY = re.compile(r"trainer\.backend=megatron(?: with (.+?))? \((\d+\.\d) GiB")


@pytest.mark.parametrize(
    "overrides",
    [
        (*LONG_QWEN3, "layout.train.num_layers_in_last_pipeline_stage=10"),
        (*LONG_QWEN3, "layout.train.pp=2", "layout.train.num_layers_in_first_pipeline_stage=10"),
        (*LONG_MOE, "layout.train.ep=2"),
        (*LONG_MOE, "layout.train.ep=2", "layout.train.pp=2"),
    ],
    ids=["last-stage", "pp-and-first-stage", "ep", "ep-and-pp"],
)
def test_the_megatron_remedy_a_torch_layout_names_is_the_plan_its_settings_then_make(
    compose_run: ComposeRun, overrides: tuple[str, ...]
) -> None:
    """The torch trainer's refusal names megatron-core's split with the GiB it needs; the
    layout's own settings that megatron reads (sizes, uneven pipeline stages) stay when the
    user takes it: the split named keeps them where they are valid and names what differs,
    and the plan then fits at the GiB named."""
    with pytest.raises(UserError) as caught:
        build_plan(compose_run(*overrides, "trainer.backend=torch"))
    (issue,) = [i for i in caught.value.issues if i.key == "layout.train"]
    found = MEGATRON_REMEDY.search(issue.fix)
    assert found is not None, issue.fix
    keys = re.split(r", | and ", found[1]) if found[1] else []
    named = float(found[2])
    plan = build_plan(compose_run(*overrides, "trainer.backend=megatron", *keys))
    assert plan.trainer_backend == "megatron" and plan.memory.train_fits
    assert round(plan.memory.train.total_gib, 1) == named
    train = compose_run(*overrides).layout.train
    stages = (train.num_layers_in_first_pipeline_stage, train.num_layers_in_last_pipeline_stage)
    par = plan.parallel
    assert (par.num_layers_in_first_pipeline_stage, par.num_layers_in_last_pipeline_stage) == (
        stages
    )


def test_layout_auto_picks_a_fitting_torch_layout(compose_run: ComposeRun) -> None:
    cfg, plan = plan_config(compose_run(*MISTRAL, "layout=auto"))
    assert plan.trainer_backend == "torch" and plan.memory.train_fits
    assert plan.search is not None and plan.search.chosen is not None
    assert all(c.parallel.tp == c.parallel.pp == c.parallel.cp == 1 for c in plan.search.ranked)
    assert plan.search.chosen.describe().split("; ")[1].startswith("torch FSDP2 DP")
    assert cfg.layout.train.tp == 1


def test_layout_autos_remedies_fit_within_the_margin_it_keeps_free(
    compose_run: ComposeRun,
) -> None:
    """layout=auto accepts a layout that leaves MARGIN_FRACTION of the GPU free: a remedy it
    names is tried on that budget, not the whole GPU. On 70.9 GiB GPUs (67.4 usable),
    offloading with 131,072-token micro-batches needs 67.4 GiB, and the search refuses it;
    with 130,560 (the longest that fits, in steps of 512) it accepts it."""
    given = (
        "model=qwen3-8b",
        "model.family=generic",
        "model.hf_architecture=Qwen3ForCausalLM",
        *H100X8,
        "hardware.gpu_memory_gib=70.9",
        "recipe.train.max_tokens_per_gpu=262144",
        "layout=auto",
    )
    with pytest.raises(UserError) as info:
        plan_config(compose_run(*given))
    (issue,) = info.value.issues
    offload = "layout.train.fsdp.cpu_offload"
    assert (
        f"{offload}: true and recipe.train.max_tokens_per_gpu=130560 together fit (" in issue.fix
    ), issue.fix
    assert "max_tokens_per_gpu=131072" not in issue.fix
    tokens = "recipe.train.max_tokens_per_gpu"
    with pytest.raises(UserError):
        plan_config(compose_run(*given, f"{offload}=true", f"{tokens}=131072"))
    _, plan = plan_config(compose_run(*given, f"{offload}=true", f"{tokens}=130560"))
    assert plan.memory.train_fits


@pytest.mark.skipif(
    "fsdp" not in TrainLayout.model_fields, reason="layout.train.fsdp is not in the schema yet"
)
def test_layout_auto_offloads_the_shards_of_a_model_that_fits_no_other_way(
    compose_run: ComposeRun,
) -> None:
    cfg, plan = plan_config(compose_run(*BIG, "layout=auto"))
    assert plan.search is not None and plan.search.chosen is not None
    assert "FSDP2 CPU offload" in plan.search.chosen.describe()
    assert cfg.layout.train.fsdp.cpu_offload and plan.memory.train_fits  # type: ignore[attr-defined]
    assert "layout.train.fsdp.cpu_offload" in plan.derived


def test_layout_auto_keeps_layers_gathered_only_where_it_pays(compose_run: ComposeRun) -> None:
    """With reshard_after_forward left null the search tries both: where the layers' compute
    hides the saved all-gather (one node, NVLink) the layout that reshards is chosen and the
    other rejected with its gain and memory; with the shards spread over two nodes joined by
    a slow link, keeping the layers gathered pays and is chosen, written into the config as a
    derived key. Set, it is not searched."""
    cfg, plan = plan_config(compose_run(*MISTRAL, "layout=auto"))
    search = plan.search
    assert search is not None and search.chosen is not None
    assert search.chosen.train.reshard is True and cfg.layout.train.fsdp.reshard_after_forward
    (kept,) = [r for r in search.rejected if "layers kept gathered" in r.description]
    assert "faster than the same layout resharding after the forward" in kept.reason
    gain = float(kept.reason.split("trains ")[1].split("%")[0]) / 100
    assert gain < LEANER_WITHIN
    assert "layout.train.fsdp.reshard_after_forward" in plan.derived

    across = (*TWO_NODES, SLOW_NETWORK, "layout.train.fsdp.shard_group_size=16")
    cfg, plan = plan_config(compose_run(*across))
    assert plan.search is not None and plan.search.chosen is not None
    assert plan.search.chosen.train.reshard is False
    assert cfg.layout.train.fsdp.reshard_after_forward is False
    assert "layout.train.fsdp.reshard_after_forward" in plan.derived
    t = plan.memory.train
    assert isinstance(t, FsdpTrainMemory) and not t.reshard_after_forward and t.shards == 16

    _, plan = plan_config(compose_run(*across, "layout.train.fsdp.reshard_after_forward=true"))
    assert plan.search is not None
    assert {c.train.reshard for c in plan.search.ranked} == {True}
    assert "layout.train.fsdp.reshard_after_forward" not in plan.derived


def shard_groups(plan: Plan) -> set[int]:
    assert plan.search is not None
    return {c.train.fsdp.shards(16) for c in plan.search.ranked if c.train.fsdp is not None}


def test_layout_auto_shards_within_each_node_where_the_network_is_the_bottleneck(
    compose_run: ComposeRun,
) -> None:
    """With shard_group_size left null and the DP ranks on two nodes, the search tries
    sharding over all 16 and within each node (HSDP). Over h100x16's network the layers'
    compute hides the gathers, and HSDP's 8x larger shards are not worth it (rejected with
    its gain); over a slow one HSDP keeps the gathers on NVLink, is chosen and written in."""
    cfg, plan = plan_config(compose_run(*TWO_NODES))
    assert plan.search is not None and plan.search.chosen is not None
    assert cfg.layout.train.fsdp.shard_group_size is None and shard_groups(plan) == {16}
    (hsdp,) = [
        r for r in plan.search.rejected
        if "(shards of 8)" in r.description and "kept" not in r.description
    ]  # fmt: skip
    assert "faster than the same layout sharded over all DP ranks" in hsdp.reason

    cfg, plan = plan_config(compose_run(*TWO_NODES, SLOW_NETWORK))
    assert plan.search is not None and plan.search.chosen is not None
    assert cfg.layout.train.fsdp.shard_group_size == 8
    assert "layout.train.fsdp.shard_group_size" in plan.derived
    t = plan.memory.train
    assert isinstance(t, FsdpTrainMemory) and t.shards == 8
    pinned = (*TWO_NODES, SLOW_NETWORK, "layout.train.fsdp.shard_group_size=16")
    everyone = plan_config(compose_run(*pinned))[1]
    assert everyone.search is not None and everyone.search.chosen is not None
    assert plan.search.chosen.step_s < everyone.search.chosen.step_s
    assert shard_groups(everyone) == {16}


def test_megatron_settings_on_the_torch_trainer_are_refused(compose_run: ComposeRun) -> None:
    with pytest.raises(UserError) as caught:
        build_plan(compose_run(*QWEN3, "recipe.optim.cpu_offload=true"))
    (issue,) = caught.value.issues
    assert issue.key == "recipe.optim.cpu_offload" and "ignored" in issue.message
    assert "layout.train.fsdp.cpu_offload: true" in issue.fix


def micro_pass_s(timing: TrainTime, micro: int) -> tuple[float, float]:
    """(forward, backward) of one micro-batch under full recompute and no no-grad forward:
    the rollout's compute is 3 passes and the recompute's forward at RECOMPUTE_TIME."""
    forward = timing.compute_s / (3 + RECOMPUTE_TIME) / micro
    return forward, forward * (2 + RECOMPUTE_TIME)


@pytest.mark.parametrize("gbps", [None, 5.0], ids=["nvlink", "slow-link"])
def test_fsdp_collectives_wait_only_where_they_outlast_the_layers_compute(
    compose_run: ComposeRun, gbps: float | None
) -> None:
    """FSDP2 gathers and reduce-scatters a layer at a time beside a neighbour's compute: on
    NVLink a 7B model's layers hide all but the first layer's gather of each pass and the last
    layer's reduce-scatter; over a slow link the step waits for the traffic less the compute
    it runs beside (plus those edges)."""
    slow = () if gbps is None else (f"hardware.intra_node_gbps={gbps}",)
    cfg = compose_run(*MISTRAL, *slow)
    plan = build_plan(cfg)
    timing = train_time(cfg, plan.parallel, plan.batch, plan.work, plan.memory.train, 8)
    params, _, _ = hand_params(cfg.model)
    layers = cfg.model.num_layers
    # one step of 256 samples over 8 ranks, 32 x 8192 tokens in 9216-token micro-batches;
    # full recompute runs inside the backward's gather, no no-grad forward (one step)
    micro = math.ceil(32 * 8192 / 9216)
    link = cfg.hardware.intra_node_gbps * 1e9
    gather, reduce = params * 2 * 7 / 8 / link, params * 4 * 7 / 8 / link  # bf16, fp32 rings
    forward, backward = micro_pass_s(timing, micro)
    edges = (2 * gather + reduce) / layers
    if gbps is None:
        assert gather < forward and gather + reduce < backward
        assert timing.dp_s == pytest.approx(micro * edges)
    else:
        assert gather > forward and gather + reduce > backward
        waits = 2 * gather + reduce - forward - backward
        assert timing.dp_s == pytest.approx(micro * (waits + edges))


def test_layers_kept_gathered_cost_the_whole_bf16_model_and_save_the_backwards_gathers(
    compose_run: ComposeRun,
) -> None:
    """`layout.train.fsdp.reshard_after_forward: false`: every GPU holds every layer's bf16
    parameters from the forward to the backward (the root and all layers, where the default
    holds the root and two), and each micro-batch all-gathers once instead of twice."""
    key = "layout.train.fsdp.reshard_after_forward=false"
    default = build_plan(compose_run(*MISTRAL))
    cfg = compose_run(*MISTRAL, key)
    kept = build_plan(cfg)
    t = kept.memory.train
    assert isinstance(t, FsdpTrainMemory) and not t.reshard_after_forward
    params, root, layer = hand_params(cfg.model)
    assert t.gathered_gib == pytest.approx((2 * params + (2 + 4) * layer) / GIB)
    assert t.total_gib - default.memory.train.total_gib == pytest.approx(
        2 * (params - root - 2 * layer) / GIB
    )
    timing = train_time(cfg, kept.parallel, kept.batch, kept.work, t, 8)
    micro = math.ceil(32 * 8192 / 9216)
    link = cfg.hardware.intra_node_gbps * 1e9
    gather, reduce = params * 2 * 7 / 8 / link, params * 4 * 7 / 8 / link
    # the forward's first gather and the backward's last reduce-scatter (no gather there)
    assert timing.dp_s == pytest.approx(micro * (gather + reduce) / cfg.model.num_layers)
    rows = render_plan(kept)
    assert "gathered: root, every layer" in rows and "layers kept gathered" in rows
    assert "gathered root and every layer" in " ".join(kept.notes)


def test_layers_kept_gathered_that_do_not_fit_are_refused_with_resharding_as_a_remedy(
    compose_run: ComposeRun,
) -> None:
    """A 70B-shaped model with its shards offloaded fits only while its layers are gathered
    one at a time: kept gathered (140 GB of bf16 parameters) it is refused, and the fix names
    reshard_after_forward: true with the memory that then fits."""
    offload = "layout.train.fsdp.cpu_offload=true"
    assert build_plan(compose_run(*BIG, offload)).memory.train_fits
    cfg = compose_run(*BIG, offload, "layout.train.fsdp.reshard_after_forward=false")
    with pytest.raises(UserError) as caught:
        build_plan(cfg)
    (issue,) = caught.value.issues
    remedy = "layout.train.fsdp.reshard_after_forward: true"
    assert remedy in issue.fix
    claimed = float(issue.fix.split(remedy + " (")[1].split(" GiB")[0])
    assert claimed <= cfg.hardware.gpu_memory_gib


def test_reshard_after_forward_is_refused_on_the_megatron_trainer(
    compose_run: ComposeRun,
) -> None:
    with pytest.raises(UserError) as caught:
        build_plan(
            compose_run("model=qwen3-8b", *H100X8, "layout.train.fsdp.reshard_after_forward=false")
        )
    (issue,) = caught.value.issues
    assert issue.key == "layout.train.fsdp.reshard_after_forward"


def test_hsdp_shards_within_groups_and_all_reduces_across_them(compose_run: ComposeRun) -> None:
    cfg = compose_run(*MISTRAL)
    plan = build_plan(cfg)
    hsdp = estimate_fsdp_train(cfg, plan.parallel, True, options=FsdpOptions(shard_group_size=4))
    params, _, _ = hand_params(cfg.model)
    assert hsdp.shards == 4 and hsdp.optimizer_gib == pytest.approx(8 * params / 4 / GIB)
    full = train_time(cfg, plan.parallel, plan.batch, plan.work, plan.memory.train, 8)
    grouped = train_time(cfg, plan.parallel, plan.batch, plan.work, hsdp, 8)
    micro = math.ceil(32 * 8192 / 9216)
    gbps = cfg.hardware.intra_node_gbps * 1e9
    gather, reduce = params * 2 * 3 / 4 / gbps, params * 4 * 3 / 4 / gbps  # rings of 4
    across = 2 * (params / 4 * 4) * 1 / 2 / gbps  # an all-reduce over 2 replicas
    # hidden behind the layers' compute but for the edges of each pass (NVLink, 7B)
    edges = (2 * gather + reduce + across) / cfg.model.num_layers
    assert grouped.dp_s == pytest.approx(micro * edges)
    assert full.optimizer_s < grouped.optimizer_s  # each rank steps twice the parameters


def test_a_generic_moe_model_gathers_whole_expert_layers_and_says_what_is_not_counted(
    compose_run: ComposeRun,
) -> None:
    moe = "model.moe={num_experts: 8, top_k: 2, expert_ffn_hidden_size: 1792}"
    cfg = compose_run(*MISTRAL, "model.hf_architecture=MixtralForCausalLM", moe)
    plan = build_plan(cfg)
    m, t = cfg.model, plan.memory.train
    assert isinstance(t, FsdpTrainMemory) and plan.parallel.ep == 1
    assert plan.parallel.moe_token_dispatcher_type is None  # megatron-core's, not run here
    h, hd = m.hidden_size, 128
    attention = h * 32 * hd * 2 + h * 8 * hd * 2
    layer = attention + 8 * h + 8 * 3 * h * 1792 + 2 * h  # router, 8 SwiGLU experts, norms
    root = 2 * m.vocab_size * h + h
    assert plan.memory.params_total == root + m.num_layers * layer
    assert t.gathered_gib == pytest.approx((2 * root + 4 * layer + 6 * layer) / GIB)
    (note,) = [n for n in plan.notes if "FSDP2" in n]
    assert "experts are all gathered" in note and "not counted" in note


@pytest.mark.parametrize("backend", ["torch", "megatron"])
def test_float32_trains_and_prefills_at_the_gpus_float32_peak(
    compose_run: ComposeRun, backend: str
) -> None:
    """model.params_dtype=fp32 on GPUs computes at 67 of the H200's 989 dense TFLOP/s (torch
    multiplies float32 without TF32), not at its bf16 peak."""
    one_gpu = ("model=qwen3-0.6b", "recipe=grpo_dapo", "hardware=h200x1")
    times = {}
    for dtype in ("bf16", "fp32"):
        cfg = compose_run(*one_gpu, f"trainer.backend={backend}", f"model.params_dtype={dtype}")
        plan = build_plan(cfg)
        train = train_time(cfg, plan.parallel, plan.batch, plan.work, plan.memory.train, 1)
        params = count_params(cfg.model)
        rollout = rollout_time(cfg, plan.engine, plan.memory.rollout, plan.batch, params)
        prefill = rollout.prefill_s
        times[dtype] = (train.compute_s, prefill)
    assert times["fp32"][0] == pytest.approx(times["bf16"][0] * 989 / 67)
    assert times["fp32"][1] == pytest.approx(times["bf16"][1] * 989 / 67)
