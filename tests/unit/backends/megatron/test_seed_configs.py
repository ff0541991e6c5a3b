"""The four seed runs' full-size plans give megatron-core configurations that match the seeds'
Megatron argument lists, flag by flag, without building a model or a process group.

The argument lists are rlpost's own rendering of the seeds (mode=slime_args; tests/config
holds them to the seed documents). Every flag of MODEL_ARGS, PERF_ARGS, MISC_ARGS and
OPTIMIZER_ARGS must be checked here or be listed as handled outside megatron-core's configs.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch.nn.functional as F
from megatron.core.transformer.enums import AttnBackend

from rlpost.backends.megatron.config import (
    MegatronSettings,
    megatron_settings,
    padded_vocab_size,
)
from rlpost.plan import Plan, build_plan
from rlpost.plan.slime_args import slime_flag_groups
from rlpost.schema import RunConfig

SEEDS = {
    "glm4-9b": "h100x8",
    "qwen3-4b": "h100x8",
    "glm4.5-355b-a32b": "h100x64",
    "glm4.7-flash": "h100x8",
}
GROUPS = ("MODEL_ARGS", "PERF_ARGS", "MISC_ARGS", "OPTIMIZER_ARGS")

Check = Callable[[MegatronSettings, tuple[str, ...]], Any]
"""settings, flag values -> the value the flag asks for, read back from the settings."""


def _layer_freq(text: str) -> list[int]:
    """'[0]*3+[1]*89' or '1' as megatron-core's per-layer list (1 = MoE)."""
    if text.isdigit():
        return []
    return [int(v) for v, n in re.findall(r"\[(\d)\]\*(\d+)", text) for _ in range(int(n))]


def t(field: str) -> Check:
    return lambda s, v: getattr(s.transformer, field)


def o(field: str) -> Check:
    return lambda s, v: getattr(s.optimizer, field)


# flag -> (what the settings hold, how the flag's text reads as that value)
VALUED: dict[str, tuple[Check, Callable[[str], Any]]] = {
    "--num-layers": (t("num_layers"), int),
    "--hidden-size": (t("hidden_size"), int),
    "--ffn-hidden-size": (t("ffn_hidden_size"), int),
    "--num-attention-heads": (t("num_attention_heads"), int),
    "--num-query-groups": (t("num_query_groups"), int),
    "--kv-channels": (t("kv_channels"), int),
    "--position-embedding-type": (lambda s, v: s.gpt.position_embedding_type, str),
    "--rotary-base": (lambda s, v: s.gpt.rotary_base, float),
    "--rotary-percent": (lambda s, v: s.gpt.rotary_percent, float),
    "--normalization": (t("normalization"), str),
    "--norm-epsilon": (t("layernorm_epsilon"), float),
    "--vocab-size": (lambda s, v: s.gpt.true_vocab_size, int),
    "--make-vocab-size-divisible-by": (
        lambda s, v: (
            int(v[0])
            if s.gpt.vocab_size
            == padded_vocab_size(
                s.gpt.true_vocab_size, s.transformer.tensor_model_parallel_size, int(v[0])
            )
            else s.gpt.vocab_size
        ),
        int,
    ),
    "--q-lora-rank": (t("q_lora_rank"), int),
    "--kv-lora-rank": (t("kv_lora_rank"), int),
    "--qk-head-dim": (t("qk_head_dim"), int),
    "--qk-pos-emb-head-dim": (t("qk_pos_emb_head_dim"), int),
    "--v-head-dim": (t("v_head_dim"), int),
    "--num-experts": (t("num_moe_experts"), int),
    "--moe-layer-freq": (lambda s, v: list(s.transformer.moe_layer_freq), _layer_freq),
    "--moe-ffn-hidden-size": (t("moe_ffn_hidden_size"), int),
    "--moe-router-topk": (t("moe_router_topk"), int),
    "--moe-router-score-function": (t("moe_router_score_function"), str),
    "--moe-router-dtype": (t("moe_router_dtype"), str),
    "--moe-shared-expert-intermediate-size": (t("moe_shared_expert_intermediate_size"), int),
    "--moe-router-bias-update-rate": (t("moe_router_bias_update_rate"), float),
    "--moe-router-topk-scaling-factor": (t("moe_router_topk_scaling_factor"), float),
    "--moe-router-num-groups": (t("moe_router_num_groups"), int),
    "--moe-router-group-topk": (t("moe_router_group_topk"), int),
    "--moe-aux-loss-coeff": (t("moe_aux_loss_coeff"), float),
    "--moe-token-dispatcher-type": (t("moe_token_dispatcher_type"), str),
    "--tensor-model-parallel-size": (t("tensor_model_parallel_size"), int),
    "--pipeline-model-parallel-size": (t("pipeline_model_parallel_size"), int),
    "--context-parallel-size": (t("context_parallel_size"), int),
    "--expert-model-parallel-size": (t("expert_model_parallel_size"), int),
    "--expert-tensor-parallel-size": (t("expert_tensor_parallel_size"), int),
    "--decoder-first-pipeline-num-layers": (t("num_layers_in_first_pipeline_stage"), int),
    "--decoder-last-pipeline-num-layers": (t("num_layers_in_last_pipeline_stage"), int),
    "--recompute-granularity": (t("recompute_granularity"), str),
    "--recompute-method": (t("recompute_method"), str),
    "--recompute-num-layers": (t("recompute_num_layers"), int),
    "--attention-dropout": (t("attention_dropout"), float),
    "--hidden-dropout": (t("hidden_dropout"), float),
    "--attention-backend": (lambda s, v: s.transformer.attention_backend, AttnBackend.__getitem__),
    "--optimizer": (o("optimizer"), str),
    "--lr": (o("lr"), float),
    "--weight-decay": (o("weight_decay"), float),
    "--adam-beta1": (o("adam_beta1"), float),
    "--adam-beta2": (o("adam_beta2"), float),
    "--adam-eps": (o("adam_eps"), float),
    "--clip-grad": (o("clip_grad"), float),
}

# switch -> whether the settings have it on (checked both ways: present iff on)
SWITCHES: dict[str, Callable[[MegatronSettings], bool]] = {
    "--swiglu": lambda s: (
        s.transformer.gated_linear_unit and s.transformer.activation_func is F.silu
    ),
    "--group-query-attention": lambda s: (
        s.transformer.num_query_groups < s.transformer.num_attention_heads
    ),
    "--rotary-interleaved": lambda s: s.transformer.rotary_interleaved,
    "--no-rope-fusion": lambda s: (
        s.transformer.rotary_interleaved and not s.transformer.apply_rope_fusion
    ),
    "--disable-bias-linear": lambda s: not s.transformer.add_bias_linear,
    "--add-qkv-bias": lambda s: s.transformer.add_qkv_bias,
    "--qk-layernorm": lambda s: s.transformer.qk_layernorm,
    "--post-self-attn-layernorm": lambda s: s.post_self_attn_layernorm,
    "--post-mlp-layernorm": lambda s: s.post_mlp_layernorm,
    # slime's GLM-4 layer spec exists for the sandwich norms; rlpost's spec builds them
    "--spec": lambda s: s.post_mlp_layernorm,
    "--untie-embeddings-and-output-weights": lambda s: (
        not s.gpt.share_embeddings_and_output_weights
    ),
    "--multi-latent-attention": lambda s: s.transformer.multi_latent_attention,
    "--moe-router-enable-expert-bias": lambda s: s.transformer.moe_router_enable_expert_bias,
    "--moe-grouped-gemm": lambda s: s.transformer.moe_grouped_gemm,
    "--moe-enable-deepep": lambda s: (
        s.transformer.moe_flex_dispatcher_backend == "deepep"
        and s.transformer.moe_token_dispatcher_type == "flex"
    ),
    "--sequence-parallel": lambda s: s.transformer.sequence_parallel,
    "--accumulate-allreduce-grads-in-fp32": lambda s: s.ddp.grad_reduce_in_fp32,
    "--attention-softmax-in-fp32": lambda s: s.transformer.attention_softmax_in_fp32,
    "--optimizer-cpu-offload": lambda s: s.optimizer.optimizer_cpu_offload,
    "--overlap-cpu-optimizer-d2h-h2d": lambda s: s.optimizer.overlap_cpu_optimizer_d2h_h2d,
    "--use-precision-aware-optimizer": lambda s: s.optimizer.use_precision_aware_optimizer,
}

# flags rlpost handles itself rather than through megatron-core's configs
OUTSIDE_CORE = {
    "--lr-decay-style": "rlpost's schedule (torch_trainer.optim.lr_at_step) sets each step's lr",
    "--lr-warmup-iters": "same schedule",
    "--lr-decay-iters": "same schedule",
    "--min-lr": "same schedule",
    "--use-dynamic-batch-size": "the trainer's packing (rlpost.algo.packing)",
    "--max-tokens-per-gpu": "the trainer's packing, times cp",
    "--micro-batch-size": "the trainer's packing",
    "--seed": "MegatronTrainer(seed=...)",
}
ALWAYS_ON = {"--swiglu", "--disable-bias-linear", "--accumulate-allreduce-grads-in-fp32"}


@functools.cache
def seed(model: str) -> tuple[RunConfig, Plan, MegatronSettings]:
    from rlpost.config.loader import compose_run_config

    cfg = compose_run_config([f"model={model}", "recipe=grpo_dapo", f"hardware={SEEDS[model]}"])[0]
    plan = build_plan(cfg)
    return cfg, plan, megatron_settings(cfg.model, plan.parallel, cfg.recipe.optim, on_gpu=True)


def flags(model: str) -> list[tuple[str, ...]]:
    cfg, plan, _ = seed(model)
    groups = slime_flag_groups(cfg, plan)
    return [flag for group in GROUPS for flag in groups.get(group, [])]


@pytest.mark.parametrize("model", sorted(SEEDS))
def test_every_flag_matches_the_settings(model: str) -> None:
    settings = seed(model)[2]
    unchecked, wrong = [], []
    for name, *values in flags(model):
        if name in OUTSIDE_CORE:
            continue
        if name in SWITCHES:
            if not SWITCHES[name](settings):
                wrong.append(f"{name}: off in the settings")
        elif name in VALUED:
            read, parse = VALUED[name]
            expected, actual = parse(values[0]), read(settings, tuple(values))
            if expected != actual:
                wrong.append(f"{name} {values[0]}: settings hold {actual!r}")
        else:
            unchecked.append(name)
    assert not unchecked, f"flags with no check: {unchecked}"
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("model", sorted(SEEDS))
def test_switches_absent_are_off(model: str) -> None:
    settings = seed(model)[2]
    present = {flag[0] for flag in flags(model)}
    on_without_flag = [
        name
        for name, is_on in SWITCHES.items()
        if name not in present and name not in ALWAYS_ON and is_on(settings)
    ]
    assert not on_without_flag


@pytest.mark.parametrize("model", sorted(SEEDS))
def test_parallel_sizes_cover_the_train_gpus(model: str) -> None:
    _, plan, settings = seed(model)
    sizes, config = settings.parallel, settings.transformer
    assert sizes.world_size == plan.placement.train_gpus
    assert sizes.data_parallel_size == plan.parallel.dp
    assert settings.gpt.vocab_size % sizes.tensor_model_parallel_size == 0
    assert settings.ddp.use_distributed_optimizer == plan.parallel.distributed_optimizer
    # packed samples of different lengths, losses with step-wide denominators
    assert config.variable_seq_lengths and config.calculate_per_token_loss


def test_seed_models_are_bf16_on_gpu_and_fp32_on_cpu() -> None:
    cfg, plan, gpu = seed("qwen3-4b")
    cpu = megatron_settings(cfg.model, plan.parallel, cfg.recipe.optim, on_gpu=False)
    assert gpu.transformer.bf16 and not cpu.transformer.bf16
    assert str(cpu.transformer.params_dtype) == "torch.float32"
