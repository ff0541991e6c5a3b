"""Mistakes users of other RL post-training frameworks made, as their trackers report them.

Each case names the issue or pull request (its URL), quotes the symptom its author saw - a
late failure, a silently wrong run, or a hang - and writes the same mistake in rlpost's
config. A training launch (`mode=train`) with it must stop before anything starts: exit
status 2, no traceback, no Ray, no run directory, naming the key, the value and a fix. The
fix it gives, applied to the same launch, must itself validate (`rlpost validate
--no-local-checks`: schema, hooks, plan and memory). How long a refusal takes (the target:
under 3 s) is measured by `benchmarks/refusals.py`, which runs this corpus through
`run_mistakes`.

Most come from the trackers of the frameworks rlpost is measured against (`PEERS`: slime,
verl, OpenRLHF, TRL, NeMo-RL, AReaL); the rest from the projects under or beside them
(SGLang, Megatron-LM, NeMo-Gym, miles, ...), where the same mistake was reported.

`NOTED` holds tracker mistakes that are valid, so not refused: `rlpost validate` passes them
and its plan notes say what the run would do instead of what was meant.

The cases run in one interpreter (the launcher's own `main`), as test_bad_inputs.py's corpus
does; each is a test of its own so that a failure names the issue it came from.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GLM9 = ("model=glm4-9b", "recipe=grpo_dapo", "hardware=h100x8")
QWEN = ("model=qwen3-4b", "recipe=grpo_dapo", "hardware=h100x8")
FLASH = ("model=glm4.7-flash", "recipe=grpo_dapo", "hardware=h100x8")
FLASH16 = ("model=glm4.7-flash", "recipe=grpo_dapo", "hardware=h100x16")
# The peers' repositories (verl and AReaL moved; both names hold their issues).
PEERS = frozenset(
    {
        "THUDM/slime",
        "volcengine/verl",
        "verl-project/verl",
        "OpenRLHF/OpenRLHF",
        "huggingface/trl",
        "NVIDIA-NeMo/RL",
        "inclusionAI/AReaL",
        "areal-project/AReaL",
    }
)
DECOUPLED_CPU = ("layout.colocate=false", "layout.train.num_gpus=1", "layout.rollout.num_gpus=1")
SG = "++layout.rollout.sglang"


@dataclass(frozen=True)
class Mistake:
    name: str
    url: str
    symptom: str  # what the author saw, quoted
    argv: tuple[str, ...]  # the mistake in rlpost's config (the CPU default unless named)
    key: str  # the key the refusal names
    says: str  # part of the refusal's reason
    fix: tuple[str, ...]  # overrides that replace (same key) or join argv: the fix it names
    fix_says: str  # part of the refusal's fix line
    value: str | None = None  # the value as the message shows it, where the head cannot
    own_dir: bool = True  # False: the launch gets no run.dir


MISTAKES: list[Mistake] = [
    # ---- batch arithmetic -----------------------------------------------------------------
    Mistake(
        "micro-batch larger than a rank's share of the step",
        "https://github.com/verl-project/verl/pull/833",
        "original assertion is inside `if`, only executed when `ppo_micro_batch_size` is not "
        "None, and otherwise may results in NaN when training",
        (
            "recipe.train.use_dynamic_batch_size=false",
            "recipe.train.max_tokens_per_gpu=null",
            "recipe.train.micro_batch_size=64",
        ),
        "recipe.train.micro_batch_size",
        "more than a DP rank gets per optimizer step",
        ("recipe.train.micro_batch_size=8",),
        "<= 32",
    ),
    Mistake(
        "global batch larger than a rollout",
        "https://github.com/THUDM/slime/pull/2366",
        "computes `train_iters = 2 * 8 * 8 // 256 = 0` ... fails during actor bring-up with a "
        "bare `AssertionError` ... (`assert self.lr_decay_steps > 0`, no message)",
        ("recipe.train.global_batch_size=128",),
        "recipe.train.global_batch_size",
        "more than the 64 samples a rollout makes",
        ("recipe.train.global_batch_size=64",),
        "global_batch_size to 64",
    ),
    Mistake(
        "a global batch the data-parallel ranks cannot split",
        "https://github.com/OpenRLHF/OpenRLHF/issues/346",
        "AssertionError: Check batch related parameters. train_batch_size is not equal to "
        "micro_batch_per_gpu * gradient_acc_step * world_size 256 != 2 * 18 * 7 (the "
        "maintainers: 'Try setting the batch size to a multiple of 7. such as 126')",
        (
            *QWEN,
            "layout.colocate=false",
            "layout.train.num_gpus=7",
            "layout.train.tp=1",
            "layout.train.sequence_parallel=false",
            "layout.rollout.num_gpus=1",
            "layout.rollout.gpus_per_engine=1",
        ),
        "recipe.train.global_batch_size",
        "over dp=7 data-parallel ranks",
        ("recipe.train.global_batch_size=280", "recipe.rollout.batch_size=35"),
        "recipe.train.global_batch_size: 280 with recipe.rollout.batch_size: 35 prompts",
    ),
    # ---- algorithm ------------------------------------------------------------------------
    Mistake(
        "a group filter that no group of one passes",
        "https://github.com/verl-project/verl/issues/953",
        "ValueError: num_gen_batches=10 > max_num_gen_batches=10. Generated too many. "
        "Please check your data.",
        (
            "recipe.algo.advantage_estimator=reinforce_plus_plus",
            "recipe.rollout.n_samples_per_prompt=1",
            "recipe.train.global_batch_size=8",
            "recipe.rollout.over_sampling_batch_size=16",
            "recipe.rollout.dynamic_sampling_filter=rlpost.filters.check_reward_nonzero_std",
        ),
        "recipe.rollout.dynamic_sampling_filter",
        "every group is dropped",
        ("recipe.rollout.n_samples_per_prompt=8",),
        "n_samples_per_prompt: 8",
    ),
    Mistake(
        "grpo with one response per prompt",
        "https://github.com/huggingface/trl/pull/3199",
        "This PR fixes a confusing error message when users try to use `num_generations=1` "
        "with the GRPO trainer. ... The real issue is that GRPO requires at least 2 "
        "generations to function properly.",
        ("recipe.rollout.n_samples_per_prompt=1", "recipe.train.global_batch_size=8"),
        "recipe.rollout.n_samples_per_prompt",
        "a group of one sample always gets advantage 0",
        ("recipe.rollout.n_samples_per_prompt=8",),
        "sample several responses per prompt",
    ),
    Mistake(
        "a warmup as long as the run",
        "https://github.com/PrimeIntellect-ai/prime-rl/issues/968",
        "Error when `warmup_steps == max_steps` ... We crash when all steps are scheduler "
        "warmup steps",
        ("recipe.optim.lr_warmup_steps=60",),
        "recipe.optim.lr_warmup_steps",
        "not below the run's 60 optimizer steps",
        ("recipe.optim.lr_warmup_steps=3",),
        "use fewer warmup steps",
    ),
    Mistake(
        "the clip written as 1 + epsilon",
        "https://github.com/redai-studio/Relax/issues/23",
        "--eps-clip 3.0 --eps-clip-high 0.28 ... 1-3=-2 Why? (a slime launch script; the "
        "maintainers: 'mixed up with `--eps-clip-c`')",
        ("recipe.algo.eps_clip=3.0",),
        "recipe.algo.eps_clip",
        "the low side never clips",
        ("recipe.algo.eps_clip=0.2",),
        "e.g. 0.2",
    ),
    Mistake(
        "the clip-higher written as the ratio bound",
        "https://github.com/thunlp/JustRL/issues/2",
        "请问文章里写clip ratio是[0.8, 1.28]，如何理解呢？主流的取值一般采用[0.2, 0.28] (the paper "
        "writes the bounds, verl takes the epsilons; JustRL trains with verl)",
        ("recipe.algo.eps_clip_high=1.28",),
        "recipe.algo.eps_clip_high",
        "not the bound itself",
        ("recipe.algo.eps_clip_high=0.28",),
        "e.g. 0.28",
    ),
    Mistake(
        "gspo with a token-level clip range",
        "https://github.com/huggingface/trl/issues/3834",
        "The current implementation of GSPO would use the default clipping threshold of "
        "`epsilon=0.2` which works for GRPO but is unsuitable for GSPO. ... In their "
        "experiments they use values in the range [3e-4, 4e-4]",
        ("recipe.algo.advantage_estimator=gspo",),
        "recipe.algo.eps_clip",
        "never binds",
        ("recipe.algo.eps_clip=0.0003", "recipe.algo.eps_clip_high=0.0004"),
        "eps_clip: 3e-4",
    ),
    Mistake(
        "gspo averaged over tokens",
        "https://github.com/huggingface/trl/issues/3823",
        'if we use `importance_sampling_level == "sequence"` ... the advantage is multiplied '
        "by the number of non-padding tokens for each sample. and then we sum/mean to get the "
        "loss. ... as far as i understand this is not how the calculation should be",
        (
            "recipe.algo.advantage_estimator=gspo",
            "recipe.algo.eps_clip=0.0003",
            "recipe.algo.eps_clip_high=0.0004",
            "recipe.algo.loss_reduction=token_mean",
        ),
        "recipe.algo.loss_reduction",
        "long responses outweigh short ones",
        ("recipe.algo.loss_reduction=sample_mean",),
        "loss_reduction: sample_mean",
    ),
    Mistake(
        "a decay that ends before the run with min_lr 0",
        "https://github.com/areal-project/AReaL/pull/1289",
        "The cosine schedule hit `min_lr` roughly one full warmup phase earlier than intended "
        "(e.g. lr=0 at step 198 for a 220-step run with 22 warmup steps), wasting ~10% of "
        "training on zero lr.",
        ("recipe.optim.lr_decay_style=cosine", "recipe.optim.lr_decay_steps=50"),
        "recipe.optim.lr_decay_steps",
        "would train with a learning rate of 0",
        ("recipe.optim.lr_decay_steps=60",),
        "lr_decay_steps: 60",
    ),
    Mistake(
        "a clip-higher below the low clip",
        "https://github.com/areal-project/AReaL/pull/285",
        'assert eps_clip_higher > eps_clip, "eps_clip_higher must be greater than eps_clip" '
        "(AReaL's decoupled clip ratio, DAPO's clip-higher)",
        ("recipe.algo.eps_clip_high=0.1",),
        "recipe.algo.eps_clip_high",
        "narrows it instead",
        ("recipe.algo.eps_clip_high=0.28",),
        ">= 0.2",
    ),
    Mistake(
        "the k1 estimator as a KL loss",
        "https://github.com/OpenRLHF/OpenRLHF/pull/1309",
        "The current implementation differentiates k1, k2 or k3 directly ... k1's gradient "
        "vanishes in expectation, and k3's gradient descends the forward KL",
        (
            "recipe.algo.kl_loss_type=k1",
            "recipe.algo.kl_loss_coef=0.01",
        ),
        "recipe.algo.kl_loss_type",
        "zero in expectation",
        ("recipe.algo.kl_loss_type=low_var_kl",),
        "low_var_kl",
    ),
    Mistake(
        "a decay that outlasts the run",
        "https://github.com/vllm-project/speculators/pull/1104",
        "Cosine/linear schedules therefore never reached their decay endpoint within the "
        "actual run — the LR stayed higher than intended for the whole training.",
        (
            "recipe.optim.lr_decay_style=cosine",
            "recipe.optim.lr_decay_steps=1000",
            "recipe.optim.min_lr=1e-5",
        ),
        "recipe.optim.lr_decay_steps",
        "never reaches min_lr",
        ("recipe.optim.lr_decay_steps=60",),
        "lr_decay_steps: 60",
    ),
    Mistake(
        "a dual clip below 1",
        "https://github.com/opendilab/PPOxFamily/issues/95",
        "I might be wrong, but I believe the dual clipping parameter is intended to be > 1 (the "
        "maintainers: 'here the `dual_clip` value should be greater than 1.0')",
        ("recipe.algo.eps_clip_c=0.5",),
        "recipe.algo.eps_clip_c",
        "must be > 1",
        ("recipe.algo.eps_clip_c=3.0",),
        "use 3.0",
    ),
    # ---- evaluation -----------------------------------------------------------------------
    Mistake(
        "two eval datasets under one name",
        "https://github.com/NVIDIA-NeMo/RL/issues/2501",
        "the validation aggregator collapses all rewards into one `validation/accuracy` ... "
        "That single number is a sample-weighted mean across both datasets, which is "
        "meaningless if the per-dataset accuracies diverge.",
        ("recipe.eval.datasets=[{name:arith,path:/data/a.jsonl},{name:arith,path:/data/b.jsonl}]",),
        "recipe.eval.datasets.1.name",
        "one overwrites the other",
        (
            "recipe.eval.datasets=[{name:arith,path:/data/a.jsonl},"
            "{name:arith_1,path:/data/b.jsonl}]",
        ),
        "arith_1",
    ),
    Mistake(
        "greedy evaluation sampled n times",
        "https://github.com/verl-project/verl/issues/6202",
        "`val_kwargs.temperature` / ... / `n`: Set `temperature > 0` to prevent repetitive "
        "thinking chains. For small test sets (e.g., AIME24) raise `n` (verl's guidance a "
        "user asks about: n samples only differ when sampled)",
        ("recipe.eval.temperature=0", "recipe.eval.n_samples_per_prompt=4"),
        "recipe.eval.n_samples_per_prompt",
        "gives the same response 4 times",
        ("recipe.eval.n_samples_per_prompt=1",),
        "n_samples_per_prompt: 1",
    ),
    Mistake(
        "top_k 0 meaning 'off' (HF) for an engine that takes -1",
        "https://github.com/unslothai/unsloth/pull/3935",
        "trl added top_k in GRPOConfig and defaults to 0 ... vllm's all include top_k is -1 "
        "and 0 returns an error on SamplingParams creation (TRL's own change: "
        "https://github.com/huggingface/trl/pull/3494)",
        ("recipe.eval.top_k=0",),
        "recipe.eval.top_k",
        "keeps no token to sample from",
        ("recipe.eval.top_k=-1",),
        "use -1",
    ),
    Mistake(
        "rollouts sampled from a truncated distribution",
        "https://github.com/huggingface/trl/issues/6789",
        "The trainer takes a full-vocab log-softmax of `logits / temperature` ... no "
        "truncation ... `exp(log_ratio) = S`, so every per-token loss is scaled by the "
        "surviving mass (top_p=0.9: 0.9000; top_k=50: 0.1712)",
        ("recipe.rollout.top_p=0.9",),
        "recipe.rollout.top_p",
        "trains a policy nobody sampled from",
        ("recipe.rollout.top_p=1.0",),
        "top_p: 1.0",
    ),
    Mistake(
        "rollouts sampled from the top k tokens",
        "https://github.com/verl-project/verl/issues/6240",
        "we are returning logprobs from e.g. vllm as the processed_logprobs (e.g. logprobs "
        "after temperature and top-k/p) ... how it will interact with the logprobs computed "
        "during the forward pass in the trainer given that the trainer ones don't apply "
        "temperature nor top-k/p? (quoting DeepSeek-V3.2: truncation 'violates the principles "
        "of importance sampling and destabilizes training')",
        ("recipe.rollout.top_k=50",),
        "recipe.rollout.top_k",
        "over different sets of tokens",
        ("recipe.rollout.top_k=-1",),
        "top_k: -1",
    ),
    Mistake(
        "evaluation asked for with no evaluation set",
        "https://github.com/huggingface/trl/pull/2152",
        "ValueError: You have set `args.eval_strategy` to steps but you didn't pass an "
        "`eval_dataset` to `Trainer`.",
        ("recipe.eval.datasets=[]",),
        "recipe.eval.datasets",
        "asks for evaluation but no datasets are named",
        ("recipe.eval.interval=null",),
        "interval: null",
        value="interval=20",
    ),
    # ---- data -----------------------------------------------------------------------------
    Mistake(
        "chat-template arguments without the chat template",
        "https://github.com/OpenRLHF/OpenRLHF/issues/1073",
        "do we have a method to turn off the thinking mode of Qwen3 series models? ... "
        "`enable_thinking=False` is needed to be added to `tokenize_fn`",
        (
            "recipe.data.apply_chat_template=false",
            "recipe.data.apply_chat_template_kwargs={enable_thinking:false}",
        ),
        "recipe.data.apply_chat_template_kwargs",
        "prompts are sent as written",
        ("recipe.data.apply_chat_template=true",),
        "set apply_chat_template: true",
        value="{'enable_thinking': False}",
    ),
    Mistake(
        "a chat template asked of a base model's tokenizer",
        "https://github.com/OpenRLHF/OpenRLHF/issues/613",
        "ValueError: Cannot use chat template functions because tokenizer.chat_template is not "
        "set and no template argument was passed! (--apply_chat_template with --pretrain "
        "Meta-Llama-3.1-8B, a base model)",
        ("model.hf_checkpoint={tmp}/base_model",),
        "recipe.data.apply_chat_template",
        "has no chat template",
        ("~model.hf_checkpoint",),
        "use a checkpoint whose tokenizer has a chat template",
        value="recipe.data.apply_chat_template = True",
    ),
    # ---- the loop and the run -------------------------------------------------------------
    Mistake(
        "restarts with no checkpoint to restart from",
        "https://github.com/radixark/miles/pull/2978",
        "Put a trainer back at the start of its run when it saved nothing yet (miles, slime's "
        "successor: a restart before the first save begins again from step 0)",
        ("run.max_restarts=2", "recipe.save.interval=null"),
        "recipe.save.interval",
        "every restart begins again at rollout 0",
        ("recipe.save.interval=20",),
        "e.g. 20",
        value="run.max_restarts=2",
    ),
    Mistake(
        "a fully-async buffer smaller than a batch",
        "https://github.com/NVIDIA-NeMo/RL/pull/1098",
        "# Ensure the buffer has at least one step worth of prompt-groups before training "
        "(NeMo-RL's async GRPO adds the check: a smaller buffer never fills a step)",
        ("recipe.loop.mode=fully_async", "recipe.loop.max_buffered_groups=2", *DECOUPLED_CPU),
        "recipe.loop.max_buffered_groups",
        "the run hangs before its first step",
        ("recipe.loop.max_buffered_groups=16",),
        "e.g. 16",
    ),
    Mistake(
        "auto-resume into a new directory each launch",
        "https://github.com/huggingface/trl/issues/3179",
        "I set resume_from_checkpoint=True in the GRPOConfig, but based on the output, it "
        "seems to start training from the first step.",
        ("run.resume=auto",),
        "run.resume",
        "every launch starts again at rollout 0",
        ("run.dir={tmp}/resumable",),
        "set run.dir",
        own_dir=False,
    ),
    Mistake(
        "a multi-node run launched without joining the cluster",
        "https://github.com/verl-project/verl/issues/3358",
        "When I use two nodes and each nodes with 16 GPUs, I got the error: ... ValueError: "
        "Total available GPUs 16.0 is less than total desired GPUs 32 ... we set the "
        '`ray.init(...)` as `ray.init(..., address="auto")`, then the issue will be fixed.',
        ("model=qwen3-8b", "recipe=grpo_dapo", "hardware=h100x16"),
        "run.ray_address",
        "start Ray on this machine alone",
        ("run.ray_address=auto",),
        "run.ray_address=auto",
        value="hardware=h100x16 has 2 nodes x 8 GPUs",
    ),
    Mistake(
        "online wandb logging without a key",
        "https://github.com/hiyouga/EasyR1/issues/69",
        "(main_task pid=55440) wandb: Using wandb-core as the SDK backend. ... "
        "wandb.errors.errors.UsageError: api_key not configured (no-tty). call "
        "wandb.login(key=[your_api_key]) (EasyR1, a verl fork: raised in the Ray task that "
        "drives the run)",
        ("tracking.wandb.enabled=true", "tracking.wandb.mode=online"),
        "tracking.wandb.mode",
        "needs an API key",
        ("tracking.wandb.mode=offline",),
        "tracking.wandb.mode=offline",
    ),
    Mistake(
        "a request timeout shorter than a long response",
        "https://github.com/THUDM/slime/issues/1562",
        "Rollout generation:  62%| 40/64 ... ray.exceptions.RayTaskError(TimeoutError): "
        "ray::RolloutManager.generate() ('raised by excessive token generation -> time out', "
        "https://github.com/THUDM/slime/pull/1570)",
        (*GLM9, "engine.request_timeout_s=20"),
        "engine.request_timeout_s",
        "long responses would time out mid-rollout",
        ("engine.request_timeout_s=3600",),
        "well above 33",
    ),
    Mistake(
        "a resume from a checkpoint that is not there",
        "https://github.com/radixark/miles/pull/2688",
        "Once the user selects resume semantics with `--ckpt-step` or "
        "`--exit-on-missing-checkpoint`, however, Miles must not silently start from initial "
        "weights.",
        ("run.resume={tmp}/runs/before/ckpt/rollout_40",),
        "run.resume",
        "no such checkpoint or run directory on this machine",
        ("~run.resume",),
        "point run.resume at <run.dir>/ckpt/rollout_<n>",
    ),
    # ---- trainer --------------------------------------------------------------------------
    Mistake(
        "the allgather token dispatcher with packed samples",
        "https://github.com/THUDM/slime/issues/1725",
        "ValueError: Token dispatcher type: allgather does not support variable sequence "
        "length, please use alltoall dispatcher instead.",
        (*FLASH, "layout.train.moe_token_dispatcher_type=allgather"),
        "layout.train.moe_token_dispatcher_type",
        "megatron-core refuses it",
        ("layout.train.moe_token_dispatcher_type=alltoall",),
        "use alltoall",
    ),
    Mistake(
        "a precision-aware optimizer without the distributed optimizer",
        "https://github.com/NVIDIA/Megatron-LM/pull/7288",
        "It never surfaced because nothing reached it: `DistributedOptimizer` never called "
        "`init_state_fn`, and the non-distributed wrappers cannot be precision-aware "
        "(`get_megatron_optimizer` refuses that combination).",
        (*FLASH, "layout.train.distributed_optimizer=false"),
        "layout.train.distributed_optimizer",
        "megatron-core refuses the pair",
        ("layout.train.distributed_optimizer=true",),
        "distributed_optimizer: true",
    ),
    Mistake(
        "an MTP loss weight without MTP training",
        "https://github.com/inclusionAI/AReno/pull/550",
        "Until now the MTP layer shipped in Ling / Bailing V3 checkpoints was dropped at load "
        "time, so it degraded silently during RL fine-tuning (AReaL's team; the checkpoint's "
        "`mtp_loss_scaling_factor` trains nothing unless MTP training is on)",
        ("recipe.train.mtp_loss_scaling_factor=0.5",),
        "recipe.train.mtp_loss_scaling_factor",
        "mtp_training is off",
        ("~recipe.train.mtp_loss_scaling_factor",),
        "remove mtp_loss_scaling_factor",
    ),
    Mistake(
        "host Adam without the distributed optimizer",
        "https://github.com/NVIDIA-NeMo/RL/pull/3628",
        "The `optimizer_cpu_offload` -> `use_distributed_optimizer` guard is correct and worth "
        "keeping. The combination it rejects fails with a `KeyError` on the first optimizer "
        "step (NeMo-RL's review of its Megatron optimizer offload)",
        (*GLM9, "recipe.optim.cpu_offload=true", "layout.train.distributed_optimizer=false"),
        "layout.train.distributed_optimizer",
        "the first optimizer step fails",
        ("layout.train.distributed_optimizer=true",),
        "distributed_optimizer: true",
    ),
    Mistake(
        "expert parallelism beyond the train GPUs",
        "https://github.com/THUDM/slime/issues/1818",
        "pipeline-model-parallel-size*expert-model-parallel-size*expert-tensor-parallel-size"
        "=2*8*1=16, but use 1 actor-num-nodes and actor-num-gpus-per-node 8 ... RuntimeError: "
        "world_size (8) is not divisible by expert_tensor_model_pipeline_parallel size (16)",
        (
            "model=qwen3-30b-a3b",
            "recipe=grpo_dapo",
            "hardware=h100x8",
            "layout.train.pp=2",
            "layout.train.ep=8",
            "layout.train.etp=1",
        ),
        "layout.train.ep",
        "1 x 8 x 2 = 16 does not divide 8 train GPUs",
        ("layout.train.ep=4",),
        "(here 4)",
    ),
    Mistake(
        "tensor parallelism over more ranks than KV heads",
        "https://github.com/pytorch/torchtitan/issues/2574",
        "`Qwen3.5 MOE` ... has `n_kv_heads == 2` ... If TP > n_kv_heads (or n_kv_heads not "
        "divisible by TP), each rank gets a fractional number of KV heads. The `view(bs, "
        "seqlen, -1, head_dim)` reshape in the attention `forward` then produces a non-integer "
        "head count and crashes.",
        (*GLM9, "layout.train.cp=1", "layout.train.tp=4"),
        "layout.train.tp",
        "splits the 2 query groups (KV heads) over tp=4 ranks",
        ("layout.train.tp=2",),
        "use a tp that divides 2",
    ),
    Mistake(
        "a pipeline size that does not divide the layers",
        "https://github.com/NVIDIA-NeMo/Megatron-Bridge/pull/5551",
        "With no uneven-stage configuration, Megatron-Core requires divisibility and aborts "
        "model construction before training begins. (GLM-4.5 355B: 92 layers at PP=8)",
        (
            "model=glm4.5-355b-a32b",
            "recipe=grpo_dapo",
            "hardware=h100x64",
            "layout.train.pp=8",
            "layout.train.cp=1",
            "layout.train.ep=8",
        ),
        "layout.train.pp",
        "92 layers do not split evenly over pp=8",
        ("++layout.train.num_layers_in_last_pipeline_stage=8",),
        "layout.train.num_layers_in_last_pipeline_stage: 8",
    ),
    Mistake(
        "a last pipeline stage count without a pipeline",
        "https://github.com/NVIDIA/Megatron-LM/issues/1778",
        "When using `--pipeline-model-parallel-size 1` and `--decoder_last_pipeline_num_layers "
        "k`, Megatron does not detect when `k` does not match `num-layers` and does not raise "
        "an error.",
        (*QWEN, "++layout.train.num_layers_in_last_pipeline_stage=1"),
        "layout.train.num_layers_in_last_pipeline_stage",
        "uneven pipeline stages need more than one stage, and pp=1",
        ("~layout.train.num_layers_in_last_pipeline_stage",),
        "remove it",
    ),
    # ---- the model against its checkpoint -------------------------------------------------
    Mistake(
        "a rotary base copied from another model's script",
        "https://github.com/THUDM/slime/pull/702",
        "the existing `model_args` for Qwen3-4B cannot be applied directly because the "
        "`rotary_base` parameter differs: Qwen3-4B uses rotary_base = 1 000 000, "
        "Qwen3-4B-Instruct-2507 uses rotary_base = 5 000 000",
        ("model.rotary_base=5000000",),
        "model.rotary_base",
        "the model would not match its checkpoint",
        ("model.rotary_base=1000000",),
        "set model.rotary_base=1000000.0 on the command line",
    ),
    Mistake(
        "untied output weights for a checkpoint that ties them",
        "https://github.com/THUDM/slime/pull/253",
        "raise AssertionError: tie_word_embeddings in hf config False is not equal to "
        "untie_embeddings_and_output_weights False, please check the config.",
        ("model.tie_word_embeddings=false",),
        "model.tie_word_embeddings",
        "the model would not match its checkpoint",
        ("model.tie_word_embeddings=true",),
        "set model.tie_word_embeddings=true on the command line",
    ),
    # ---- engines: memory and numerics -----------------------------------------------------
    Mistake(
        "an NCCL weight broadcast to engines on the trainer's GPUs",
        "https://github.com/areal-project/AReaL/issues/481",
        "Duplicate GPU detected : rank 4 and rank 0 both on CUDA device 109000. The full "
        "weights of the ModelRunner are partially updated. Please discard the whole weights. "
        "(... in update_weights ... dist.broadcast)",
        (*QWEN, "engine.weight_sync=distributed"),
        "engine.weight_sync",
        "Duplicate GPU detected",
        ("engine.weight_sync=tensor",),
        "engine.weight_sync=tensor",
    ),
    Mistake(
        "an FP8 KV cache with nothing to correct its logprobs",
        "https://github.com/verl-project/verl/pull/4435",
        "I also tried on Qwen2.5-Math-7B GRPO with MATH dateset, and saw a terrible result: "
        "The accuracy became around 0 when I open FP8 KV cache, and response was irregular "
        'like"????////".',
        (*GLM9, f"{SG}.kv_cache_dtype=fp8_e4m3"),
        "layout.rollout.sglang.kv_cache_dtype",
        "nothing in the loss",
        (f"~{SG}.kv_cache_dtype",),
        "off_policy_correction: tis",
    ),
    Mistake(
        "one sampling seed for every engine",
        "https://github.com/NVIDIA-NeMo/RL/issues/53",
        "vLLM set seed (each engine needs different seed); verl: 'I assume the seed should "
        "depend on the model parallel rank' (https://github.com/verl-project/verl/pull/912)",
        (*GLM9, f"{SG}.random_seed=42"),
        "layout.rollout.sglang.random_seed",
        "one seed for every engine gives them the same draws",
        (f"~{SG}.random_seed", "run.seed=42"),
        "set run.seed instead",
    ),
    Mistake(
        "online FP8 quantization of a bf16 checkpoint",
        "https://github.com/verl-project/verl/issues/1803",
        "The real issue was that the current vllm implementation doesn't support loading "
        "bf16 weights online and dynamically quantize them to fp8.",
        (*GLM9, f"{SG}.quantization=fp8"),
        "layout.rollout.sglang.quantization",
        "not the bf16 weights each update sends",
        (f"~{SG}.quantization",),
        "remove quantization",
    ),
    Mistake(
        "engines started from random weights",
        "https://github.com/google/tunix/pull/2096",
        "Rollouts for step 0 come from uninitialized weights. `train_stage` only syncs *after* "
        "a step ... The rollouts are degenerate but still scored",
        (*GLM9, f"{SG}.load_format=dummy"),
        "layout.rollout.sglang.load_format",
        "sampled from noise",
        (f"~{SG}.load_format",),
        "remove it",
    ),
    Mistake(
        "colocated engines that keep their memory while training",
        "https://github.com/verl-project/verl/issues/2208",
        "the memory it occupies is not released after initialization ... This behavior can "
        "lead to out-of-memory (OOM) errors",
        (*QWEN, "engine.offload=false"),
        "engine.offload",
        "runs out of memory",
        ("engine.offload=null",),
        "remove engine.offload",
    ),
    Mistake(
        "engines computing in another dtype than the trainer",
        "https://github.com/NVIDIA-NeMo/RL/pull/3936",
        "Must be paired with NRL_VLLM_FP32_LM_HEAD=1 below — enabling this on only one engine "
        "makes the multiplicative error worse, since both otherwise round to the same grid.",
        (*GLM9, f"{SG}.dtype=float16"),
        "layout.rollout.sglang.dtype",
        "every sampled token's logprob then differs",
        (f"{SG}.dtype=bfloat16",),
        "set bfloat16",
    ),
    Mistake(
        "SGLang's deterministic sampling without a seed per sample",
        "https://github.com/verl-project/verl/pull/6857",
        "deterministic rollout does not mean every response for the same prompt should be "
        "identical ... repeated prompts can get duplicate `rollout_n` values ... those "
        "duplicate `(sample_index, rollout_n, step)` tuples can collide (UniRL, the flag "
        "without seeds: 'get 8 token-identical completions for every prompt', "
        "https://github.com/Tencent-Hunyuan/UniRL/pull/208)",
        (*GLM9, f"{SG}.enable_deterministic_inference=true"),
        "layout.rollout.sglang.enable_deterministic_inference",
        "token-identical",
        ("run.deterministic=true",),
        "run.deterministic=true",
    ),
    Mistake(
        "engines larger than the rollout GPUs",
        "https://github.com/verl-project/verl/issues/1191",
        "I run the GRPO when meet AssertionError: rollout world_size: 1 is not divisible by "
        "infer_tp: 2. I just use one GPU",
        (
            *QWEN,
            "layout.colocate=false",
            "layout.train.num_gpus=4",
            "layout.rollout.num_gpus=1",
            "layout.rollout.gpus_per_engine=2",
        ),
        "layout.rollout.gpus_per_engine",
        "1 rollout GPU does not split into engines of 2 GPUs",
        ("layout.rollout.gpus_per_engine=1",),
        "use an engine size that divides 1: 1",
    ),
    Mistake(
        "an engine's tensor parallelism over a count that splits no heads",
        "https://github.com/THU-KEG/AdaptThink/issues/1",
        "I am using DeepSeek-R1-Distill-Qwen-7B and have set tensor_parallel_size to 8, but I "
        "encountered the following error: ValueError: Total number of attention heads (28) "
        "must be divisible by tensor parallel size (8)",
        (
            *QWEN,
            "layout.colocate=false",
            "layout.train.num_gpus=4",
            "layout.train.tp=1",
            "layout.train.sequence_parallel=false",
            "layout.rollout.num_gpus=3",
            "layout.rollout.gpus_per_engine=3",
        ),
        "layout.rollout.gpus_per_engine",
        "SGLang splits the 32 attention heads over the engine TP of 3 GPUs",
        ("layout.rollout.gpus_per_engine=1",),
        "use an attention TP that divides 32",
    ),
    # ---- engines: lengths -----------------------------------------------------------------
    Mistake(
        "an engine context shorter than prompt + response",
        "https://github.com/verl-project/verl/pull/1627",
        "[SGLang Async Rollout] Validate prompt_len + max_resp_len <= max_model_len "
        "(the request otherwise fails inside the engine mid-rollout)",
        (*GLM9, f"{SG}.context_length=4096"),
        "layout.rollout.sglang.context_length",
        "SGLang refuses those requests mid-rollout",
        (f"{SG}.context_length=16384",),
        "at least 16384",
    ),
    Mistake(
        "an engine context beyond the model's positions",
        "https://github.com/sgl-project/sglang/pull/1778",
        "addresses potential issues when users specify a context length exceeding the model's "
        "derived maximum ... These changes will prevent decoding nan errors, which I have met "
        "recently.",
        (*GLM9, f"{SG}.context_length=1000000"),
        "layout.rollout.sglang.context_length",
        "beyond model.max_position_embeddings=32768",
        (f"{SG}.context_length=32768",),
        "16384..32768",
    ),
    Mistake(
        "a prompt and response longer than the model's positions",
        "https://github.com/verl-project/verl/issues/1873",
        "assert model_hf_config.max_position_embeddings >= config.prompt_length + "
        "config.response_length ... AssertionError: model context length should be greater "
        "than total sequence length; max_position_embeddings=4096 prompt_length=2048 "
        "response_length=8192",
        (*GLM9, "recipe.data.max_prompt_len=2048", "recipe.rollout.max_response_len=32768"),
        "recipe.rollout.max_response_len",
        "can reach 34816 tokens (max_prompt_len 2048 + response)",
        ("recipe.rollout.max_response_len=12288",),
        "prompt + response <= 32768",
    ),
    Mistake(
        "a KV pool smaller than one request",
        "https://github.com/sgl-project/sglang/issues/4048",
        "Input length (160062 tokens) exceeds the maximum allowed length (59862 tokens). Use "
        "a shorter input or enable --allow-auto-truncate.",
        (*GLM9, f"{SG}.max_total_tokens=1024"),
        "layout.rollout.sglang.max_total_tokens",
        "one request can need 16384",
        (f"{SG}.max_total_tokens=16384",),
        "at least 16384",
    ),
    Mistake(
        "prompts cut short by the engine",
        "https://github.com/NVIDIA-NeMo/Gym/pull/1557",
        "this keeps the prompt **head** and drops the **tail** ... an overflowing prompt "
        "generates from a malformed context with no generation marker, and the result enters "
        "the dataset as a valid rollout (NeMo-RL's SGLang worker)",
        (*GLM9, f"{SG}.allow_auto_truncate=true"),
        "layout.rollout.sglang.allow_auto_truncate",
        "belong to a prompt nobody trained",
        (f"{SG}.allow_auto_truncate=false",),
        "recipe.data.max_prompt_len",
    ),
    Mistake(
        "a pipeline-parallel engine",
        "https://github.com/areal-project/AReaL/pull/232",
        "System Hang (disk-based weight update): The SGLang server hangs on startup when "
        "using `dp=1, pp=4, tp=1`; Error with Combined PP and TP ... (e.g., `dp=1, pp=2, tp=2`)",
        (*GLM9, f"{SG}.pp_size=2"),
        "layout.rollout.sglang.pp_size",
        "fail to start",
        (f"{SG}.pp_size=1",),
        "layout.rollout.gpus_per_engine",
    ),
    Mistake(
        "sampling parameters the engines take from elsewhere",
        "https://github.com/NVIDIA-NeMo/RL/issues/3497",
        "vLLM resolves unset sampling params from the model's generation_config.json, not "
        "neutral defaults (58.8% of tokens' probabilities off by more than 1% on "
        "Qwen2.5-0.5B-Instruct, whose repetition_penalty is 1.1)",
        (*QWEN, f"{SG}.preferred_sampling_params='{{\"repetition_penalty\": 1.05}}'"),
        "layout.rollout.sglang.preferred_sampling_params",
        "engine defaults never apply",
        (f"~{SG}.preferred_sampling_params",),
        "recipe.rollout.temperature",
        value="preferred_sampling_params",
    ),
    Mistake(
        "a model override the engines alone take",
        "https://github.com/NVIDIA-NeMo/RL/pull/2188",
        "Updated GRPO setup so vLLM generation inherits the policy HF overrides, ensuring "
        "generation uses the same YaRN rope settings as training.",
        (*QWEN, f"{SG}.json_model_override_args='{{\"rope_theta\": 5000000}}'"),
        "layout.rollout.sglang.json_model_override_args",
        "belong to another model",
        (f"~{SG}.json_model_override_args",),
        "change the checkpoint's config.json",
        value="json_model_override_args",
    ),
    Mistake(
        "an SGLang chat template for prompts sent as token ids",
        "https://github.com/sgl-project/sglang/issues/239",
        "The chat template specified via the  --chat-template option is only applied to the "
        "OpenAI compatible server (the reply to a user whose --chat-template chatml left "
        "/generate's prompts untemplated)",
        (*QWEN, f"{SG}.chat_template=chatml"),
        "layout.rollout.sglang.chat_template",
        "applies it only on its OpenAI-compatible endpoints",
        (f"~{SG}.chat_template",),
        "recipe.data.apply_chat_template_kwargs.chat_template",
        value="chat_template",
    ),
    # ---- sampling, rewards and the KL -----------------------------------------------------
    Mistake(
        "a temperature the engines treat as greedy",
        "https://github.com/huggingface/trl/issues/3640",
        "Scaling logits with temperature values closer to 0 makes probabilities 0",
        ("recipe.rollout.temperature=1e-7",),
        "recipe.rollout.temperature",
        "decode greedily",
        ("recipe.rollout.temperature=1.0",),
        "use 1.0",
    ),
    Mistake(
        "a thinking reward with thinking turned off",
        "https://github.com/THUDM/slime/pull/2219",
        "deepscaler silently zeroes all rewards for non-thinking models",
        (*QWEN, "recipe.data.apply_chat_template_kwargs={enable_thinking: false}"),
        "recipe.rollout.reward.type",
        "every reward is 0",
        ("recipe.rollout.reward.type=math",),
        "rollout.reward.type: math",
    ),
    Mistake(
        "a decay counted in rollouts where it counts optimizer steps",
        "https://github.com/NovaSky-AI/SkyRL/issues/872",
        "my understanding is that we perform |data_size|/64 optimization steps. Right now, the "
        "len of the dataloader depends on the train_batch_size, not the mini-batch-size. So "
        "does this means we decay 2x as fast (because it happens after every optimization "
        "step).",
        (
            *QWEN,
            "recipe.train.global_batch_size=64",
            "recipe.optim.lr_decay_style=cosine",
            "recipe.optim.lr_decay_steps=3000",
            "recipe.optim.min_lr=1e-7",
        ),
        "recipe.optim.lr_decay_steps",
        "the decay ends at rollout 750 of 3000",
        ("recipe.optim.lr_decay_steps=12000",),
        "set optim.lr_decay_steps: 12000",
    ),
    Mistake(
        "special tokens skipped where the reward reads one",
        "https://github.com/verl-project/verl/issues/1724",
        "vLLM seems to strip or omit the special tokens (in my case, <think> and </think> are "
        "defined as special tokens in the tokenizer). I need the content within this block in "
        "order to evaluate it.",
        ("recipe.rollout.reward.type=deepscaler", "recipe.rollout.skip_special_tokens=true"),
        "recipe.rollout.skip_special_tokens",
        "leaves special tokens out of the text the grader reads",
        ("recipe.rollout.skip_special_tokens=false",),
        "set recipe.rollout.skip_special_tokens: false",
    ),
    Mistake(
        "the KL in the reward and in the loss",
        "https://github.com/verl-project/verl/issues/265",
        "kl is applied twice if kl_loss_coef >0 and kl_coef > 0 (the maintainers: 'We should "
        "make them mutually exclusive by using assertion in config')",
        (
            "recipe.algo.advantage_estimator=reinforce_plus_plus",
            "recipe.algo.kl_coef=0.01",
            "recipe.algo.use_kl_loss=true",
            "recipe.algo.kl_loss_coef=0.01",
        ),
        "recipe.algo.kl_coef",
        "the reference pulls twice",
        ("recipe.algo.kl_coef=0",),
        "kl_coef: 0",
    ),
    Mistake(
        "uniform recompute groups that overrun a stage's layers",
        "https://github.com/NVIDIA/Megatron-LM/issues/1807",
        "List of out range error when `self.num_layers_per_pipeline_rank % "
        "self.config.recompute_num_layers!=0`",
        (*QWEN, "layout.train.recompute.num_layers=5"),
        "layout.train.recompute.num_layers",
        "the model's 36 layers are not a multiple of 5",
        ("layout.train.recompute.num_layers=4",),
        "(1, 2, 3, 4, 6, 9)",
    ),
    Mistake(
        "speculative decoding with no draft model",
        "https://github.com/sgl-project/sglang/issues/36528",
        "Starting SGLang with `--speculative-algorithm EAGLE3` but without "
        "`--speculative-draft-model-path` can silently use the target checkpoint as the draft "
        "model ... the server crashes during startup after loading the target weights twice",
        (*QWEN, f"{SG}.speculative_algorithm=EAGLE3"),
        "layout.rollout.sglang.speculative_algorithm",
        "EAGLE3 drafts with a model of its own",
        (
            f"{SG}.speculative_algorithm=EAGLE3",
            f"{SG}.speculative_draft_model_path=/root/Qwen3-4B-eagle3",
        ),
        "speculative_draft_model_path to a draft checkpoint",
    ),
    Mistake(
        "a tokenizer with tokens the embedding has no row for",
        "https://github.com/huggingface/transformers/issues/1848",
        "When you run `run_lm_finetuning.py` with a custom tokenizer ... you need to resize "
        "model embedding according to the new tokenizer. Otherwise you are going to get "
        "`CUDA runtime error (59) : device-side assert triggered`",
        ("model.hf_checkpoint={tmp}/extended_tokenizer",),
        "model.hf_checkpoint",
        "'<tool_call>' = 320; the embedding and output layer have no row for them",
        ("~model.hf_checkpoint",),
        "resize the checkpoint's embeddings to the tokenizer",
    ),
    Mistake(
        "engines that never receive the trained weights",
        "https://github.com/radixark/miles/pull/2470",
        "Assert that the rollout executor keeps receiving weight versions",
        ("recipe.loop.update_weights_interval=100",),
        "recipe.loop.update_weights_interval",
        "keep the starting weights for every rollout",
        ("recipe.loop.update_weights_interval=1",),
        "use 1",
    ),
    Mistake(
        "a run of zero rollouts meant as an evaluation",
        "https://github.com/THUDM/slime/issues/1785",
        "i want to do an eval only test ... so i set the num_rollout 0, and also set the eval "
        "args, but errors happenned",
        ("recipe.rollout.num_rollout=0",),
        "recipe.rollout.num_rollout",
        "runs no rollout",
        ("recipe.rollout.num_rollout=1",),
        "use mode=eval",
    ),
    Mistake(
        "an LM head split over dp-attention groups that are off",
        "https://github.com/sgl-project/sglang/pull/7895",
        "Corrects a typo in an assertion message ... the dependency between "
        "`enable_dp_lm_head` and `enable_dp_attention`",
        (*QWEN, f"{SG}.enable_dp_lm_head=true"),
        "layout.rollout.sglang.enable_dp_lm_head",
        "enable_dp_attention is off",
        ("~layout.rollout.sglang.enable_dp_lm_head",),
        "remove enable_dp_lm_head",
    ),
]


@dataclass(frozen=True)
class Noted:
    """A mistake that is valid (it runs) but probably not what its author meant: the plan
    says so in a note, and the launch is not refused."""

    name: str
    url: str
    symptom: str  # what the author saw, quoted
    argv: tuple[str, ...]
    says: tuple[str, ...]  # parts of the note


NOTED: list[Noted] = [
    Noted(
        "GPUs no rank or engine uses",
        "https://github.com/verl-project/verl/issues/1058",
        "When I set the `tensor_parallel_size` value to something low like 1 or 2, it results "
        "in only 1 or 2 GPUs being used for the rollout generation",
        (*QWEN, "layout.train.num_gpus=4"),
        ("4 of the 8 GPUs sit idle", "layout.train.num_gpus: 8"),
    ),
    Noted(
        "an MTP draft that stays as the checkpoint has it",
        "https://github.com/ROCm/ATOM/issues/609",
        "The MTP module ... was trained jointly with the main model ... during pretraining ... "
        "the MTP module's weights were frozen - it was not updated during post-training",
        (*FLASH, f"{SG}.speculative_algorithm=EAGLE", f"{SG}.speculative_num_steps=2"),
        ("fewer and fewer drafted tokens are accepted", "recipe.train.mtp_training: true"),
    ),
    Noted(
        "a pipeline stage count kept from another pp",
        "https://github.com/NVIDIA-NeMo/Megatron-Bridge/pull/5884",
        "After adding the uneven default, the runner also needed to account for VP "
        "divisibility when users override the recipe topology; otherwise a valid PP=4/VP=3 "
        "override retained 4/8 stage counts that MCore rejects.",
        (*FLASH16, "layout.train.pp=4", "layout.train.tp=2", "layout.train.ep=4"),
        ("hold 8, 8, 8, 23", "set layout.train.num_layers_in_last_pipeline_stage: 11"),
    ),
    Noted(
        "a sample longer than a micro-batch's token budget",
        "https://github.com/OpenRLHF/OpenRLHF/pull/1280",
        "That configuration cannot satisfy the token limit and can defer the failure to model "
        "execution as a GPU OOM.",
        (*QWEN, "recipe.train.max_tokens_per_gpu=4096"),
        ("exceeds max_tokens_per_gpu x cp = 4096", "a micro-batch of its own (never truncated)"),
    ),
    Noted(
        "a clip-higher bound on one optimizer step a rollout",
        "https://github.com/verl-project/verl/issues/791",
        "clip_ratio_low is set to 0.2 and clip_ratio_high is set to 0.2, but ppo_epochs is not "
        "set. The default value is 1. In this case, clip_ratio does not take effect. ... if "
        "ppo_epochs is 1, log_prob is equal to old_log_prob, and ratio is 1",
        (*QWEN, "recipe.algo.eps_clip_high=0.28"),
        (
            "recipe.algo.eps_clip_high=0.28 never binds",
            "recipe.train.global_batch_size: 128 gives 2 steps a rollout",
        ),
    ),
    Noted(
        "a save interval beyond the run meant as no saves",
        "https://github.com/THUDM/slime/issues/2370",
        "Users who set `--save-interval` larger than the total number of rollout steps "
        '(intending "no checkpointing") still get a full optimizer-state checkpoint written at '
        "the end - and on our setups this final write killed the training job",
        ("recipe.rollout.num_rollout=50", "recipe.save.interval=200"),
        (
            "recipe.save.interval=200 is beyond the run's 50 rollouts",
            "recipe.save.interval: null writes no checkpoint",
        ),
    ),
    Noted(
        "an evaluation interval beyond the run meant as no evaluation",
        "https://github.com/verl-project/verl/issues/1676",
        "I want to train a model without any validation. But I found that 'must validation' "
        "is hard-coding in verl. (the maintainers: 'You can set the `test_freq` to a huge "
        "value')",
        ("recipe.eval.interval=100000",),
        (
            "recipe.eval.interval=100000 is beyond the run's 60 rollouts",
            "recipe.eval.datasets: [] with recipe.eval.interval: null evaluates none",
        ),
    ),
]


def fixed_argv(case: Mistake, tmp: Path) -> list[str]:
    """The launch's overrides with the case's fix applied: the same key replaced, or
    dropped for `~key`."""
    fix = [f.replace("{tmp}", str(tmp)) for f in case.fix]
    keys = {f.lstrip("~+").split("=", 1)[0] for f in fix}
    argv = [a.replace("{tmp}", str(tmp)) for a in case.argv]
    kept = [a for a in argv if a.lstrip("+").split("=", 1)[0] not in keys]
    return kept + [f for f in fix if not f.startswith("~")]


DRIVER = """
import contextlib, io, json, sys, time
from rlpost.cli import launch
from rlpost.cli.main import main as rlpost_main

def run(fn, argv):
    err = io.StringIO()
    started, cpu = time.perf_counter(), time.process_time()
    code = 0
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = fn(argv)
        except SystemExit as exc:
            code = exc.code
        except BaseException:
            import traceback
            err.write("Traceback (from the driver)\\n" + traceback.format_exc())
            code = -1
    return code or 0, err.getvalue(), time.perf_counter() - started, time.process_time() - cpu

results = {}
for case in json.loads(open(sys.argv[1]).read()):
    code, err, seconds, cpu_seconds = run(launch.main, case["launch"])
    ray = sys.modules.get("ray")
    fixed = ["validate", "--no-local-checks", *case["fixed"]]
    fixed_code, fixed_err, _, _ = run(rlpost_main, fixed)
    results[case["name"]] = {
        "code": code, "stderr": err, "seconds": seconds, "cpu_seconds": cpu_seconds,
        "ray_started": bool(ray is not None and ray.is_initialized()),
        "fixed_code": fixed_code, "fixed_stderr": fixed_err,
    }
print(json.dumps(results))
"""


def write_checkpoints(work: Path) -> None:
    """The checkpoint folders cases name as {tmp}/...: the tiny model with a token added to
    its tokenizer past the model's 320 embedding rows (add_tokens, then save_pretrained,
    without resizing the embeddings), and the tiny model without its chat template."""
    tiny = REPO / "rlpost" / "assets" / "qwen3-tiny"
    folder = work / "extended_tokenizer"
    folder.mkdir()
    for item in tiny.iterdir():
        if item.name != "tokenizer.json":
            (folder / item.name).symlink_to(item)
    tokenizer = json.loads((tiny / "tokenizer.json").read_text())
    tokenizer["added_tokens"].append({"id": 320, "content": "<tool_call>", "special": True})
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    # a base model's tokenizer: the same files without a chat template
    base = work / "base_model"
    base.mkdir()
    for item in tiny.iterdir():
        if item.name != "chat_template.jinja":
            (base / item.name).symlink_to(item)


def run_mistakes(cases: list[Mistake], work: Path) -> dict[str, dict]:
    """Runs the cases through DRIVER in one interpreter, each launch followed by its fix's
    validation; by case name: `code`, `stderr`, `seconds` and `cpu_seconds` of the launch,
    `ray_started`, `fixed_code`, `fixed_stderr`. Run dirs go under work/runs."""
    runs = work / "runs"
    write_checkpoints(work)
    items = []
    for i, case in enumerate(cases):
        launch = [a.replace("{tmp}", str(work)) for a in case.argv]
        if case.own_dir:
            launch.append(f"run.dir={runs / str(i)}")
        launch.append(f"hydra.run.dir={runs / 'hydra' / str(i)}")
        items.append({"name": case.name, "launch": launch, "fixed": fixed_argv(case, work)})
    spec = work / "cases.json"
    spec.write_text(json.dumps(items))
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_API_KEY", "RAY_ADDRESS")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(spec)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got: dict[str, dict] = json.loads(done.stdout.strip().splitlines()[-1])
    return got


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    work = tmp_path_factory.mktemp("tracker_mistakes")
    got = run_mistakes(MISTAKES, work)
    runs = work / "runs"
    written = [p for p in runs.iterdir() if p.name != "hydra"] if runs.exists() else []
    assert written == [], f"run directories written by refused launches: {written}"
    return got


def test_the_corpus_is_tracker_sourced() -> None:
    cases = [*MISTAKES, *NOTED]
    assert len(MISTAKES) >= 30
    assert len({c.name for c in cases}) == len(cases)
    assert len({c.url for c in cases}) == len(cases)
    assert all(c.url.startswith("https://github.com/") and c.symptom for c in cases)


def repository(url: str) -> str:
    return "/".join(url.removeprefix("https://github.com/").split("/")[:2])


def test_the_corpus_is_mostly_the_peers() -> None:
    from_peers = [c for c in MISTAKES if repository(c.url) in PEERS]
    assert len(from_peers) >= 30, sorted({repository(c.url) for c in MISTAKES} - PEERS)


@pytest.mark.parametrize("case", MISTAKES, ids=[c.name for c in MISTAKES])
def test_refused_before_anything_starts(case: Mistake, results: dict[str, dict]) -> None:
    got = results[case.name]
    err = got["stderr"]
    assert got["code"] == 2, f"{case.url}: exit {got['code']}\n{err[-2000:]}"
    assert "Traceback" not in err, err[-2000:]
    assert not got["ray_started"]
    shown = f"{case.key} = " if case.value is None else case.value
    assert case.key in err and shown in err, f"{case.key!r} or its value not named\n{err}"
    assert case.says in err, f"no {case.says!r}\n{err}"
    fixes = [line for line in err.splitlines() if line.strip().startswith("fix:")]
    assert any(case.fix_says in line for line in fixes), f"no fix {case.fix_says!r}\n{err}"


@pytest.mark.parametrize("case", MISTAKES, ids=[c.name for c in MISTAKES])
def test_the_fix_it_names_validates(case: Mistake, results: dict[str, dict]) -> None:
    got = results[case.name]
    assert got["fixed_code"] == 0, f"{asdict(case)['fix']}:\n{got['fixed_stderr'][-2000:]}"


@pytest.mark.parametrize("case", NOTED, ids=[c.name for c in NOTED])
def test_noted_in_the_plan_and_not_refused(case: Noted, capsys: pytest.CaptureFixture[str]) -> None:
    from rlpost.cli.main import main as rlpost_main

    code = rlpost_main(["validate", "--no-local-checks", *case.argv])
    out, err = capsys.readouterr()
    assert code in (0, None), f"{case.url}: refused\n{err[-2000:]}"
    notes = [line for line in out.splitlines() if line.strip().startswith("note")]
    assert all(any(part in note for note in notes) for part in case.says), f"{case.url}\n{out}"
