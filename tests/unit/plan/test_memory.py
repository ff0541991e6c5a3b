"""Memory formulas: bytes per parameter, sharding, activations, KV cache, SGLang fractions."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rlpost.plan import Plan, build_plan
from rlpost.plan.engine_memory import (
    GIB,
    TRAINER_RESIDUAL_GIB,
    default_mem_fraction,
    estimate_rollout,
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    longest_request,
)
from rlpost.plan.layout import ParallelLayout
from rlpost.plan.memory import LOGPROB_CHUNK_BYTES, estimate_train, train_tokens_per_gpu
from rlpost.plan.params import count_params
from rlpost.schema import ModelConfig, RunConfig

Models = Callable[[str], ModelConfig]
Runs = Callable[..., RunConfig]


def layout(**changes: object) -> ParallelLayout:
    base: dict[str, object] = {"recompute": "full", "distributed_optimizer": True}
    return ParallelLayout.single_process(**(base | changes))


def state_bytes_per_param(run: RunConfig, par: ParallelLayout) -> float:
    mem = estimate_train(run.model, run.recipe, run.hardware, par, colocate=False)
    return (mem.weights_gib + mem.grads_gib + mem.optimizer_gib) * GIB / mem.params_per_gpu


def test_mixed_precision_adam_is_18_bytes_per_param(run_config: Runs) -> None:
    run = run_config("qwen3-4b", "h200x1", layout=False)
    assert state_bytes_per_param(run, layout(distributed_optimizer=False)) == pytest.approx(18)


@pytest.mark.parametrize(("dp", "cp"), [(1, 1), (4, 1), (8, 1), (2, 2)])
def test_distributed_optimizer_is_6_plus_12_over_dp(run_config: Runs, dp: int, cp: int) -> None:
    run = run_config("qwen3-4b", "h100x8", layout=False)
    expected = 6 + 12 / (dp * cp)  # Megatron shards over the DP x CP group
    assert state_bytes_per_param(run, layout(dp=dp, cp=cp)) == pytest.approx(expected)


def test_cpu_offload_keeps_6_bytes_on_gpu_and_16_on_host(run_config: Runs) -> None:
    run = run_config("qwen3-4b", "h100x8", layout=False, recipe__optim__cpu_offload=True)
    par = layout(dp=4)
    mem = estimate_train(run.model, run.recipe, run.hardware, par, colocate=False)
    assert state_bytes_per_param(run, par) == pytest.approx(6)
    assert mem.host_optimizer_gib * GIB / mem.params_per_gpu == pytest.approx(16 / 4)


def test_fp32_model_needs_no_master_copy(run_config: Runs) -> None:
    run = run_config("qwen3-tiny", "cpu", "grpo_tiny_math")
    par = layout(distributed_optimizer=False, recompute="none")
    assert state_bytes_per_param(run, par) == pytest.approx(16)


def test_experts_shard_by_ep_and_optimizer_by_expert_dp(run_config: Runs) -> None:
    run = run_config("glm4.7-flash", "h100x8", layout=False)
    counts = count_params(run.model)
    mem = estimate_train(run.model, run.recipe, run.hardware, layout(ep=8, dp=8), False)
    dense_per_gpu = counts.dense
    experts_per_gpu = counts.experts / 8
    assert mem.params_per_gpu == pytest.approx(dense_per_gpu + experts_per_gpu)
    # expert DP = 8 / (ep 8) = 1: expert optimizer state is not sharded
    expected = dense_per_gpu * 12 / 8 + experts_per_gpu * 12
    assert mem.optimizer_gib * GIB == pytest.approx(expected)


def test_tensor_parallel_halves_dense_weights(run_config: Runs) -> None:
    run = run_config("glm4-9b", "h100x8", layout=False)
    one = estimate_train(run.model, run.recipe, run.hardware, layout(), False)
    two = estimate_train(run.model, run.recipe, run.hardware, layout(tp=2), False)
    assert two.weights_gib == pytest.approx(one.weights_gib / 2)


def test_full_recompute_keeps_less_than_none(run_config: Runs) -> None:
    run = run_config("qwen3-4b", "h100x8", layout=False)
    full = estimate_train(run.model, run.recipe, run.hardware, layout(), False)
    none = estimate_train(run.model, run.recipe, run.hardware, layout(recompute="none"), False)
    assert full.activations_gib < none.activations_gib / 5
    # full recompute: one layer input per layer (2 bytes x hidden per token) + one live layer
    tokens, h = full.tokens_per_gpu, run.model.hidden_size
    kept = 36 * 2 * tokens * h / GIB
    assert kept < full.activations_gib < kept + none.activations_gib / 36 * 1.01


def test_sequence_parallel_splits_all_activations(run_config: Runs) -> None:
    run = run_config("qwen3-4b", "h100x8", layout=False)
    sp = estimate_train(
        run.model,
        run.recipe,
        run.hardware,
        layout(tp=2, sequence_parallel=True, recompute="none"),
        False,
    )
    no_sp = estimate_train(
        run.model, run.recipe, run.hardware, layout(tp=2, recompute="none"), False
    )
    one = estimate_train(run.model, run.recipe, run.hardware, layout(recompute="none"), False)
    # sequence parallelism splits every per-layer tensor, the norms' too; TP alone only the
    # attention and MLP interiors
    assert sp.activations_gib * 2 == pytest.approx(one.activations_gib)
    assert sp.activations_gib < no_sp.activations_gib < one.activations_gib


def test_output_side_is_the_log_prob_kernel_not_the_logits(run_config: Runs) -> None:
    """Hidden states (the final norm's input and the kernel's), three float32 chunks of
    logits, the output weight's gradient (bf16) and the hidden states' float32 gradient
    accumulator; never tokens x vocab."""
    run = run_config("qwen3-4b", "h100x8", layout=False)
    mem = estimate_train(run.model, run.recipe, run.hardware, layout(tp=2), False)
    tokens, h = mem.tokens_per_gpu, 2560
    expected = 2 * tokens * h * 2 + 3 * LOGPROB_CHUNK_BYTES + 2 * 151936 / 2 * h + 4 * tokens * h
    assert mem.logits_gib * GIB == pytest.approx(expected)
    assert mem.logits_gib * GIB < 151936 / 2 * tokens * 4


def test_pipeline_first_stage_holds_pp_micro_batches(run_config: Runs) -> None:
    run = run_config("glm4-9b", "h100x8", layout=False)
    one = estimate_train(run.model, run.recipe, run.hardware, layout(recompute="none"), False)
    four = estimate_train(
        run.model, run.recipe, run.hardware, layout(pp=4, recompute="none"), False
    )
    # 1F1B: stage 0 holds 4 micro-batches of 10 layers = the activations of all 40 layers
    first_stage = four if four.stage == 0 else None
    assert four.activations_gib <= one.activations_gib * 1.0001
    assert first_stage is None or first_stage.activations_gib == pytest.approx(one.activations_gib)


def test_tokens_per_gpu_covers_the_longest_sample(run_config: Runs) -> None:
    run = run_config("glm4-9b", "h100x8", recipe__train__max_tokens_per_gpu=2048)
    assert train_tokens_per_gpu(run.recipe, cp=2) == 8192 // 2  # one sample alone, split by CP
    assert train_tokens_per_gpu(run.recipe, cp=8) == 2048


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("qwen3-4b", 2 * 36 * 8 * 128 * 2),
        ("glm4-9b", 2 * 40 * 2 * 128 * 2),
        ("glm4.5-355b-a32b", 2 * 92 * 8 * 128 * 2),
        ("glm4.7-flash", (512 + 64) * 47 * 2),  # MLA: latent + RoPE key per layer
    ],
)
def test_kv_bytes_per_token(model_config: Models, name: str, expected: int) -> None:
    assert kv_bytes_per_token(model_config(name)) == expected


def test_kv_heads_split_then_replicate(model_config: Models) -> None:
    model = model_config("qwen3-4b")  # 8 KV heads
    full = kv_bytes_per_token(model)
    assert kv_bytes_per_token_per_gpu(model, 2, {}) == full // 2
    assert kv_bytes_per_token_per_gpu(model, 8, {}) == full // 8
    assert kv_bytes_per_token_per_gpu(model, 16, {}) == full // 8  # one replicated head
    mla = model_config("glm4.7-flash")
    assert kv_bytes_per_token_per_gpu(mla, 8, {}) == kv_bytes_per_token(mla)


def test_sglang_default_fraction_on_h100(run_config: Runs) -> None:
    hw = run_config("qwen3-4b", "h100x8").hardware
    gpu_mib = 79.6 * 1024
    # 512 MiB + 1.5 x 8192 chunked prefill + 2 x 256 graph batch + tp/8 GiB
    reserve = 512 + 1.5 * 8192 + 2 * 256 + 1 / 8 * 1024
    assert default_mem_fraction(hw, 1, 1, {}, False) == round((gpu_mib - reserve) / gpu_mib, 3)
    colocated = default_mem_fraction(hw, 1, 1, {}, True)
    assert colocated == round((gpu_mib - reserve - TRAINER_RESIDUAL_GIB * 1024) / gpu_mib, 3)


def test_kv_cache_is_what_the_static_pool_leaves(run_config: Runs) -> None:
    run = run_config("qwen3-4b", "h100x8")
    mem = estimate_rollout(
        run.model, longest_request(run), run.hardware, 2, 1, 0.7, {}, colocate=True
    )
    kv_gib = 0.7 * 79.6 - mem.weights_gib - mem.context_gib
    assert mem.kv_cache_gib == pytest.approx(kv_gib)
    assert mem.weights_gib == pytest.approx(count_params(run.model).total * 2 / 2 / GIB, rel=1e-3)
    per_token = 2 * 36 * 4 * 128 * 2
    assert mem.kv_cache_tokens_per_engine == int(kv_gib * GIB // per_token)
    assert mem.total_gib == pytest.approx(
        0.7 * 79.6 + TRAINER_RESIDUAL_GIB + mem.activation_reserve_gib
    )


def test_dp_attention_engine_holds_a_cache_per_dp_group(run_config: Runs) -> None:
    run = run_config("glm4.7-flash", "h100x8")
    options = {"enable_dp_attention": True, "dp_size": 8}
    mem = estimate_rollout(run.model, longest_request(run), run.hardware, 8, 8, 0.7, options, True)
    assert mem.kv_cache_tokens_per_engine == 8 * mem.kv_cache_tokens_per_gpu


def test_grouped_experts_hold_one_layers_stacked_fc1_and_its_gradient(run_config: Runs) -> None:
    """megatron's grouped experts stack the local experts' fc1 weights for a GEMM, and in its
    backward their stacked gradient beside them: a transient the plan adds to the step."""
    from rlpost.plan import build_plan

    run = run_config("qwen3-30b-a3b", "h100x8")
    plan = build_plan(run)
    moe, par = run.model.moe, plan.parallel
    assert moe is not None and moe.grouped_gemm and plan.trainer_backend == "megatron"
    fc1 = moe.num_experts // par.ep * 2 * moe.expert_ffn_hidden_size // par.etp
    expected = 2 * fc1 * run.model.hidden_size * 2  # bf16
    train = plan.memory.train
    assert train.grouped_experts_gib * GIB == pytest.approx(expected)
    assert plan.memory.weight_sync_gib == pytest.approx(
        train.total_gib - train.activations_gib - train.logits_gib - train.grouped_experts_gib
    )
    sequential = build_plan(run_config("qwen3-30b-a3b", "h100x8", model__moe__grouped_gemm=False))
    assert sequential.memory.train.grouped_experts_gib == 0.0
    assert sequential.memory.train.total_gib == pytest.approx(train.total_gib - expected / GIB)
    dense = build_plan(run_config("qwen3-4b", "h100x8")).memory.train
    assert dense.grouped_experts_gib == 0.0


def test_a_cpu_plan_counts_float32_whatever_params_dtype_says(run_config: Runs) -> None:
    """On a CPU profile the trainers and the CPU engines hold float32: the memory and time
    figures are those of float32 weights for a bf16 model as for an fp32 one."""

    def plan(dtype: str) -> Plan:
        return build_plan(
            run_config("qwen3-tiny", "cpu", "grpo_tiny_math", model__params_dtype=dtype)
        )

    bf16, fp32 = plan("bf16"), plan("fp32")
    assert bf16.memory == fp32.memory and bf16.prediction == fp32.prediction
    assert any("count float32" in note for note in bf16.notes)
