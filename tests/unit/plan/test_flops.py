"""One definition of model FLOPs and MFU, and the plan's training prediction built from it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rlpost.plan import build_plan
from rlpost.plan.cost import DENSE_MFU, RECOMPUTE_TIME, train_time
from rlpost.plan.flops import attention_width, forward_flops, matmul_params, mfu
from rlpost.plan.params import count_params
from rlpost.schema import ModelConfig, RunConfig

Models = Callable[[str], ModelConfig]
Runs = Callable[..., RunConfig]


def test_qwen3_0_6b_forward_counts_its_wide_attention_and_the_tied_head(
    model_config: Models,
) -> None:
    model = model_config("qwen3-0.6b")
    assert attention_width(model) == 16 * 128 == 2 * model.hidden_size
    # the decoder layers and the output projection; the tied embedding is a lookup
    assert matmul_params(model) == count_params(model).layers + 151936 * 1024
    # the figure benchmarks/megatron_train.py printed on the GPU: 2.1316 GFLOP a token
    assert forward_flops(model).per_token(4096) == pytest.approx(2.1316e9, rel=1e-4)


def test_moe_counts_active_experts_and_mla_the_mean_head_width(model_config: Models) -> None:
    model = model_config("glm4.7-flash")
    params = count_params(model)
    assert model.mla is not None and model.moe is not None
    assert matmul_params(model) < params.layers  # experts at top_k only
    mla = model.mla
    width = model.num_attention_heads * (mla.qk_head_dim + mla.qk_pos_emb_head_dim + mla.v_head_dim)
    assert attention_width(model) == width / 2


def test_flops_over_samples_and_mfu() -> None:
    from rlpost.plan.flops import ForwardFlops

    flops = ForwardFlops(matmul=10.0, attention=1.0)
    # 3 forwards over a 2-token and a 4-token sample: 3 (2 (10 + 2) + 4 (10 + 4))
    assert flops.over([2, 4], 3.0) == 3 * (24 + 56)
    assert mfu(989e12 * 0.25 * 4 * 2.0, 2.0, 4, 989) == pytest.approx(0.25)


def test_cost_charges_recompute_as_work_at_the_measured_mfu(run_config: Runs) -> None:
    """The cost model's compute is the TrainWork's passes at DENSE_MFU, full recompute's
    forward at the RECOMPUTE_TIME measured of one: (3 + 0.35) / 3 of none, where its FLOPs are
    4/3."""
    times = {}
    for recompute in ("none", "full"):
        cfg = run_config("qwen3-4b", "h100x8", layout__train__recompute__granularity=recompute)
        plan = build_plan(cfg)
        work = plan.work
        passes = work.passes_per_rollout - work.recompute_passes * (1 - RECOMPUTE_TIME)
        seconds = (work.train_tflop_per_rollout * passes / work.passes_per_rollout) / (
            plan.placement.train_gpus * cfg.hardware.peak_bf16_tflops * DENSE_MFU
        )
        timing = train_time(
            cfg, plan.parallel, plan.batch, plan.work, plan.memory.train, plan.placement.train_gpus
        )
        assert timing.compute_s == pytest.approx(seconds)
        times[recompute] = timing.compute_s
    full_over_none = (3 + RECOMPUTE_TIME) / 3  # the train passes, no extra forwards here
    assert plan.work.passes_per_rollout == pytest.approx(3 + 1)
    assert times["full"] / times["none"] == pytest.approx(full_over_none)


def test_plan_predicts_what_the_allocator_and_the_clock_see(run_config: Runs) -> None:
    """The prediction the trainers log against: the estimate less its overhead term (the
    CUDA context and workspaces), and the cost model's training seconds."""
    cfg = run_config("qwen3-4b", "h100x8")
    plan = build_plan(cfg)
    mem, prediction = plan.memory.train, plan.prediction
    assert mem.overhead_gib > 0
    assert prediction.memory_gib == pytest.approx(mem.total_gib - mem.overhead_gib)
    timing = train_time(cfg, plan.parallel, plan.batch, plan.work, mem, plan.placement.train_gpus)
    assert prediction.train_s == pytest.approx(timing.total_s)
    assert prediction.peak_tflops == 989
    assert prediction.flops == forward_flops(cfg.model)
    assert plan.to_dict()["prediction"]["train_s"] == round(timing.total_s, 3)
