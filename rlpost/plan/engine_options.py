"""Rules for SGLang options passed through `layout.rollout.sglang` that SGLang accepts but
that break a training run: lengths its requests cannot fit, numerics that differ from the
trainer's, and engines that would start from weights or tokens the trainer does not have.

Each is a registered plan check (rlpost.plan.checks), so `mode=plan`, `rlpost validate` and a
training launch refuse them before anything starts.
"""

from __future__ import annotations

from typing import Any

from rlpost.errors import Issue
from rlpost.plan.checks import PlanContext, check
from rlpost.plan.engine_memory import EngineRequest, longest_request
from rlpost.schema import RunConfig
from rlpost.schema.run import request_parts

KEY = "layout.rollout.sglang"
# SGLang's --dtype spellings for each of the model's parameter dtypes
DTYPES = {"bf16": ("bfloat16",), "fp16": ("float16", "half"), "fp32": ("float32", "float")}


def _options(cfg: RunConfig) -> dict[str, Any]:
    return cfg.layout.rollout.sglang if cfg.engine.backend != "cpu" else {}


def _parts(cfg: RunConfig, request: EngineRequest) -> str:
    """What `request` is made of, for a message: its prompt's bound and its response."""
    recipe, prompt_key = cfg.recipe, request.prompt_key
    if prompt_key == "recipe.data.max_prompt_len":  # training's sample
        return request_parts(recipe.data.max_prompt_len, "max_response_len")
    response = request.response_key.removeprefix("recipe.")
    return request_parts(recipe.eval.max_prompt_len, response, bound=prompt_key)


@check("sglang_context_length", scope="engine")
def check_context_length(ctx: PlanContext) -> list[Issue]:
    options, cfg = _options(ctx.cfg), ctx.cfg
    context = options.get("context_length")
    if not isinstance(context, int) or isinstance(context, bool):
        return []
    request, model_max = longest_request(cfg), cfg.model.max_position_embeddings
    longest = request.tokens
    if context < longest:
        parts = _parts(cfg, request)
        return [
            Issue(
                f"{KEY}.context_length",
                f"engines would hold {context} tokens per request, and a request asks for up "
                f"to {longest} ({parts}): SGLang refuses those requests mid-rollout",
                f"set it to at least {longest} (up to model.max_position_embeddings="
                f"{model_max}), or remove it (the model's own length)",
                context,
            )
        ]
    if context > model_max and cfg.model.rope_scaling is None:
        return [
            Issue(
                f"{KEY}.context_length",
                f"it is beyond model.max_position_embeddings={model_max}: SGLang refuses to "
                "start an engine past the model's positions (or, forced, decodes NaNs there)",
                f"use a value in {longest}..{model_max}, or remove it",
                context,
            )
        ]
    return []


@check("sglang_kv_pool", scope="engine")
def check_max_total_tokens(ctx: PlanContext) -> list[Issue]:
    total = _options(ctx.cfg).get("max_total_tokens")
    longest = longest_request(ctx.cfg).tokens
    if isinstance(total, int) and not isinstance(total, bool) and 0 < total < longest:
        return [
            Issue(
                f"{KEY}.max_total_tokens",
                f"it caps each engine's KV cache at {total} tokens, and one request can need "
                f"{longest}: SGLang rejects it ('exceeds the maximum allowed length') once "
                "the rollout reaches it",
                f"set it to at least {longest}, or remove it (SGLang sizes the pool from "
                "mem_fraction_static)",
                total,
            )
        ]
    return []


@check("sglang_dtype", scope="engine")
def check_dtype(ctx: PlanContext) -> list[Issue]:
    dtype = _options(ctx.cfg).get("dtype")
    params = ctx.cfg.model.params_dtype
    if dtype in (None, "auto") or dtype in DTYPES[params]:
        return []
    return [
        Issue(
            f"{KEY}.dtype",
            f"engines would compute in {dtype} and the trainer in model.params_dtype={params}: "
            "every sampled token's logprob then differs between the two, and the policy "
            "ratio and the rollout/trainer mismatch grow with it",
            f"remove it (engines follow the checkpoint), or set {DTYPES[params][0]}; to "
            "change precision, change model.params_dtype",
            dtype,
        )
    ]


@check("sglang_kv_cache_dtype", scope="engine")
def check_kv_cache_dtype(ctx: PlanContext) -> list[Issue]:
    dtype = _options(ctx.cfg).get("kv_cache_dtype")
    quantised = isinstance(dtype, str) and dtype.startswith(("fp8", "fp4"))
    if not quantised or ctx.cfg.recipe.algo.off_policy_correction != "none":
        return []
    return [
        Issue(
            f"{KEY}.kv_cache_dtype",
            f"engines would keep attention keys and values in {dtype} while the trainer "
            f"computes them in model.params_dtype={ctx.cfg.model.params_dtype}: every "
            "sampled token's logprob then differs between the two, and nothing in the loss "
            "(off_policy_correction: none) corrects for it",
            "remove it (the KV cache follows the model's dtype), or keep it with "
            "recipe.algo.off_policy_correction: tis, which weighs each token by "
            "pi_trainer/pi_engine",
            dtype,
        )
    ]


@check("sglang_deterministic", scope="engine")
def check_deterministic_inference(ctx: PlanContext) -> list[Issue]:
    option = _options(ctx.cfg).get("enable_deterministic_inference")
    if option is False and ctx.cfg.run.deterministic:
        return [
            Issue(
                f"{KEY}.enable_deterministic_inference",
                "run.deterministic sends each sample with a seed of its own, and SGLang "
                "samples with a request's seed only in its deterministic inference mode: "
                "without it the seeds are dropped and no two runs sample alike",
                "remove it (run.deterministic switches it on), or remove run.deterministic",
                False,
            )
        ]
    if not option or ctx.cfg.run.deterministic:
        return []
    n = ctx.cfg.recipe.rollout.n_samples_per_prompt
    return [
        Issue(
            f"{KEY}.enable_deterministic_inference",
            "SGLang's deterministic sampling draws from a seed per request, and without "
            "run.deterministic rlpost sends a group's samples without seeds of their own: "
            f"SGLang gives them one default seed, so the {n} samples of a prompt come out "
            "token-identical and every group's advantage is 0",
            "set run.deterministic=true (each sample is sent with a seed derived from "
            "run.seed, rollout and index), or remove it",
            True,
        )
    ]


@check("sglang_engine_shape", scope="engine")
def check_pipeline_engine(ctx: PlanContext) -> list[Issue]:
    pp = _options(ctx.cfg).get("pp_size")
    if isinstance(pp, int) and pp > 1:
        size = ctx.engine.gpus_per_engine
        return [
            Issue(
                f"{KEY}.pp_size",
                f"rlpost places each engine on layout.rollout.gpus_per_engine={size} GPUs as "
                f"one tensor-parallel group; pp_size={pp} would make SGLang ask for "
                f"{size * pp} GPUs and fail to start, and weight updates address TP ranks only",
                "remove it; size engines with layout.rollout.gpus_per_engine",
                pp,
            )
        ]
    return []


@check("sglang_inputs", scope="engine")
def check_engine_inputs(ctx: PlanContext) -> list[Issue]:
    options, model = _options(ctx.cfg), ctx.cfg.model
    issues = []
    tokenizer = options.get("tokenizer_path")
    if tokenizer is not None and tokenizer != model.hf_checkpoint:
        issues.append(
            Issue(
                f"{KEY}.tokenizer_path",
                "engines would decode with another tokenizer than the trainer, which reads "
                f"model.hf_checkpoint's ({model.hf_checkpoint}): token ids, stop strings and "
                "rewards would be computed on different text",
                "remove it; to change the tokenizer, point model.hf_checkpoint at a folder "
                "holding it",
                tokenizer,
            )
        )
    load_format = options.get("load_format")
    if isinstance(load_format, str) and load_format.startswith("dummy"):
        issues.append(
            Issue(
                f"{KEY}.load_format",
                "engines would start from random weights, and the first weight update comes "
                "after the first training step: rollout 0 (and the evaluation before training) "
                "would be sampled from noise",
                "remove it (engines load model.hf_checkpoint)",
                load_format,
            )
        )
    if options.get("allow_auto_truncate"):
        issues.append(
            Issue(
                f"{KEY}.allow_auto_truncate",
                "SGLang would cut prompts that do not fit and answer the shortened prompt, "
                "while the trainer trains the response after the full one: those samples' "
                "logprobs and rewards belong to a prompt nobody trained",
                "remove it; drop long prompts with recipe.data.max_prompt_len instead",
                True,
            )
        )
    return issues


# SGLang's speculative algorithms that draft with a model of their own: EAGLE3 and STANDALONE
# always need one named; EAGLE and NEXTN fall back to the target's own MTP layers.
OWN_DRAFT_ALGORITHMS = frozenset({"EAGLE3", "STANDALONE"})
MTP_DRAFT_ALGORITHMS = frozenset({"EAGLE", "NEXTN"})


@check("sglang_speculative_draft", scope="engine")
def check_speculative_draft(ctx: PlanContext) -> list[Issue]:
    """Without speculative_draft_model_path SGLang drafts with the target checkpoint itself,
    which only works for a checkpoint with MTP layers and the MTP algorithms; otherwise the
    engine fails while it starts, after loading the target's weights twice."""
    options, model = _options(ctx.cfg), ctx.cfg.model
    algorithm = options.get("speculative_algorithm")
    if not isinstance(algorithm, str) or options.get("speculative_draft_model_path"):
        return []
    name = algorithm.upper()
    if name in OWN_DRAFT_ALGORITHMS:
        why = (
            f"{algorithm} drafts with a model of its own, and speculative_draft_model_path is unset"
        )
    elif name in MTP_DRAFT_ALGORITHMS and model.mtp_num_layers == 0:
        why = (
            f"{algorithm} without speculative_draft_model_path drafts with the checkpoint's MTP "
            f"layers, and {model.name} has none (model.mtp_num_layers=0)"
        )
    else:
        return []
    return [
        Issue(
            f"{KEY}.speculative_algorithm",
            f"{why}: SGLang then loads model.hf_checkpoint as the draft too, and the engines "
            "fail while they start, after the trainers have loaded",
            f"set {KEY}.speculative_draft_model_path to a draft checkpoint trained for this "
            "model, or remove speculative_algorithm",
            algorithm,
        )
    ]
