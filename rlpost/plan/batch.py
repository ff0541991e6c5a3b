"""Batch arithmetic: how samples flow from prompts to engines to optimizer steps.

rollout_batch_size x n_samples_per_prompt = global_batch_size x steps_per_rollout; each step's
samples spread over the DP ranks, then pack into micro-batches of up to max_tokens_per_gpu
tokens per GPU (max_tokens_per_gpu x CP per context-parallel group).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlpost.plan.engine_memory import longest_sample_tokens
from rlpost.plan.layout import EngineLayout, ParallelLayout
from rlpost.schema import RecipeConfig


@dataclass(frozen=True)
class BatchPlan:
    num_rollout: int
    rollout_batch_size: int
    n_samples_per_prompt: int
    samples_per_rollout: int
    over_sampling_batch_size: int
    global_batch_size: int
    steps_per_rollout: int
    total_steps: int
    samples_per_step_per_dp_rank: int
    samples_per_rollout_per_dp_rank: int
    prompts_per_engine: float
    samples_per_engine: float
    use_dynamic_batch_size: bool
    max_tokens_per_gpu: int | None
    micro_batch_size: int
    tokens_per_micro_batch: int | None
    longest_sample_tokens: int


def plan_batch(recipe: RecipeConfig, parallel: ParallelLayout, engine: EngineLayout) -> BatchPlan:
    rollout, train = recipe.rollout, recipe.train
    samples = rollout.batch_size * rollout.n_samples_per_prompt
    steps = samples // train.global_batch_size
    engines = max(1, engine.num_engines)
    tokens = train.max_tokens_per_gpu
    packed = tokens * parallel.cp if tokens and train.use_dynamic_batch_size else None
    return BatchPlan(
        num_rollout=rollout.num_rollout,
        rollout_batch_size=rollout.batch_size,
        n_samples_per_prompt=rollout.n_samples_per_prompt,
        samples_per_rollout=samples,
        over_sampling_batch_size=rollout.over_sampling_batch_size or rollout.batch_size,
        global_batch_size=train.global_batch_size,
        steps_per_rollout=steps,
        total_steps=steps * rollout.num_rollout,
        samples_per_step_per_dp_rank=train.global_batch_size // parallel.dp,
        samples_per_rollout_per_dp_rank=samples // parallel.dp,
        prompts_per_engine=round(rollout.batch_size / engines, 2),
        samples_per_engine=round(samples / engines, 2),
        use_dynamic_batch_size=train.use_dynamic_batch_size,
        max_tokens_per_gpu=tokens,
        micro_batch_size=train.micro_batch_size,
        tokens_per_micro_batch=packed,
        longest_sample_tokens=longest_sample_tokens(recipe),
    )
