"""The launcher refuses bad input before anything starts: a corpus through `launch.py`.

Every case is a training launch (`mode=train`, the default) that must end with exit status 2,
a message naming the key or file and saying the fix, no traceback, no Ray started and no run
directory written. The cases run one after the other in a single interpreter (the launcher's
own `main`, as `launch.py` calls it), so the corpus costs one start-up;
`test_a_bad_launch_is_refused_from_the_command_line` holds the same contract for a real
`launch.py` process. How long a refusal takes (the target: under 3 s) is measured by
`benchmarks/refusals.py`, which runs this corpus through `run_corpus` with the files
`write_fixtures` writes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ASSETS = REPO / "rlpost" / "assets"
TINY_MODEL = ASSETS / "qwen3-tiny"
GLM9 = ("model=glm4-9b", "recipe=grpo_dapo", "hardware=h100x8")
DECOUPLED_CPU = ("layout.colocate=false", "layout.train.num_gpus=1", "layout.rollout.num_gpus=1")


@dataclass(frozen=True)
class Bad:
    name: str
    argv: tuple[str, ...]
    names: str  # what the message must name: a key, or (part of) a file path
    says: str  # part of the message


CASES: list[Bad] = [
    # ---- overrides: rewards, sampling, groups ---------------------------------------------
    Bad(
        "reward type typo",
        ("recipe.rollout.reward.type=mth",),
        "recipe.rollout.reward.type",
        "Did you mean 'math'?",
    ),
    Bad(
        "group of one with grpo",
        ("recipe.rollout.n_samples_per_prompt=1", "recipe.train.global_batch_size=8"),
        "recipe.rollout.n_samples_per_prompt",
        "groups of one: reinforce_plus_plus",
    ),
    Bad("top_k zero", ("recipe.rollout.top_k=0",), "recipe.rollout.top_k", "keeps no token"),
    Bad(
        "importance weights clipped below 1",
        ("recipe.algo.off_policy_correction=tis", "recipe.algo.tis_clip_high=0.5"),
        "recipe.algo.tis_clip_high",
        "every on-policy token's loss would be scaled by 0.5",
    ),
    Bad(
        "an evaluation set's reward type that the reward model never reads",
        (
            "recipe.rollout.reward.type=model",
            "recipe.rollout.reward.model=rlpost_test_hooks.BoxedAnswerModel",
            "recipe.eval.datasets=[{name: a, path: /a.jsonl, reward_type: f1}]",
        ),
        "recipe.eval.datasets.0.reward_type",
        "scores every sample, whatever its set, and never reads it",
    ),
    Bad(
        "evaluation sampling on the command line of a run that names no evaluation set",
        ("recipe.eval.datasets=[]", "recipe.eval.interval=null", "recipe.eval.temperature=0.6"),
        "recipe.eval.temperature",
        "no evaluation runs, so nothing reads it",
    ),
    Bad(
        "an evaluation with nothing to evaluate",
        ("mode=eval", "recipe.eval.datasets=[]", "~recipe.eval.interval"),
        "recipe.eval.datasets",
        "mode=eval evaluates the policy on recipe.eval.datasets",
    ),
    Bad(
        "an evaluation of a checkpoint it would look for in its own new directory",
        ("mode=eval", "run.resume=auto", "run.dir=/tmp/rlpost-eval-auto"),
        "run.resume",
        "name the checkpoint to evaluate",
    ),
    Bad(
        "a training setting on the command line of an evaluation, which trains nothing",
        ("mode=eval", "recipe.optim.lr=3e-5"),
        "recipe.optim.lr = 3e-05   (command line: recipe.optim.lr=3e-5)",
        "mode=eval trains nothing and reads no training settings",
    ),
    Bad(
        "a chat template argument the template never reads (a misspelt enable_thinking)",
        ("+recipe.data.apply_chat_template_kwargs.enable_thinkng=false",),
        "recipe.data.apply_chat_template_kwargs.enable_thinkng",
        "never reads 'enable_thinkng' (did you mean 'enable_thinking'?)",
    ),
    Bad(
        "a data seed without a shuffle to order",
        ("recipe.data.shuffle=false", "recipe.data.seed=7"),
        "recipe.data.seed",
        "seed=7 has no effect: the jsonl source draws the prompts in the file's order",
    ),
    Bad(
        "a top_p cut under greedy evaluation",
        ("recipe.eval.temperature=0", "recipe.eval.top_p=0.7", "recipe.eval.top_k=20"),
        "recipe.eval.top_p",
        "top_p=0.7 has no effect: temperature=0 means greedy decoding",
    ),
    Bad(
        "a top_k cut under greedy evaluation",
        ("recipe.eval.temperature=0", "recipe.eval.top_k=20"),
        "recipe.eval.top_k",
        "top_k=20 has no effect: temperature=0 means greedy decoding",
    ),
    Bad(
        "an evaluation set graded after </think> with thinking turned off",
        (
            "recipe.data.apply_chat_template_kwargs={enable_thinking: false}",
            "recipe.eval.datasets=[{name: aime, path: /a.jsonl, reward_type: deepscaler}]",
        ),
        "recipe.eval.datasets.0.reward_type",
        "every reward is 0 and the aime accuracy reads 0",
    ),
    Bad(
        "a chat template argument rlpost passes itself",
        ("recipe.data.apply_chat_template_kwargs={add_generation_prompt: false}",),
        "recipe.data.apply_chat_template_kwargs",
        "got multiple values for keyword argument",
    ),
    Bad(
        "tools as a chat template argument",
        ("recipe.data.apply_chat_template_kwargs={tools: []}",),
        "recipe.data.apply_chat_template_kwargs",
        "tools come from each prompt line's tool_key field",
    ),
    Bad(
        "over-sampling without a filter",
        ("recipe.rollout.over_sampling_batch_size=16",),
        "recipe.rollout.over_sampling_batch_size",
        "no dynamic_sampling_filter",
    ),
    Bad(
        "a draw limit of zero",
        (
            "recipe.rollout.dynamic_sampling_filter=rlpost.filters.check_reward_nonzero_std",
            "recipe.rollout.max_draws_per_rollout=0",
        ),
        "recipe.rollout.max_draws_per_rollout",
        "greater than 0",
    ),
    Bad(
        "a draw limit without a filter",
        ("recipe.rollout.max_draws_per_rollout=10",),
        "recipe.rollout.max_draws_per_rollout",
        "none is set: every group drawn is kept",
    ),
    Bad(
        "partial rollout that keeps nothing",
        ("recipe.rollout.partial_rollout=true",),
        "recipe.rollout.partial_rollout",
        "no group is ever cut short",
    ),
    Bad(
        "off-policy mask without partial rollout",
        ("recipe.rollout.mask_offpolicy_in_partial_rollout=true",),
        "recipe.rollout.mask_offpolicy_in_partial_rollout",
        "partial_rollout is off",
    ),
    Bad(
        "buffer filter without partial rollout",
        ("recipe.rollout.buffer_filter=rlpost.filters.pop_first",),
        "recipe.rollout.buffer_filter",
        "partial_rollout is off",
    ),
    Bad(
        "remote reward without a URL",
        ("recipe.rollout.reward.type=remote",),
        "recipe.rollout.reward.remote_url",
        "remote_url is not set",
    ),
    Bad(
        "reward URL that nothing reads",
        ("recipe.rollout.reward.remote_url=http://h:1/s",),
        "recipe.rollout.reward.remote_url",
        "has no effect",
    ),
    Bad(
        "an evaluation set graded by a reward server whose URL is not set",
        ("recipe.eval.datasets=[{name: a, path: /a.jsonl, reward_type: remote}]",),
        "recipe.eval.datasets.0.reward_type",
        "rollout.reward.remote_url is not set: every one would fail",
    ),
    Bad(
        "reward URL without a scheme",
        (
            "recipe.rollout.reward.type=remote",
            "recipe.rollout.reward.remote_url=localhost:8000/score",
        ),
        "recipe.rollout.reward.remote_url",
        "not an http(s) URL",
    ),
    Bad(
        "group reward without a function",
        ("recipe.rollout.reward.group=true",),
        "recipe.rollout.reward.group",
        "custom_function is not set",
    ),
    Bad(
        "stop token outside the vocabulary",
        ("recipe.rollout.stop_token_ids=[99999]",),
        "recipe.rollout.stop_token_ids",
        "outside the model's vocabulary",
    ),
    Bad(
        "a stop string at the thinking block's end, graded after it",
        ('recipe.rollout.stop=["</think>"]', "recipe.rollout.reward.type=deepscaler"),
        "recipe.rollout.stop",
        "generation stops there (the stop string ends the text), before any answer",
    ),
    Bad(
        "a stop string at DAPO's answer line",
        ('recipe.rollout.stop=["answer:"]', "recipe.rollout.reward.type=dapo"),
        "recipe.rollout.stop",
        "every response it grades scores -1",
    ),
    Bad(
        "an evaluation set graded past a stop string",
        (
            'recipe.rollout.stop=["\\boxed"]',
            "recipe.rollout.reward.type=f1",
            "recipe.eval.datasets.0.reward_type=math",
        ),
        "recipe.rollout.stop",
        "eval.datasets.0.reward_type=math grades the answer a response writes after '\\boxed'",
    ),
    Bad(
        "a stop string at the box a boxed_ grader reads",
        ('recipe.rollout.stop=["\\boxed{"]', "recipe.rollout.reward.type=boxed_f1"),
        "recipe.rollout.stop",
        "rollout.reward.type=boxed_f1 grades the answer a response writes after '\\boxed'",
    ),
    Bad(
        "an evaluation set graded by its box past a stop string",
        (
            'recipe.rollout.stop=["\\boxed"]',
            "recipe.rollout.reward.type=f1",
            "recipe.eval.datasets.0.reward_type=boxed_gpqa",
        ),
        "recipe.rollout.stop",
        "eval.datasets.0.reward_type=boxed_gpqa grades the answer a response writes after",
    ),
    Bad(
        "slime's ifbench, whose checkers rlpost does not ship",
        ("recipe.rollout.reward.type=ifbench",),
        "recipe.rollout.reward.type",
        "reward type 'ifbench' is not available: slime's ifbench grades with AllenAI's IFBench",
    ),
    Bad(
        "an evaluation set graded by slime's ifbench",
        ("recipe.eval.datasets.0.reward_type=ifbench",),
        "recipe.eval.datasets.0.reward_type",
        "or for an evaluation set its custom_reward_function",  # a fix the set can take
    ),
    Bad(
        "slime's boxed_math, which finds no box inside the box",
        ("recipe.rollout.reward.type=boxed_math",),
        "recipe.rollout.reward.type",
        "math grades the last \\boxed{} answer already",
    ),
    Bad(
        "a stop token id at the thinking block's end",
        ("recipe.rollout.stop_token_ids=[4]", "recipe.rollout.reward.type=deepscaler"),
        "recipe.rollout.stop_token_ids",
        "stop_token_ids holds 4 ('</think>'",
    ),
    Bad(
        "an episode time limit of zero",
        ("recipe=grpo_tiny_calculator", "recipe.rollout.episode_timeout_s=0"),
        "recipe.rollout.episode_timeout_s",
        "greater than 0",
    ),
    Bad(
        "an episode time limit without a generate function",
        ("recipe.rollout.episode_timeout_s=60",),
        "recipe.rollout.episode_timeout_s",
        "awaits nothing but its request to the engines",
    ),
    Bad(
        "a tool loop allowed one turn",
        ("recipe=grpo_tiny_calculator", "recipe.rollout.max_turns=1"),
        "recipe.rollout.max_turns",
        "needs 2 policy turns for a sample that uses its environment to answer",
    ),
    Bad(
        "reward model calls smaller than a group",
        (
            "recipe.rollout.reward.type=model",
            "recipe.rollout.reward.model=rlpost_test_hooks.BoxedAnswerModel",
            "recipe.rollout.reward.model_batch_size=4",
        ),
        "recipe.rollout.reward.model_batch_size",
        "a reward model call never splits a group, so each of those groups goes out as one "
        "call of 8 samples",
    ),
    Bad(
        "FSDP2's CPU offload on a CPU machine",
        ("layout.train.fsdp.cpu_offload=true",),
        "layout.train.fsdp.cpu_offload",
        "already live in host memory",
    ),
    Bad(
        "an evaluation default every set overrides",
        (
            "recipe.eval.datasets=[{name: arith, path: ${asset:data/arith_eval.jsonl},"
            " n_samples_per_prompt: 2, max_response_len: 16}]",
            "recipe.eval.n_samples_per_prompt=4",
        ),
        "recipe.eval.n_samples_per_prompt",
        "every one of eval.datasets sets its own n_samples_per_prompt",
    ),
    Bad(
        "math reward without labels",
        ("recipe.data.label_key=null",),
        "recipe.data.label_key",
        "data.label_key is not set",
    ),
    Bad(
        "temperature zero",
        ("recipe.rollout.temperature=0",),
        "recipe.rollout.temperature",
        "must be > 0",
    ),
    Bad(
        "global batch smaller than the data-parallel size",
        ("recipe.train.global_batch_size=1",),
        "recipe.train.global_batch_size = 1",
        "fix: use a multiple of 2 that divides the 64 samples a rollout makes (e.g. 2), or "
        "change the data-parallel size",
    ),
    Bad(
        "a data-parallel size no global batch of a rollout splits",
        (
            "layout.colocate=false",
            "layout.train.num_gpus=3",
            "layout.rollout.num_gpus=1",
            "hardware.gpus_per_node=4",
            "hardware.cpus_per_node=4",
        ),
        "recipe.train.global_batch_size = 64",
        "set recipe.train.global_batch_size: 72 with recipe.rollout.batch_size: 9 prompts",
    ),
    Bad(
        "temperature not a number",
        ("recipe.rollout.temperature=nan",),
        "recipe.rollout.temperature = nan",
        "must be a finite number; got nan",
    ),
    Bad(
        "infinite learning rate",
        ("recipe.optim.lr=inf",),
        "recipe.optim.lr = inf",
        "fix: set it to a finite number > 0",
    ),
    Bad(
        "global batch that does not divide",
        ("recipe.train.global_batch_size=60",),
        "recipe.train.global_batch_size",
        "not a multiple",
    ),
    Bad(
        "eval interval without datasets",
        ("recipe.eval.datasets=[]",),
        "recipe.eval.datasets",
        "no datasets are named",
    ),
    # ---- algorithm and optimizer ------------------------------------------------------------
    Bad(
        "KL reward coefficient grpo ignores",
        ("recipe.algo.kl_coef=0.1",),
        "recipe.algo.kl_coef",
        "does not put a KL penalty",
    ),
    Bad(
        "discount grpo ignores",
        ("recipe.algo.gamma=0.9",),
        "recipe.algo.gamma",
        "does not discount",
    ),
    Bad(
        "std normalisation of another estimator",
        ("recipe.algo.advantage_estimator=gspo", "recipe.algo.grpo_std_normalization=false"),
        "recipe.algo.grpo_std_normalization",
        "only grpo divides",
    ),
    Bad(
        "advantage normalisation reinforce++ always does",
        (
            "recipe.algo.advantage_estimator=reinforce_plus_plus",
            "recipe.algo.normalize_advantages=true",
        ),
        "recipe.algo.normalize_advantages",
        "always whitens",
    ),
    Bad(
        "TIS clip without TIS",
        ("recipe.algo.tis_clip_high=3.0",),
        "recipe.algo.tis_clip_high",
        "not tis",
    ),
    Bad(
        "TIS clips in the wrong order",
        ("recipe.algo.off_policy_correction=tis", "recipe.algo.tis_clip_low=3.0"),
        "recipe.algo.tis_clip_low",
        "not below",
    ),
    Bad(
        "dual clip at or below one",
        ("recipe.algo.eps_clip_c=1.0",),
        "recipe.algo.eps_clip_c",
        "must be > 1",
    ),
    Bad(
        "unknown estimator",
        ("recipe.algo.advantage_estimator=grp",),
        "recipe.algo.advantage_estimator",
        "Did you mean 'grpo'?",
    ),
    Bad(
        "decay without its steps",
        ("recipe.optim.lr_decay_style=cosine",),
        "recipe.optim.lr_decay_steps",
        "not set",
    ),
    Bad(
        "decay before warmup ends",
        (
            "recipe.optim.lr_decay_style=linear",
            "recipe.optim.lr_decay_steps=5",
            "recipe.optim.lr_warmup_steps=5",
        ),
        "recipe.optim.lr_decay_steps",
        "must exceed",
    ),
    Bad(
        "min lr of a constant schedule",
        ("recipe.optim.min_lr=1e-6",),
        "recipe.optim.min_lr",
        "lr_decay_style is constant",
    ),
    Bad(
        "min lr above lr",
        (
            "recipe.optim.lr_decay_style=linear",
            "recipe.optim.lr_decay_steps=50",
            "recipe.optim.min_lr=1.0",
        ),
        "recipe.optim.min_lr",
        "above lr",
    ),
    Bad(
        "warmup longer than the run",
        ("recipe.optim.lr_warmup_steps=60",),
        "recipe.optim.lr_warmup_steps",
        "end before the learning rate",
    ),
    Bad(
        "offload overlap without offload",
        ("recipe.optim.overlap_cpu_optimizer_d2h_h2d=true",),
        "recipe.optim.overlap_cpu_optimizer_d2h_h2d",
        "cpu_offload is off",
    ),
    Bad(
        "CPU Adam on a CPU machine",
        ("recipe.optim.cpu_offload=true",),
        "recipe.optim.cpu_offload",
        "CPU machine",
    ),
    Bad(
        "micro-batch size dynamic batching ignores",
        ("recipe.train.micro_batch_size=4",),
        "recipe.train.micro_batch_size",
        "packs micro-batches by max_tokens_per_gpu",
    ),
    Bad(
        "token cap without dynamic batching",
        ("recipe.train.use_dynamic_batch_size=false",),
        "recipe.train.max_tokens_per_gpu",
        "micro_batch_size samples each",
    ),
    # ---- engines, weight sync, trainer ----------------------------------------------------
    Bad(
        "CUDA IPC weight sync on CPU",
        ("engine.weight_sync=tensor",),
        "engine.weight_sync",
        "no GPUs",
    ),
    Bad("SGLang on a CPU machine", ("engine.backend=sglang",), "engine.backend", "CPU machine"),
    Bad(
        "offload on a decoupled layout",
        (*DECOUPLED_CPU, "engine.offload=true"),
        "engine.offload",
        "decoupled",
    ),
    Bad(
        "health checks without fault tolerance",
        ("engine.health_check_interval_s=5",),
        "engine.health_check_interval_s",
        "fault_tolerance: true",
    ),
    Bad(
        "probe tolerance without the probe",
        ("engine.weight_probe_tolerance=0.1",),
        "engine.weight_probe_tolerance",
        "weight_probe: true",
    ),
    Bad(
        "bucket size of disk sync",
        ("engine.weight_bucket_mb=64",),
        "engine.weight_bucket_mb",
        "through disk",
    ),
    Bad(
        "SGLang options the CPU engine ignores",
        ("++layout.rollout.sglang.mem_fraction_static=0.5",),
        "layout.rollout.sglang   (command line: layout.rollout.sglang.mem_fraction_static=0.5)",
        "reads no SGLang options",
    ),
    Bad(
        "a model fact from the command line its checkpoint contradicts",
        ("model.num_layers=3",),
        "model.num_layers = 3   (command line: model.num_layers=3)",
        "the command line (model.num_layers=3) says num_layers=3, but",
    ),
    Bad(
        "a prompt key no line of the prompt file has",
        ("recipe.data.input_key=question",),
        "recipe.data.input_key = 'question'   (command line: recipe.data.input_key=question)",
        "arith_train.jsonl has the key 'question' (keys there: label, prompt)",
    ),
    Bad(
        "torch trainer with tensor parallelism",
        ("trainer.backend=torch", "layout.train.tp=2"),
        "trainer.backend",
        "data parallel only",
    ),
    Bad("unknown trainer backend", ("trainer.backend=jax",), "trainer.backend", "Input should be"),
    Bad("memory the CPU does not have", ("model=qwen3-8b",), "layout.train", "training needs"),
    # ---- SGLang options by range and by command line ---------------------------------------
    Bad(
        "memory fraction above one",
        (*GLM9, "layout.rollout.sglang.mem_fraction_static=1.5"),
        "layout.rollout.sglang.mem_fraction_static",
        "(0, 1]",
    ),
    Bad(
        "memory fraction zero",
        (*GLM9, "layout.rollout.sglang.mem_fraction_static=0"),
        "layout.rollout.sglang.mem_fraction_static",
        "(0, 1]",
    ),
    Bad(
        "chunked prefill of zero",
        (*GLM9, "++layout.rollout.sglang.chunked_prefill_size=0"),
        "layout.rollout.sglang.chunked_prefill_size",
        "or -1",
    ),
    Bad(
        "CUDA graph batch size zero",
        (*GLM9, "++layout.rollout.sglang.cuda_graph_bs_decode=[1,0]"),
        "layout.rollout.sglang.cuda_graph_bs_decode",
        "0 is not",
    ),
    Bad(
        "the engines' memory saver turned off where they release memory",
        (*GLM9, "++layout.rollout.sglang.enable_memory_saver=false"),
        "layout.rollout.sglang.enable_memory_saver",
        "engine.offload decides it",
    ),
    Bad(
        "running requests zero",
        (*GLM9, "++layout.rollout.sglang.max_running_requests=0"),
        "layout.rollout.sglang.max_running_requests",
        "a count or size",
    ),
    Bad(
        "option without a command-line flag",
        (*GLM9, "++layout.rollout.sglang.grpc_worker_threads=4"),
        "layout.rollout.sglang.grpc_worker_threads",
        "no command-line flag",
    ),
    Bad(
        "option the plan sets",
        (*GLM9, "++layout.rollout.sglang.tp_size=2"),
        "layout.rollout.sglang.tp_size",
        "set by rlpost",
    ),
    Bad(
        "option typo",
        (*GLM9, "++layout.rollout.sglang.mem_fracton_static=0.5"),
        "layout.rollout.sglang.mem_fracton_static",
        "Did you mean",
    ),
    Bad(
        "option of the wrong type",
        (*GLM9, "++layout.rollout.sglang.max_running_requests=x"),
        "layout.rollout.sglang.max_running_requests",
        "takes an integer",
    ),
    Bad(
        "CUDA IPC to engines on other GPUs",
        (*GLM9, "engine.weight_sync=tensor"),
        "engine.weight_sync",
        "same GPU",
    ),
    Bad(
        "GPU weight sync to the CPU engine",
        (
            "model=qwen3-4b",
            "recipe=grpo_dapo",
            "hardware=h100x8",
            "engine.backend=cpu",
            "~layout.rollout.sglang.mem_fraction_static",
            "engine.weight_sync=tensor",
        ),
        "engine.weight_sync",
        "joins no NCCL group",
    ),
    Bad(
        "GPUs this machine does not have",
        ("model=qwen3-4b", "recipe=grpo_dapo", "hardware=h100x8"),
        "hardware",
        "this machine has 0",
    ),
    Bad(
        "megatron's optimizer choice under the torch trainer",
        ("trainer.backend=torch", "layout.train.distributed_optimizer=false"),
        "layout.train.distributed_optimizer = False",
        "trainer.backend resolves to torch: it would be ignored",
    ),
    Bad(
        "plan format on a training launch",
        ("plan.format=json",),
        "plan.format = 'json'",
        "fix: add mode=plan to print in that format, or remove plan.format",
    ),
    Bad(
        "slime script format on a training launch",
        ("plan.format=script",),
        "plan.format = 'script'",
        "fix: add mode=slime_args to print in that format",
    ),
    Bad(
        "yarn setting on llama3 rope scaling",
        (
            "model=llama3.1-8b",
            "recipe=grpo_dapo",
            "hardware=h100x8",
            "model.rope_scaling.beta_fast=16",
        ),
        "model.rope_scaling.beta_fast = 16",
        "fix: remove beta_fast, or set type: yarn",
    ),
    # ---- tracking -------------------------------------------------------------------------
    Bad(
        "wandb run id while wandb is off",
        ("tracking.wandb.run_id=abc",),
        "tracking.wandb.run_id",
        "enabled: false",
    ),
    Bad(
        "wandb project written as entity/project",
        ("tracking.wandb.enabled=true", "tracking.wandb.project='team/proj'"),
        "tracking.wandb.project = 'team/proj'",
        "fix: set project: proj, and the entity in the environment: WANDB_ENTITY=team",
    ),
    Bad(
        "wandb project with a character wandb refuses",
        ("tracking.wandb.enabled=true", "tracking.wandb.project='exp#3'"),
        "tracking.wandb.project = 'exp#3'",
        "it holds #, which wandb refuses in a project name",
    ),
    Bad(
        "wandb run id with a character wandb refuses",
        ("tracking.wandb.enabled=true", "tracking.wandb.run_id='grpo:1'"),
        "tracking.wandb.run_id = 'grpo:1'",
        "fix: set run_id: grpo1",
    ),
    Bad(
        "online wandb without a key",
        ("tracking.wandb.enabled=true", "tracking.wandb.mode=online"),
        "tracking.wandb.mode",
        "needs an API key",
    ),
    # ---- overrides and groups -------------------------------------------------------------
    Bad(
        "a sweep without -m",
        ("recipe.train.global_batch_size=64,32",),
        "recipe.train.global_batch_size = '64,32'",
        "fix: add -m to launch one run per value",
    ),
    Bad(
        "one value for a list",
        ("recipe.rollout.stop_token_ids=5",),
        "recipe.rollout.stop_token_ids = 5",
        "in brackets, quoted for the shell: recipe.rollout.stop_token_ids='[5]'",
    ),
    Bad(
        "a file for the evaluation sets",
        ("recipe.eval.datasets=/x/aime.jsonl",),
        "recipe.eval.datasets = '/x/aime.jsonl'",
        "in brackets, quoted for the shell: recipe.eval.datasets='[{name: ..., path: ...}]'",
    ),
    Bad(
        "a list written as a sweep",
        ("recipe.rollout.stop_token_ids=1,2",),
        "recipe.rollout.stop_token_ids = '1,2'",
        "fix: recipe.rollout.stop_token_ids is a list: write it in brackets, quoted for the "
        "shell (recipe.rollout.stop_token_ids='[1,2]')",
    ),
    Bad(
        "a list written slime's way, one value after another",
        ("recipe.rollout.stop=</answer>", "<end>"),
        "recipe.rollout.stop = '</answer> <end>'",
        "fix: write the list in brackets, quoted for the shell: "
        """recipe.rollout.stop='["</answer>", "<end>"]'""",
    ),
    Bad(
        "a single value written with a second after it",
        ("recipe.optim.lr=1e-6", "2e-6"),
        "recipe.optim.lr = '1e-6 2e-6'",
        "or sweep them, one run each, with commas and -m: -m 'recipe.optim.lr=1e-6,2e-6'",
    ),
    Bad(
        "a path with a space, unquoted",
        ("recipe.data.prompt_data=/tmp/my", "data.jsonl"),
        "recipe.data.prompt_data = '/tmp/my data.jsonl'",
        "fix: a value with spaces is one word for the shell: "
        "'recipe.data.prompt_data=/tmp/my data.jsonl'",
    ),
    Bad(
        "a string Hydra reads only quoted",
        ("recipe.rollout.stop=[</answer>]",),
        "recipe.rollout.stop",
        "goes in double quotes inside the shell's single quotes "
        """(recipe.rollout.stop='["</answer>", "a b"]')""",
    ),
    Bad(
        "an eval dataset added by index",
        ("recipe.eval.datasets.1.path=/x.jsonl",),
        "recipe.eval.datasets.1.path = '/x.jsonl'",
        "fix: write the whole list: recipe.eval.datasets='[{name: ..., path: ...}, {name:",
    ),
    Bad(
        "unknown key",
        ("recipe.rollout.temprature=1.0",),
        "recipe.rollout.temprature",
        "Did you mean 'temperature'?",
    ),
    Bad("unknown group choice", ("model=qwen3-tinyy",), "model", "Did you mean 'qwen3-tiny'?"),
    Bad(
        "a primary config that is not there",
        ("--config-name", "nope"),
        "--config-name",
        "no top-level config 'nope'",
    ),
    Bad("the layout group set to null", ("layout=null",), "layout", "write ~layout to leave it"),
    Bad("the recipe group set to null", ("recipe=null",), "recipe", "choose one of: grpo_dapo"),
    Bad("the model group set to null", ("model=null",), "model", "choose one of: deepseek-v3"),
    Bad("the hardware group set to null", ("hardware=null",), "hardware", "choose one of: cpu"),
    Bad("unknown section", ("recipee.rollout.temperature=1.0",), "recipee", "Did you mean"),
    Bad(
        "a slime flag where an override goes",
        ("--lr", "1e-6"),
        "recipe.optim.lr",
        "fix: write recipe.optim.lr=1e-6",
    ),
    Bad(
        "a slime flag of several values",
        ("--rollout-stop-token-ids", "1", "2"),
        "recipe.rollout.stop_token_ids",
        "fix: write recipe.rollout.stop_token_ids='[1, 2]'",
    ),
    Bad(
        "a slime flag whose value rlpost counts in other units",
        ("--update-weight-buffer-size", "536870912"),
        "engine.weight_bucket_mb",
        "fix: write engine.weight_bucket_mb=512",
    ),
    Bad(
        "a key written as a flag",
        ("--temperature=0.8",),
        "--temperature",
        "fix: write recipe.rollout.temperature=0.8",
    ),
    Bad(
        "slime's flag for an SGLang option",
        ("--sglang-mem-fraction-static", "0.7"),
        "layout.rollout.sglang.mem_fraction_static",
        "fix: write layout.rollout.sglang.mem_fraction_static=0.7",
    ),
    Bad(
        "an SGLang option in the engine section",
        ("engine.mem_fraction_static=0.7",),
        "engine.mem_fraction_static",
        "fix: use layout.rollout.sglang.mem_fraction_static instead",
    ),
    Bad("a misspelt Hydra flag", ("--config_dir", "conf"), "--config_dir", "--config-dir?"),
    Bad(
        "verl's keys for the batch, the group size and the estimator",
        (
            "data.train_batch_size=1024",
            "actor_rollout_ref.rollout.n=5",
            "algorithm.adv_estimator=grpo",
        ),
        "recipe.rollout.n_samples_per_prompt",
        "fix: write recipe.rollout.batch_size=1024",
    ),
    Bad(
        "verl's mini-batch, counted in prompts where rlpost counts samples",
        ("actor_rollout_ref.rollout.n=5", "actor_rollout_ref.actor.ppo_mini_batch_size=256"),
        "actor_rollout_ref.actor.ppo_mini_batch_size",
        "fix: write recipe.train.global_batch_size=1280",
    ),
    Bad(
        "verl's overlong buffer, which rlpost has no setting for",
        ("reward_model.overlong_buffer.enable=True",),
        "reward_model.overlong_buffer.enable",
        "rlpost has no overlong penalty",
    ),
    Bad(
        "OpenRLHF's flags for the batch, the group, the rate and the KL",
        (
            "--actor_learning_rate",
            "5e-7",
            "--n_samples_per_prompt",
            "8",
            "--rollout_batch_size",
            "128",
            "--init_kl_coef",
            "0.01",
            "--use_kl_loss",
        ),
        "recipe.optim.lr",
        "fix: write recipe.algo.use_kl_loss=true recipe.algo.kl_loss_coef=0.01",
    ),
    Bad(
        "TRL's GRPO flags",
        ("--learning_rate", "1e-6", "--num_generations", "8", "--beta", "0.04", "--use_vllm"),
        "recipe.rollout.n_samples_per_prompt",
        "fix: write recipe.algo.use_kl_loss=true recipe.algo.kl_loss_coef=0.04",
    ),
    Bad(
        "NeMo-RL's keys for the batch, the group, the length and the KL",
        (
            "grpo.num_prompts_per_step=32",
            "grpo.num_generations_per_prompt=16",
            "policy.max_total_sequence_length=4096",
            "data.max_input_seq_length=1024",
            "loss_fn.reference_policy_kl_penalty=0.01",
        ),
        "grpo.num_generations_per_prompt",
        "fix: write recipe.data.max_prompt_len=1024 recipe.rollout.max_response_len=3072",
    ),
    Bad(
        "a group the defaults list chooses, added with +",
        ("+model=qwen3-0.6b",),
        "model = 'qwen3-0.6b'",
        "fix: write model=qwen3-0.6b (without '+')",
    ),
    Bad(
        "the group the defaults list chooses, added again with +",
        ("+model=qwen3-tiny",),
        "model is chosen twice",
        "fix: write model=NAME (without '+')",
    ),
    Bad(
        "a group force-added with ++",
        ("++hardware=cpu",),
        "hardware = 'cpu'",
        "fix: write hardware=cpu (without '++')",
    ),
    Bad(
        "a group every run needs, deleted",
        ("~model",),
        "model   (command line: ~model)",
        "fix: choose one instead: model=NAME, one of: deepseek-v3",
    ),
    Bad(
        "the optional layout added with +",
        ("+layout=qwen3-tiny_cpu",),
        "layout is chosen twice",
        "fix: write layout=NAME (without '+')",
    ),
]


def _case(name: str, argv: tuple[str, ...], names: str, says: str) -> Bad:
    return Bad(name, argv, names, says)


def write_fixtures(root: Path) -> Path:
    """Writes the files the file cases point at into `root` (an empty folder) and returns it:
    data, checkpoints, user configs, a used run dir."""
    good = (ASSETS / "data" / "arith_train.jsonl").read_text().splitlines()
    data = root / "data"
    data.mkdir()
    (data / "bad_json.jsonl").write_text("\n".join([good[0], "{not json", good[1]]) + "\n")
    (data / "no_input.jsonl").write_text(good[0] + '\n{"question": "1+1?", "label": "2"}\n')
    (data / "no_label.jsonl").write_text(good[0] + '\n{"prompt": "1+1?"}\n')
    (data / "empty_label.jsonl").write_text(good[0] + '\n{"prompt": "1+1?", "label": " "}\n')
    (data / "bad_rm_type.jsonl").write_text(
        '{"prompt": "1+1?", "label": "2", "metadata": {"rm_type": "mth"}}\n'
    )
    (data / "ifbench_rm_type.jsonl").write_text(
        '{"prompt": "Write two lines.", "label": "2", "metadata": {"rm_type": "ifbench"}}\n'
    )
    (data / "choice_label.jsonl").write_text(
        '{"prompt": "Capital of France?", "label": "Madrid", '
        '"metadata": {"choices": ["London", "Paris", "Rome", "Oslo"]}}\n'
    )
    (data / "typed_line.jsonl").write_text(
        '{"prompt": "1+1?", "label": "2", "metadata": {"rm_type": "math"}}\n'
    )
    (data / "list_label.jsonl").write_text('{"prompt": "1+1?", "label": ["2"]}\n')
    (data / "bad_tools.jsonl").write_text('{"prompt": "1+1?", "label": "2", "tools": "calc"}\n')
    (data / "chat_with_tools.jsonl").write_text(
        '{"prompt": "1+1?", "label": "2", "tools": [{"type": "function", '
        '"function": {"name": "calc"}}]}\n'
    )
    (data / "remote_line.jsonl").write_text(
        '{"prompt": "1+1?", "label": "2", "metadata": {"rm_type": "remote"}}\n'
    )
    (data / "templated.jsonl").write_text(
        '{"prompt": "<|im_start|>user\\n1+1?<|im_end|>\\n", "label": "2"}\n'
    )
    (data / "empty.jsonl").write_text("\n")
    (data / "a_list.jsonl").write_text('["prompt", "label"]\n')
    (root / "file_not_folder").write_text("x")
    weightless = root / "no_weights"
    weightless.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY_MODEL / name, weightless / name)
    no_template = root / "no_template"
    no_template.mkdir()
    for item in TINY_MODEL.iterdir():
        if item.name != "chat_template.jinja":
            (no_template / item.name).symlink_to(item)
    never_thinks = root / "never_thinks"  # a tokenizer and template without </think>
    never_thinks.mkdir()
    for item in TINY_MODEL.iterdir():
        if item.name in ("tokenizer.json", "chat_template.jinja"):
            (never_thinks / item.name).write_text(item.read_text().replace("think>", "thonk>"))
        else:
            (never_thinks / item.name).symlink_to(item)
    write_extended_tokenizer(root / "extended_tokenizer")
    conf = root / "conf" / "recipe"
    conf.mkdir(parents=True)
    (conf / "typo.yaml").write_text(
        "defaults:\n  - grpo_tiny_math\n  - _self_\n\nname: typo\nrollout:\n  temprature: 0.9\n"
    )
    (conf / "bad_base.yaml").write_text("defaults:\n  - grpo_tiny_mth\n  - _self_\nname: b\n")
    (conf / "broken.yaml").write_text("name: broken\nrollout: [unclosed\n")
    (conf / "twice.yaml").write_text(
        "defaults:\n  - grpo_tiny_math\n  - _self_\n\nname: twice\noptim:\n  lr: 1.0e-5\n"
        "rollout:\n  temperature: 0.9\noptim:\n  weight_decay: 0.1\n"
    )
    (conf / "cold.yaml").write_text(
        "defaults:\n  - grpo_tiny_math\n  - _self_\n\nname: cold\nrollout:\n  temperature: -1\n"
    )
    used = root / "used_run" / "ckpt" / "rollout_5"
    used.mkdir(parents=True)
    (used / "manifest.json").write_text("{}")
    (root / "not_a_checkpoint").mkdir()
    own = root / "own_folder"  # a folder of the user's: no run's directory
    own.mkdir()
    (own / "config.yaml").write_text("mine: true\n")
    (own / "metrics.jsonl").write_text('{"mine": 1}\n')
    other_shape = root / "other_shape"  # a Qwen3 of 2 layers of 128, the model's: 4 of 256
    other_shape.mkdir()
    for item in TINY_MODEL.iterdir():
        if item.name != "config.json":
            (other_shape / item.name).symlink_to(item)
    config = json.loads((TINY_MODEL / "config.json").read_text())
    smaller = {**config, "num_hidden_layers": 2, "hidden_size": 128}
    (other_shape / "config.json").write_text(json.dumps(smaller))
    torch_dist = root / "ref_torch_dist"
    torch_dist.mkdir()
    (torch_dist / "metadata.json").write_text("{}")
    # FP8 checkpoints: one scale per tensor (not read), one scale per channel (not SGLang's)
    for name, quant in (
        ("fp8_per_tensor", {"quant_method": "fp8", "activation_scheme": "static"}),
        ("fp8_channel", {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": None,
                         "weight_granularity": "channel"}),
    ):  # fmt: skip
        folder = root / name
        folder.mkdir()
        for item in TINY_MODEL.iterdir():
            if item.name != "config.json":
                (folder / item.name).symlink_to(item)
        config = json.loads((TINY_MODEL / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "quantization_config": quant}))
    return root


def write_extended_tokenizer(folder: Path) -> Path:
    """The tiny model with a token added to its tokenizer past the model's vocabulary (id 320
    of 320 embedding rows), as `tokenizer.add_tokens` then `save_pretrained` leaves it when
    the embeddings are not resized."""
    folder.mkdir()
    for item in TINY_MODEL.iterdir():
        if item.name != "tokenizer.json":
            (folder / item.name).symlink_to(item)
    tokenizer = json.loads((TINY_MODEL / "tokenizer.json").read_text())
    vocab_size = json.loads((TINY_MODEL / "config.json").read_text())["vocab_size"]
    tokenizer["added_tokens"].append(
        {"id": vocab_size, "content": "<tool_call>", "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True}
    )  # fmt: skip
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    return folder


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Files the file cases point at: data, checkpoints, user configs, a used run dir."""
    return write_fixtures(tmp_path_factory.mktemp("bad_inputs"))


def file_cases(root: Path) -> list[Bad]:
    data, conf = root / "data", root / "conf"
    eval_path = "recipe.eval.datasets.0.path"
    cases = [
        _case(
            "checkpoint folder missing",
            ("model.hf_checkpoint=/no/such/ckpt",),
            "model.hf_checkpoint",
            "never downloads",
        ),
        _case(
            "checkpoint is a file",
            (f"model.hf_checkpoint={root / 'file_not_folder'}",),
            "model.hf_checkpoint",
            "not a checkpoint folder",
        ),
        _case(
            "checkpoint without weights",
            (f"model.hf_checkpoint={root / 'no_weights'}",),
            "model.hf_checkpoint",
            "no weights",
        ),
        _case(
            "tokenizer without a chat template",
            (f"model.hf_checkpoint={root / 'no_template'}",),
            "recipe.data.apply_chat_template",
            "no chat template",
        ),
        _case(
            "the deepscaler reward for a model that never writes </think>",
            (
                f"model.hf_checkpoint={root / 'never_thinks'}",
                f"model.ref_load={root / 'never_thinks'}",
                "recipe.rollout.reward.type=deepscaler",
            ),
            "recipe.rollout.reward.type",
            "so every sample it grades would score 0",
        ),
        _case(
            "reference checkpoint missing",
            ("model.ref_load=/no/such/ref", "recipe.algo.kl_metric_interval=2"),
            "model.ref_load",
            "no such checkpoint",
        ),
        _case(
            "initial policy weights missing",
            ("model.load=/no/such/sft",),
            "model.load",
            "no such checkpoint",
        ),
        _case(
            "initial policy weights of another shape",
            (f"model.load={root / 'other_shape'}",),
            "model.load",
            "its config.json says num_hidden_layers=2, hidden_size=128, where the model says "
            "num_layers=4, hidden_size=256: the policy would start from the weights of another",
        ),
        _case(
            "a reference of another shape",
            (f"model.ref_load={root / 'other_shape'}", "recipe.algo.kl_metric_interval=2"),
            f"model.ref_load = '{root / 'other_shape'}'",
            "the KL would be measured against another network",
        ),
        _case(
            "a torch_dist reference for the torch trainer",
            (f"model.ref_load={root / 'ref_torch_dist'}", "recipe.algo.kl_metric_interval=2"),
            "model.ref_load",
            "the torch trainer cannot read",
        ),
        _case(
            "a tokenizer with tokens past the model's vocabulary",
            (f"model.hf_checkpoint={root / 'extended_tokenizer'}",),
            "model.hf_checkpoint",
            "'<tool_call>' = 320; the embedding and output layer have no row for them",
        ),
        _case(
            "an FP8 checkpoint with one scale per tensor",
            (f"model.hf_checkpoint={root / 'fp8_per_tensor'}",),
            "model.hf_checkpoint",
            "one scale per tensor (no weight_block_size) is not supported",
        ),
        _case(
            "a channel-FP8 checkpoint for SGLang engines",
            ("hardware=h100x8", f"model.hf_checkpoint={root / 'fp8_channel'}"),
            "model.hf_checkpoint",
            "--strategy block",
        ),
        _case(
            "prompt file missing",
            ("recipe.data.prompt_data=/no/such.jsonl",),
            "recipe.data.prompt_data",
            "no such file",
        ),
        _case(
            "prompt file is a folder",
            (f"recipe.data.prompt_data={data}",),
            "recipe.data.prompt_data",
            "has no suffix (a folder, or a file named without one)",
        ),
        _case(
            "prompt line that is not JSON",
            (f"recipe.data.prompt_data={data / 'bad_json.jsonl'}",),
            f"{data / 'bad_json.jsonl'}:2",
            "not valid JSON",
        ),
        _case(
            "prompt line without the input key",
            (f"recipe.data.prompt_data={data / 'no_input.jsonl'}",),
            f"{data / 'no_input.jsonl'}:2",
            "'prompt' is missing (this line's keys: label, question)",
        ),
        _case(
            "prompt line with an empty label",
            (f"recipe.data.prompt_data={data / 'empty_label.jsonl'}",),
            f"{data / 'empty_label.jsonl'}:2",
            "has an empty 'label'",
        ),
        _case(
            "prompt line without a label",
            (f"recipe.data.prompt_data={data / 'no_label.jsonl'}",),
            f"{data / 'no_label.jsonl'}:2",
            "'label' is missing",
        ),
        _case(
            "prompt line with an unknown reward type",
            (f"recipe.data.prompt_data={data / 'bad_rm_type.jsonl'}",),
            f"{data / 'bad_rm_type.jsonl'}:1",
            "not a reward type",
        ),
        _case(
            "prompt line graded by slime's ifbench",
            (f"recipe.data.prompt_data={data / 'ifbench_rm_type.jsonl'}",),
            f"{data / 'ifbench_rm_type.jsonl'}:1",
            "metadata rm_type 'ifbench' is not available: slime's ifbench grades with",
        ),
        _case(
            "multiple-choice label that names no option",
            (
                f"recipe.data.prompt_data={data / 'choice_label.jsonl'}",
                "recipe.rollout.reward.type=gpqa",
            ),
            f"{data / 'choice_label.jsonl'}:1",
            "names no option: give its letter (A-D)",
        ),
        _case(
            "prompt line naming a reward type a group function never reads",
            (
                f"recipe.data.prompt_data={data / 'typed_line.jsonl'}",
                "recipe.rollout.reward.group=true",
                "recipe.rollout.reward.custom_function=rlpost_test_hooks.rank_in_group",
            ),
            f"{data / 'typed_line.jsonl'}:1",
            "the group function (reward.group) scores every sample without reading it",
        ),
        _case(
            "prompt line whose label is a list",
            (f"recipe.data.prompt_data={data / 'list_label.jsonl'}",),
            f"{data / 'list_label.jsonl'}:1",
            "'label' is of type list; a label must be a string or a number",
        ),
        _case(
            "prompt line whose tools are not tool schemas",
            (f"recipe.data.prompt_data={data / 'bad_tools.jsonl'}",),
            f"{data / 'bad_tools.jsonl'}:1",
            "'tools' is a string that is not JSON",
        ),
        _case(
            "prompt line with tools that no template would write into the prompt",
            (
                f"recipe.data.prompt_data={data / 'chat_with_tools.jsonl'}",
                "recipe.data.apply_chat_template=false",
            ),
            f"{data / 'chat_with_tools.jsonl'}:1",
            "only the chat template writes into a prompt",
        ),
        _case(
            "prompt line graded by a reward server whose URL is not set",
            (f"recipe.data.prompt_data={data / 'remote_line.jsonl'}",),
            f"{data / 'remote_line.jsonl'}:1",
            "remote_url is not set: its every sample would fail",
        ),
        _case(
            "prompt line rendered with the chat template already",
            (f"recipe.data.prompt_data={data / 'templated.jsonl'}",),
            f"{data / 'templated.jsonl'}:1",
            "already holds the chat template's marker '<|im_start|>'",
        ),
        _case(
            "prompt line that is a list",
            (f"recipe.data.prompt_data={data / 'a_list.jsonl'}",),
            f"{data / 'a_list.jsonl'}:1",
            "not an object",
        ),
        _case(
            "empty prompt file",
            (f"recipe.data.prompt_data={data / 'empty.jsonl'}",),
            "recipe.data.prompt_data",
            "holds no prompts",
        ),
        _case(
            "eval file missing",
            ("recipe.eval.datasets.0.path=/no/eval.jsonl",),
            eval_path,
            "no such file",
        ),
        _case(
            "eval line without a label",
            (f"recipe.eval.datasets.0.path={data / 'no_label.jsonl'}",),
            f"{data / 'no_label.jsonl'}:2",
            "'label' is missing",
        ),
        _case(
            "resume target missing",
            ("run.resume=/no/such/run",),
            "run.resume",
            "no such checkpoint",
        ),
        _case(
            "resume target that is not a checkpoint",
            (f"run.resume={root / 'not_a_checkpoint'}",),
            "run.resume",
            "holds no complete checkpoint",
        ),
        _case(
            "run directory that cannot be written",
            ("run.dir=/proc/rlpost-run",),
            "run.dir",
            "cannot be created",
        ),
        _case(
            "run directory holding another run",
            (f"run.dir={root / 'used_run'}",),
            "run.dir",
            "already holds checkpoints",
        ),
        _case(
            "an evaluation writing into a run's directory",
            ("mode=eval", f"run.dir={root / 'used_run'}"),
            "run.dir",
            "mode=eval writes a run directory of its own",
        ),
        _case(
            "run directory that is a folder of the user's",
            (f"run.dir={root / 'own_folder'}",),
            f"run.dir = '{root / 'own_folder'}'",
            "holds config.yaml, metrics.jsonl; it is no run's directory",
        ),
        _case(
            "hook module missing",
            (
                "recipe.rollout.over_sampling_batch_size=16",
                "recipe.rollout.dynamic_sampling_filter=nope.filters.keep",
            ),
            "recipe.rollout.dynamic_sampling_filter",
            "was not found",
        ),
        _case(
            "hook with the wrong signature",
            ("recipe.rollout.generate_function=rlpost.filters.check_reward_nonzero_std",),
            "recipe.rollout.generate_function",
            "expected async def",
        ),
        _case(
            "hook attribute typo",
            ("recipe.rollout.reward.custom_function=rlpost.filters.pop_frst",),
            "recipe.rollout.reward.custom_function",
            "Did you mean 'rlpost.filters.pop_first'",
        ),
        _case(
            "user recipe with a typo",
            ("--config-dir", str(conf), "recipe=typo"),
            "typo.yaml",
            "Did you mean 'temperature'?",
        ),
        _case(
            "user recipe with a bad defaults entry",
            ("--config-dir", str(conf), "recipe=bad_base"),
            "bad_base.yaml",
            "grpo_tiny_math",
        ),
        _case(
            "user recipe that is not YAML",
            ("--config-dir", str(conf), "recipe=broken"),
            "broken.yaml",
            "fix:",
        ),
        _case(
            "user recipe with a key written twice",
            ("--config-dir", str(conf), "recipe=twice"),
            "twice.yaml",
            "optim is written twice in",
        ),
        _case(
            "user recipe with a bad value",
            ("--config-dir", str(conf), "recipe=cold"),
            "cold.yaml",
            "must be > 0",
        ),
    ]
    return cases


DRIVER = """
import contextlib, io, json, os, sys, time
sys.path.insert(0, sys.argv[2])
from rlpost.cli import launch

results = []
for case in json.loads(open(sys.argv[1]).read()):
    err = io.StringIO()
    started, cpu = time.perf_counter(), time.process_time()
    code = 0
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            launch.main(case["argv"])
        except SystemExit as exc:
            code = exc.code
        except BaseException as exc:
            import traceback
            err.write("Traceback (from the driver)\\n" + traceback.format_exc())
            code = -1
    ray = sys.modules.get("ray")
    results.append({
        "name": case["name"], "code": code, "stderr": err.getvalue(),
        "seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu,
        "ray_started": bool(ray is not None and ray.is_initialized()),
    })
print(json.dumps(results))
"""


def run_corpus(cases: list[Bad], workdir: Path) -> dict[str, dict]:
    """Runs the cases through DRIVER in one interpreter; by case name: `code`, `stderr`,
    `seconds` and `cpu_seconds` of the launch, `ray_started`. Run dirs go under workdir/runs."""
    spec = workdir / "cases.json"
    runs = workdir / "runs"
    items = []
    for i, case in enumerate(cases):
        argv = list(case.argv)
        if not any(a.startswith("run.dir=") for a in argv):
            argv.append(f"run.dir={runs / str(i)}")
        items.append({"name": case.name, "argv": [*argv, f"hydra.run.dir={runs / 'hydra'}"]})
    spec.write_text(json.dumps(items))
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_API_KEY", "RAY_ADDRESS")}
    env["NETRC"] = str(workdir / "no-netrc")
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(spec), str(REPO / "tests" / "hooks_fixtures")],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {r["name"]: r for r in json.loads(done.stdout.strip().splitlines()[-1])}


def test_every_bad_input_is_refused_before_anything_starts(fixtures: Path, tmp_path: Path) -> None:
    cases = CASES + file_cases(fixtures)
    assert len(cases) >= 60
    assert len({c.name for c in cases}) == len(cases)
    results = run_corpus(cases, tmp_path)
    problems = []
    for case in cases:
        got = results[case.name]
        err = got["stderr"]
        wrong = []
        if got["code"] != 2:
            wrong.append(f"exit {got['code']}")
        if "Traceback" in err:
            wrong.append("a traceback")
        if case.names not in err:
            wrong.append(f"no mention of {case.names!r}")
        if case.says not in err:
            wrong.append(f"no {case.says!r}")
        if "fix:" not in err:
            wrong.append("no fix")
        if got["ray_started"]:
            wrong.append("Ray started")
        if wrong:
            problems.append(f"{case.name}: {', '.join(wrong)}\n{err[-1500:]}")
    assert not problems, "\n\n".join(problems)
    written = [p for p in (tmp_path / "runs").iterdir() if p.name != "hydra"]
    assert written == [], f"run directories written by refused launches: {written}"
    own = sorted(p.name for p in (fixtures / "own_folder").iterdir())
    assert own == ["config.yaml", "metrics.jsonl"], f"the user's folder now holds {own}"


def test_a_bad_launch_is_refused_from_the_command_line(tmp_path: Path) -> None:
    command = [
        sys.executable,
        str(REPO / "launch.py"),
        "recipe.rollout.reward.type=mth",
        f"run.dir={tmp_path / 'run'}",
    ]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "Did you mean 'math'?" in done.stderr and "fix:" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()


def test_mode_plan_refuses_auto_resume_without_a_run_dir_as_its_launch_would(
    tmp_path: Path,
) -> None:
    """mode=plan plans the training launch of its config, and a config error of that launch
    is its own (as rlpost validate says): run.resume=auto without run.dir would start every
    launch at rollout 0. With run.dir the same plan prints."""
    target = ["model=qwen3-4b", "recipe=grpo_dapo", "hardware=h100x8", "mode=plan"]
    command = [sys.executable, str(REPO / "launch.py"), *target, "run.resume=auto"]
    # with --config-dir too, which makes the plan a Hydra job's (it gave run.dir its folder)
    user = ["--config-dir", str(REPO / "examples" / "my_configs")]
    for given in (command, [*command[:2], *user, *command[2:]]):
        done = subprocess.run(given, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stdout[-2000:]
        assert "run.resume = 'auto'" in done.stderr and "starts again at rollout 0" in done.stderr
        assert "fix: set run.dir" in done.stderr and "Traceback" not in done.stderr
        assert "rlpost plan:" not in done.stdout
    done = subprocess.run(
        [*command, f"run.dir={tmp_path / 'run'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "rlpost plan:" in done.stdout, done.stderr[-2000:]


def test_a_refused_launch_leaves_no_run_directory(tmp_path: Path) -> None:
    """Hydra makes the job's folder (runs/<date>/<time>, the default run.dir, which a
    training launch claims) before validation runs; a refusal takes it away again, and the
    date folder with it when that was all it held. Another run's date folder stays."""
    command = [sys.executable, str(REPO / "launch.py"), "recipe.rollout.temperature=-1"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "recipe.rollout.temperature" in done.stderr, done.stderr
    assert list((tmp_path / "runs").iterdir()) == []
    today = tmp_path / "runs" / datetime.now().strftime("%Y-%m-%d")  # the launch's date
    kept = today / "00-00-00" / "config.yaml"  # another run's, earlier today
    kept.parent.mkdir(parents=True)
    kept.write_text("{}")
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert sorted((tmp_path / "runs").rglob("*")) == [today, kept.parent, kept]


def test_a_refused_sweep_leaves_no_sweep_folder(tmp_path: Path) -> None:
    """A sweep whose jobs are refused is refused before Hydra makes its sweep folder."""
    command = [sys.executable, str(REPO / "launch.py"), "-m", "recipe.rollout.temperature=-1,-2"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "recipe.rollout.temperature" in done.stderr, done.stderr
    assert not (tmp_path / "runs").exists()


def test_a_sweep_refuses_a_later_job_before_the_first_trains(tmp_path: Path) -> None:
    """Every job's config is checked before the first starts: job 1's bad value is refused
    naming the job, and job 0 never trains (no run directory, no summary)."""
    command = [
        sys.executable, str(REPO / "launch.py"), "-m",
        "recipe.rollout.temperature=0.8,-1", "recipe.rollout.num_rollout=1",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "in job 1 (recipe.rollout.temperature=-1)" in done.stderr
    assert "no job has started" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists()


def test_a_launch_with_its_run_dir_elsewhere_leaves_no_empty_hydra_folder(tmp_path: Path) -> None:
    """A job that writes nothing in Hydra's time-named folder (here mode=slime_args, given
    that folder explicitly so Hydra makes it) leaves none behind."""
    command = [
        sys.executable, str(REPO / "launch.py"), "mode=slime_args",
        "hydra.run.dir=runs/${now:%Y-%m-%d}/${now:%H-%M-%S}", f"run.dir={tmp_path / 'elsewhere'}",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert list((tmp_path / "runs").glob("*/*")) == []
