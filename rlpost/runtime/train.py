"""The training loop, top to bottom.

Decide where the run starts (rollout 0, or after a checkpoint), place it on its hardware,
start trainers, engines and the router, then for each rollout: generate and reward groups,
train on them, push the new weights to every engine, evaluate when due, log, and save when
due. Shape kept from slime's train.py; everything it reads is typed.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rlpost.data.source import DataSource
from rlpost.hooks import DYNAMIC_SAMPLING_FILTER, GENERATE_FUNCTION, load_hook
from rlpost.plan import Plan
from rlpost.rewards import compute_rewards
from rlpost.runtime import checkpoint
from rlpost.runtime.determinism import SeededGenerate, seed_driver
from rlpost.runtime.evaluation import (
    EvalReport,
    EvalSet,
    evaluate,
    format_eval_table,
    load_eval_sets,
)
from rlpost.runtime.metrics import MetricsLogger
from rlpost.runtime.progress import Progress, status
from rlpost.runtime.resume import (
    ResumePoint,
    plan_grid,
    set_aside_newer,
    trainer_backend,
)
from rlpost.runtime.rollout.manager import RolloutManager, SamplingSettings, generate_sample
from rlpost.runtime.run_state import (
    LoopState,
    read_buffer,
    restore_driver_rng,
    write_driver_state,
)
from rlpost.runtime.rundir import config_yaml, prepare_run_dir, provenance, run_dir_of
from rlpost.runtime.session import Session
from rlpost.runtime.train_data import rollout_metrics, to_train_samples
from rlpost.schema import RunConfig
from rlpost.types import Sample


def run(cfg: RunConfig, plan: Plan, resume: ResumePoint | None = None) -> Path:
    """Train as configured, from `resume` (see find_resume_point) or rollout 0; returns the
    run directory."""
    # Nothing is fetched from a model hub at run time: every path is local.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    run_dir = run_dir_of(cfg)
    start = resume.start_rollout if resume else 0
    total = cfg.recipe.rollout.num_rollout
    if start >= total:
        status(
            f"{start} rollouts are done and recipe.rollout.num_rollout={total}: nothing to "
            "train; raise num_rollout to continue the run"
        )
        return run_dir
    prepare_run_dir(cfg, start)
    if resume:
        set_aside_newer(run_dir, start)
    if cfg.run.deterministic:
        seed_driver(cfg.run.seed)
    inputs = load_inputs(cfg, resume)
    loop = asyncio.new_event_loop()
    with Session(cfg, plan, run_dir, loop) as session:
        reports = TrainLoop(cfg, plan, session, inputs, resume).run()
    loop.close()
    if reports:
        print(format_eval_table(reports))
    print(f"run directory: {run_dir}")
    return run_dir


@dataclass(frozen=True)
class Inputs:
    """What the loop reads: prompts (at the resumed position), eval sets, sampling."""

    data: DataSource
    eval_sets: list[EvalSet]
    sampling: SamplingSettings


def load_inputs(cfg: RunConfig, resume: ResumePoint | None) -> Inputs:
    from transformers import AutoTokenizer

    recipe, rollout = cfg.recipe, cfg.recipe.rollout
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.hf_checkpoint)
    data = DataSource.from_config(
        recipe.data,
        tokenizer,
        n_samples_per_prompt=rollout.n_samples_per_prompt,
        buffer_filter=rollout.buffer_filter,
    )
    if resume:
        data.load_state(resume.state.data)
        data.add_to_buffer(read_buffer(resume.path))
    sampling = SamplingSettings(
        max_new_tokens=rollout.max_response_len,
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        stop=tuple(rollout.stop),
        stop_token_ids=tuple(rollout.stop_token_ids),
        skip_special_tokens=rollout.skip_special_tokens,
    )
    return Inputs(data, load_eval_sets(recipe, tokenizer, rollout.stop_token_ids), sampling)


class TrainLoop:
    """The rollouts of one launch, inside a started Session."""

    def __init__(
        self,
        cfg: RunConfig,
        plan: Plan,
        session: Session,
        inputs: Inputs,
        resume: ResumePoint | None,
    ) -> None:
        assert session.client is not None
        self.cfg, self.plan, self.session, self.inputs = cfg, plan, session, inputs
        self.run_dir, self.loop = session.run_dir, session.loop
        rollout = cfg.recipe.rollout
        hook = (
            load_hook(rollout.generate_function, GENERATE_FUNCTION)
            if rollout.generate_function
            else generate_sample
        )
        # Deterministic mode: every request samples with its own derived seed.
        self.seeded = SeededGenerate(hook, cfg.run.seed) if cfg.run.deterministic else None
        self.manager = RolloutManager(
            session.client,
            self._reward,
            self.seeded or hook,
            load_hook(rollout.dynamic_sampling_filter, DYNAMIC_SAMPLING_FILTER)
            if rollout.dynamic_sampling_filter
            else None,
        )
        self.resume = resume
        self.start = resume.start_rollout if resume else 0
        self.reports = [EvalReport(**r) for r in resume.state.eval_history] if resume else []
        self.logger = MetricsLogger(
            self.run_dir,
            cfg.tracking,
            run_name=self.run_dir.name,
            start_rollout=self.start,
            wandb_run_id=self._resumed_wandb_id(),
        )

    async def _reward(self, samples: list[Sample]) -> list[float]:
        return await compute_rewards(samples, self.cfg.recipe.rollout.reward)

    def run(self) -> list[EvalReport]:
        cfg, rollout, start = self.cfg, self.cfg.recipe.rollout, self.start
        if cfg.run.deterministic:
            self.session.use_deterministic_algorithms()
        pending_eval: dict[str, float] = {}
        if self.resume:
            self._restore_trainer(self.resume)
        elif self.inputs.eval_sets and not cfg.recipe.eval.skip_before_train:
            pending_eval = self._evaluate(0)  # logged with rollout 0
        if self.resume:
            restore_driver_rng(self.resume.path)  # as it was when the checkpoint was taken
        progress = Progress(rollout.num_rollout, initial=start, enabled=cfg.run.progress)
        for rollout_id in range(start, rollout.num_rollout):
            metrics = {**pending_eval, **self.step(rollout_id)}
            pending_eval = {}
            # Logged before the save: a checkpoint never runs ahead of metrics.jsonl.
            self.logger.log(rollout_id, metrics)
            progress.update(metrics)
            self._save_when_due(rollout_id + 1)
        progress.close()
        self.logger.close()
        return self.reports

    def step(self, rollout_id: int) -> dict[str, float]:
        """Generate, train, push weights, evaluate when due: one rollout's metrics."""
        recipe, rollout = self.cfg.recipe, self.cfg.recipe.rollout
        data = self.inputs.data
        step_start = time.perf_counter()
        if self.seeded is not None:
            self.seeded.at("train", rollout_id)
        result = self.loop.run_until_complete(
            self.manager.generate(
                lambda n: data.next_groups(n, rollout_id),
                num_groups=rollout.batch_size,
                draw_size=rollout.over_sampling_batch_size or rollout.batch_size,
                sampling=self.inputs.sampling,
            )
        )
        # Groups finish in arrival order; train (and buffer) in prompt order instead, so
        # the update does not depend on which engine answered first.
        result.groups.sort(key=lambda g: g[0].group_index)
        result.aborted.sort(key=lambda g: g[0].group_index)
        if rollout.partial_rollout:
            data.add_to_buffer(result.aborted, rollout_id)
        metrics = rollout_metrics(result)
        metrics.update(self.session.train(to_train_samples(result.groups, recipe.algo)))
        done = rollout_id + 1
        self.loop.run_until_complete(self.session.push_weights(version=done))
        if self.inputs.eval_sets and _due(recipe.eval.interval, done, rollout.num_rollout):
            metrics.update(self._evaluate(done))
        metrics["perf/step_time_s"] = time.perf_counter() - step_start
        return metrics

    def _evaluate(self, done: int) -> dict[str, float]:
        if self.seeded is not None:
            self.seeded.at("eval", done)
        report = self.loop.run_until_complete(evaluate(self.manager, self.inputs.eval_sets, done))
        self.reports.append(report)
        return report.metrics

    def _save_when_due(self, done: int) -> None:
        save, total = self.cfg.recipe.save, self.cfg.recipe.rollout.num_rollout
        # the HF export first: a run killed between the two resumes from an older checkpoint
        # and exports again, where the other order would resume past a missing export
        if _due(save.save_hf_interval, done, total):
            self.session.export_policy(self.run_dir / "hf" / f"rollout_{done}")
        if _due(save.interval, done, total):
            self.save(done)

    def save(self, done: int) -> Path:
        """Write ckpt/rollout_<done> atomically (see rlpost.runtime.checkpoint)."""
        start = time.perf_counter()
        cfg, data = self.cfg, self.inputs.data
        staging = checkpoint.start_save(self.run_dir, done)
        with_optimizer = cfg.recipe.save.save_optimizer
        self.session.save_trainer(staging, with_optimizer)
        state = LoopState(
            rollouts_done=done,
            data=data.state(),
            wandb_run_id=self.logger.wandb_run_id,
            tensorboard_step=done,
            eval_history=[asdict(r) for r in self.reports],
            trainer_backend=trainer_backend(cfg, self.plan),
            parallel=plan_grid(self.plan),
            train_ranks=len(self.session.trainers),
            optimizer_saved=with_optimizer,
        )
        record = json.dumps(provenance(), indent=2) + "\n"
        write_driver_state(staging, state, data.buffer, config_yaml(cfg), record)
        path = checkpoint.commit_save(staging, cfg.recipe.save.keep_last)
        status(f"saved {path} ({time.perf_counter() - start:.1f} s)")
        return path

    def _restore_trainer(self, resume: ResumePoint) -> None:
        """Load every rank, then give the engines the resumed weights before rollout one."""
        without_rng = self.session.load_trainer(resume.path)
        if without_rng:
            status(f"train rank(s) {without_rng} had no saved RNG state (more ranks than saved)")
        self.loop.run_until_complete(self.session.push_weights(version=resume.start_rollout))

    def _resumed_wandb_id(self) -> str | None:
        """The same wandb run when the run continues in its own directory; a fork starts
        a new one."""
        resume = self.resume
        if resume is None or resume.path.parent != checkpoint.checkpoint_root(self.run_dir):
            return None
        return resume.state.wandb_run_id


def _due(interval: int | None, done: int, total: int) -> bool:
    return interval is not None and (done % interval == 0 or done == total)
