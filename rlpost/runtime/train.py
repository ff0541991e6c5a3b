"""The training loop, top to bottom.

Place the run on its hardware, start trainers, engines and the router, then for each
rollout: generate and reward groups, train on them, push the new weights to every engine,
evaluate when due, log. Shape kept from slime's train.py; everything it reads is typed.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from rlpost.data.source import DataSource
from rlpost.hooks import DYNAMIC_SAMPLING_FILTER, GENERATE_FUNCTION, load_hook
from rlpost.plan import Plan
from rlpost.rewards import compute_rewards
from rlpost.runtime.evaluation import EvalReport, evaluate, format_eval_table, load_eval_sets
from rlpost.runtime.metrics import MetricsLogger
from rlpost.runtime.progress import Progress
from rlpost.runtime.rollout.manager import RolloutManager, SamplingSettings, generate_sample
from rlpost.runtime.rundir import prepare_run_dir
from rlpost.runtime.session import Session
from rlpost.runtime.train_data import rollout_metrics, to_train_samples
from rlpost.schema import RunConfig
from rlpost.types import Sample


def run(cfg: RunConfig, plan: Plan) -> Path:
    """Train as configured; returns the run directory."""
    # Nothing is fetched from a model hub at run time: every path is local.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoTokenizer

    recipe, rollout = cfg.recipe, cfg.recipe.rollout
    run_dir = prepare_run_dir(cfg)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.hf_checkpoint)
    data = DataSource.from_config(
        recipe.data,
        tokenizer,
        n_samples_per_prompt=rollout.n_samples_per_prompt,
        buffer_filter=rollout.buffer_filter,
    )
    eval_sets = load_eval_sets(recipe, tokenizer, rollout.stop_token_ids)
    sampling = SamplingSettings(
        max_new_tokens=rollout.max_response_len,
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        stop=tuple(rollout.stop),
        stop_token_ids=tuple(rollout.stop_token_ids),
        skip_special_tokens=rollout.skip_special_tokens,
    )

    async def reward_fn(samples: list[Sample]) -> list[float]:
        return await compute_rewards(samples, rollout.reward)

    loop = asyncio.new_event_loop()
    reports: list[EvalReport] = []
    with Session(cfg, plan, run_dir, loop) as session:
        assert session.client is not None
        manager = RolloutManager(
            session.client,
            reward_fn,
            load_hook(rollout.generate_function, GENERATE_FUNCTION)
            if rollout.generate_function
            else generate_sample,
            load_hook(rollout.dynamic_sampling_filter, DYNAMIC_SAMPLING_FILTER)
            if rollout.dynamic_sampling_filter
            else None,
        )
        logger = MetricsLogger(run_dir, cfg.tracking, run_name=run_dir.name)
        pending_eval: dict[str, float] = {}
        if eval_sets and not recipe.eval.skip_before_train:
            reports.append(loop.run_until_complete(evaluate(manager, eval_sets, 0)))
            pending_eval = reports[-1].metrics
        progress = Progress(rollout.num_rollout, enabled=cfg.run.progress)
        for rollout_id in range(rollout.num_rollout):
            step_start = time.perf_counter()
            result = loop.run_until_complete(
                manager.generate(
                    lambda n, rid=rollout_id: data.next_groups(n, rid),
                    num_groups=rollout.batch_size,
                    draw_size=rollout.over_sampling_batch_size or rollout.batch_size,
                    sampling=sampling,
                )
            )
            if rollout.partial_rollout:
                data.add_to_buffer(result.aborted, rollout_id)
            metrics = {**pending_eval, **rollout_metrics(result)}
            pending_eval = {}
            metrics.update(session.train(to_train_samples(result.groups, recipe.algo)))
            loop.run_until_complete(session.push_weights(version=rollout_id + 1))
            done = rollout_id + 1
            if (
                eval_sets
                and recipe.eval.interval
                and (done % recipe.eval.interval == 0 or done == rollout.num_rollout)
            ):
                reports.append(loop.run_until_complete(evaluate(manager, eval_sets, done)))
                metrics.update(reports[-1].metrics)
            metrics["perf/step_time_s"] = time.perf_counter() - step_start
            logger.log(rollout_id, metrics)
            progress.update(metrics)
        progress.close()
        logger.close()
    loop.close()
    if reports:
        print(format_eval_table(reports))
    print(f"run directory: {run_dir}")
    return run_dir
