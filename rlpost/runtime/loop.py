"""The train steps of one launch, top to bottom, inside a started Session.

The rollout pipeline (rlpost.runtime.pipeline) produces rewarded groups within the bounds of
the plan's loop; each train step takes its batch, trains, pushes the weights to the engines
when due, evaluates when due, logs, and saves when due. The same steps serve every loop mode:
only the pipeline's bounds differ. Asked to stop (SIGTERM, rlpost.runtime.stop), the loop
saves every finished rollout and raises Stopped; a rollout it trained meanwhile is saved
without the evaluation and HF export due after it (`Unfinished`), which the resumed run does
first, so the stop's lead time covers a rollout's training and a save, nothing longer.
A failure to generate a group, or of the evaluation after a rollout, saves the same way
before the run fails: the failed groups are generated, the evaluation done, when resumed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn

import rlpost
from rlpost.data.source import DataSource
from rlpost.hooks import GENERATE_FUNCTION, load_hook
from rlpost.plan import Plan
from rlpost.plan.work import starts_elsewhere
from rlpost.rewards import RewardError, compute_rewards
from rlpost.rewards.model import RewardBatcher, score
from rlpost.rewards.scored import Scored
from rlpost.runtime import checkpoint
from rlpost.runtime.determinism import Seeding
from rlpost.runtime.evaluation import EvalReport, EvalSet, evaluate
from rlpost.runtime.metrics import MetricsLogger, jsonable
from rlpost.runtime.pipeline import (
    PipelineError,
    PipelineState,
    RolloutPipeline,
    load_group_filter,
)
from rlpost.runtime.progress import Progress, status
from rlpost.runtime.resume import ResumePoint, plan_grid
from rlpost.runtime.rollout.context import ContextFactory
from rlpost.runtime.rollout.manager import GroupRunner, SamplingSettings, generate_sample
from rlpost.runtime.rollout_dump import dump_rollout
from rlpost.runtime.run_state import (
    LoopState,
    SavedGroups,
    read_groups,
    restore_driver_rng,
    write_driver_state,
)
from rlpost.runtime.rundir import config_dict, config_yaml, provenance
from rlpost.runtime.session import Session
from rlpost.runtime.stop import Stopped, StopRequested, StopSignal
from rlpost.runtime.train_data import accounting, rollout_metrics, to_train_samples
from rlpost.schema import RunConfig
from rlpost.types import Sample

DEFAULT_GENERATE = "rlpost.runtime.rollout.manager.generate_sample"
EVALUATION, HF_EXPORT = "the evaluation", "the HF export"  # what may wait (`Unfinished`)


@dataclass(frozen=True)
class Unfinished:
    """A rollout trained after a SIGTERM (or whose evaluation failed), saved before its
    evaluation and HF export (when due): the resumed run evaluates and exports it first (as
    its config has them due), then logs its record. `metrics`: the record, when it waits
    for the evaluation (None: logged); `before_training`: rollout 0's evaluation before
    training, logged with it; `left_by`: what left it, "stop" or "evaluation" (failed), for
    the resumed run's messages and `rlpost status`."""

    rollout_id: int
    metrics: dict[str, float] | None = None
    before_training: dict[str, float] = dataclasses.field(default_factory=dict)
    groups: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    left_by: Literal["stop", "evaluation"] = "stop"

    @classmethod
    def from_state(cls, state: LoopState) -> Unfinished | None:
        return cls(**state.unfinished) if state.unfinished else None

    def to_state(self) -> dict[str, Any]:
        """For loop.json: the metrics as metrics.jsonl would hold them."""
        state = asdict(self)
        for key in ("metrics", "before_training"):
            if state[key] is not None:
                state[key] = {k: jsonable(v) for k, v in state[key].items()}
        return state


@dataclass(frozen=True)
class Inputs:
    """What the loop reads: prompts (at the resumed position), eval sets, sampling, and the
    tokenizer (generate functions render environment turns with it)."""

    data: DataSource | None  # None in mode=eval, which draws no training prompt
    eval_sets: list[EvalSet]
    sampling: SamplingSettings
    tokenizer: Any = None
    reward_model: Any = None  # the reward model class built in the driver, when it runs here


class SaveFailedError(RuntimeError):
    """The run's last checkpoint could not be written."""


class EvaluationError(RuntimeError):
    """An evaluation failed: a hook raised, an engine server is gone (the cause is chained).
    `record`: when it was the evaluation due after a train step, that step's metrics and
    groups, whose record waits for it."""

    def __init__(self, done: int, cause: Exception) -> None:
        super().__init__(f"the evaluation after rollout {done}: {type(cause).__name__}: {cause}")
        self.record: tuple[dict[str, float], dict[str, list[int]]] | None = None


class TrainLoop:
    def __init__(
        self,
        cfg: RunConfig,
        plan: Plan,
        session: Session,
        inputs: Inputs,
        resume: ResumePoint | None,
        stop: StopSignal | None = None,
    ) -> None:
        assert session.client is not None
        self.cfg, self.plan, self.session, self.inputs = cfg, plan, session, inputs
        self.run_dir = session.run_dir
        self.reward_model = self._reward_model()
        rollout = cfg.recipe.rollout
        hook_name = rollout.generate_function or DEFAULT_GENERATE
        hook = load_hook(hook_name, GENERATE_FUNCTION) if rollout.generate_function else None
        generate = hook or generate_sample
        # deterministic mode: every request samples with its own derived seed
        seeded = cfg.run.deterministic
        # what a random reward draws for a sample is fixed by the run's seed and the sample
        self.reward_seed = cfg.run.seed if seeded else None
        self.eval_seeding = Seeding(cfg.run.seed, "eval") if seeded else None
        shared = ContextFactory(
            tokenizer=inputs.tokenizer,
            max_turns=rollout.max_turns,
            settings=dict(rollout.generate_settings),
            seeder=Seeding(cfg.run.seed, "train") if seeded else None,
        )
        evaluation = dataclasses.replace(shared, evaluation=True, seeder=self.eval_seeding)
        together = plan.runtime.requests == "group"
        timeout_s = plan.runtime.episode_timeout_s
        self.eval_runner = GroupRunner(
            session.client, self._reward, generate, hook_name, evaluation, together, timeout_s
        )
        self.resume = resume
        self.start = resume.start_rollout if resume else 0
        self._pipeline: RolloutPipeline | None = None
        if inputs.data is not None:  # training: its rollouts' pipeline (mode=eval has none)
            group_filter = (
                load_group_filter(rollout.dynamic_sampling_filter)
                if rollout.dynamic_sampling_filter
                else None
            )
            self._pipeline = RolloutPipeline(
                GroupRunner(
                    session.client, self._reward, generate, hook_name, shared, together, timeout_s
                ),
                inputs.data,
                inputs.sampling.to_sglang(),
                plan.runtime.loop,
                rollout.batch_size,
                group_filter=group_filter,
                partial_rollout=rollout.partial_rollout,
                start_step=self.start,
                start_version=self.start,
            )
        # the run's evaluations so far, which its final table shows (an evaluation: its own)
        history = resume.state.eval_history if resume and cfg.mode == "train" else []
        self.reports = [EvalReport(**r) for r in history]
        self.unfinished = Unfinished.from_state(resume.state) if resume else None
        self._evaluating: asyncio.Future[dict[str, float]] | None = None
        waiting = self.unfinished is not None and self.unfinished.metrics is not None
        self.logger = MetricsLogger(
            self.run_dir,
            cfg.tracking,
            run_name=self.run_dir.name,
            # a record that waited for its evaluation is logged (again, if an earlier resume
            # from the same checkpoint logged it) by this run
            start_rollout=self.start - 1 if waiting else self.start,
            wandb_run_id=self._resumed_wandb_id(),
            config=config_dict(cfg),
        )
        self.failed_saves: list[int] = []
        self.stop = stop
        # the newest rollout a checkpoint of this run holds: a stop saves only what is newer
        self.saved_at = self.start
        # what a stop left of the resumed checkpoint's last rollout, done by this launch: the
        # checkpoint still marks it, so a stop before the next save saves again
        self.finished_left_work = False

    def _reward_model(self) -> RewardBatcher | None:
        """The reward model class, when the recipe names one: in its actor, or in the
        driver (built with the inputs)."""
        reward = self.cfg.recipe.rollout.reward
        if reward.type != "model" or reward.model is None:
            return None
        name, timeout_s = reward.model, reward.timeout_s
        if self.session.reward_actor is not None:
            remote = self.session.score_rewards
        else:
            model = self.inputs.reward_model
            assert model is not None, "load_inputs builds the driver's reward model"

            async def remote(samples: list[Sample]) -> list[Scored]:
                return await score(model, samples, name)

        async def scorer(samples: list[Sample]) -> list[Scored]:
            try:
                return await asyncio.wait_for(remote(samples), timeout_s)
            except TimeoutError:
                raise RewardError(
                    f"reward model '{name}' ran past reward.timeout_s={timeout_s} on "
                    f"{len(samples)} samples; raise the timeout or lower model_batch_size"
                ) from None

        return RewardBatcher(scorer, reward.model_batch_size)

    async def _reward(self, samples: list[Sample]) -> list[float]:
        if self.reward_model is not None:
            return await self.reward_model(samples)
        return await compute_rewards(samples, self.cfg.recipe.rollout.reward, self.reward_seed)

    async def run(self) -> list[EvalReport]:
        cfg, total, start = self.cfg, self.cfg.recipe.rollout.num_rollout, self.start
        if cfg.run.deterministic:
            await self.session.use_deterministic_algorithms()
        pending_eval: dict[str, float] = {}
        if self.resume:
            await self._restore(self.resume)
        else:
            if starts_elsewhere(cfg):  # the engines start from model.hf_checkpoint's weights
                await self.session.push_weights(version=0)
            evaluate_first = cfg.mode == "train" and not cfg.recipe.eval.skip_before_train
            if self.inputs.eval_sets and evaluate_first:
                pending_eval = await self._evaluate(0)  # logged with rollout 0
        if cfg.mode == "eval":
            return await self._evaluate_only(start)
        if self.resume:
            restore_driver_rng(self.resume.path)  # as it was when the checkpoint was taken
        if self.unfinished is not None:
            await self._finish(self.unfinished)
            self.finished_left_work = True
            if start >= total:  # no rollout follows: saved again, with nothing waiting
                try:
                    await self.save(start)
                finally:
                    self.logger.close()
                return self.reports
        progress = Progress(total, initial=start, enabled=cfg.run.progress)
        self.pipeline.start()
        if self.stop is not None:
            self.stop.accept(self.pipeline.stop_taking)
            self.stop.accept(self._give_up_evaluating)
        try:
            for step in range(start, total):
                try:
                    metrics, groups, eval_waits = await self.step(step)
                except StopRequested:
                    await self._stop(step)
                except PipelineError as exc:
                    if exc.groups_kept:
                        await self._save_before_failing(step)
                    raise
                except EvaluationError as exc:  # saved first, evaluated first when resumed
                    if exc.record is not None:
                        metrics, groups = exc.record
                        left = Unfinished(step, metrics, pending_eval, groups, "evaluation")
                        await self._save_before_failing(step + 1, left)
                    raise
                if eval_waits:  # stopping: saved first, evaluated and logged when resumed
                    await self._stop(step + 1, Unfinished(step, metrics, pending_eval, groups))
                # Logged before the save: a checkpoint never runs ahead of metrics.jsonl
                # (but for a record that waits for its evaluation, which the checkpoint holds).
                progress.update(self._log_step(step, pending_eval, metrics, groups))
                pending_eval = {}
                if self.stopping and step + 1 < total:  # the last one ends the run as usual
                    await self._stop(step + 1, Unfinished(step))
                await self._save_when_due(step + 1)
                self.pipeline.step_done(step)
        finally:
            await self.pipeline.close()
            progress.close()
            self.logger.close()
        return self.reports

    async def _evaluate_only(self, done: int) -> list[EvalReport]:
        """mode=eval: the weights the engines now serve (model.load's or hf_checkpoint's, or
        the checkpoint's after `done` rollouts), evaluated once with the seeds a training
        run's evaluation after `done` rollouts has, and logged at `done`."""
        try:
            self.logger.log(done, await self._evaluate(done))
        finally:
            self.logger.close()
        return self.reports

    @property
    def pipeline(self) -> RolloutPipeline:
        """The training rollouts' pipeline (training only: mode=eval builds none)."""
        if self._pipeline is None:
            raise RuntimeError("mode=eval has no training rollouts")
        return self._pipeline

    @property
    def data(self) -> DataSource:
        """The training prompts (training only: mode=eval reads none)."""
        if self.inputs.data is None:
            raise RuntimeError("mode=eval draws no training prompt")
        return self.inputs.data

    @property
    def stopping(self) -> bool:
        return self.stop is not None and self.stop.requested.is_set()

    def _log_step(
        self,
        step: int,
        before_training: dict[str, float],
        metrics: dict[str, float],
        groups: dict[str, list[int]],
    ) -> dict[str, float]:
        *evaluations, record = step_records(before_training, metrics)
        for evaluation in evaluations:
            self.logger.log(step, evaluation)
        self.logger.log(step, record, extra={"groups": groups})
        return record

    def _waiting(self, unfinished: Unfinished) -> tuple[str, ...]:
        """What is due after `unfinished`'s rollout and not done: its evaluation, when its
        record waits for one, and its HF export."""
        cfg, total = self.cfg.recipe, self.cfg.recipe.rollout.num_rollout
        done = unfinished.rollout_id + 1
        evaluates = bool(self.inputs.eval_sets) and _due(cfg.eval.interval, done, total)
        due = {
            EVALUATION: unfinished.metrics is not None and evaluates,
            HF_EXPORT: _due(cfg.save.save_hf_interval, done, total),
        }
        return tuple(what for what, is_due in due.items() if is_due)

    async def _stop(self, done: int, unfinished: Unfinished | None = None) -> NoReturn:
        """Save the rollouts finished since the newest checkpoint, then raise Stopped.
        `unfinished`: the rollout trained since the signal, whose evaluation and HF export
        (when due) the resumed run does first."""
        waiting = self._waiting(unfinished) if unfinished is not None else ()
        kept = unfinished if waiting or (unfinished and unfinished.metrics is not None) else None
        # the checkpoint resumed from marks as waiting what this launch did: saved again,
        # so that the next launch does not evaluate, log and export that rollout once more
        redone = self.finished_left_work and done == self.start
        saved = await self.save(done, kept) if done > self.saved_at or redone else None
        if saved is None and kept is not None and kept.metrics is not None:
            # nothing to resume it from: its record is logged as it is, without the evaluation
            self._log_step(kept.rollout_id, kept.before_training, kept.metrics, kept.groups)
            waiting = ()
        raise Stopped(done, saved, waiting)

    async def _save_before_failing(self, done: int, unfinished: Unfinished | None = None) -> None:
        """A group's generation or an evaluation failed (a hook raised, the engines went
        away) while the trainers hold `done` finished rollouts: those since the newest
        checkpoint are saved before the run fails, as a SIGTERM's stop saves them, with the
        failed group among those generated again after a resume; `unfinished`: the rollout
        whose evaluation failed, which the resumed run evaluates (and logs) first. A save
        that fails too leaves the newest checkpoint as it was, and the first failure is the
        one reported."""
        if done <= self.saved_at:
            return
        try:
            await self.save(done, unfinished)
        except Exception as exc:  # the trainers are gone too: the first error stands
            status(f"the rollouts finished since the newest checkpoint were not saved: {exc}")

    async def _finish(self, unfinished: Unfinished) -> None:
        """What a SIGTERM (or a failed evaluation) left of the rollout before the resumed
        one: its evaluation (its record waited for it) and its HF export, as this run's
        config has them due."""
        step = unfinished.rollout_id
        done = step + 1
        waiting = self._waiting(unfinished)
        if unfinished.metrics is not None:
            metrics = dict(unfinished.metrics)
            if EVALUATION in waiting:
                metrics.update(await self._evaluate(done))
            metrics["perf/weight_version"] = float(self.session.weight_version)  # now `done`
            self._log_step(step, unfinished.before_training, metrics, unfinished.groups)
        if HF_EXPORT in waiting:
            await self._export_hf(done)

    async def step(self, step: int) -> tuple[dict[str, float], dict[str, list[int]], bool]:
        """Take the step's groups, train, push weights and evaluate when due. The flag: an
        evaluation was due and waits, since the loop stops after this rollout (SIGTERM).
        An evaluation that fails raises EvaluationError with the step's record."""
        cfg, rollout = self.cfg, self.cfg.recipe.rollout
        started = time.perf_counter()
        first = step == self.start
        startup = time.time() - rlpost.IMPORTED_AT  # the launch to this process's first step
        batch = await self.pipeline.take(step)
        # Groups finish in arrival order; train in prompt order instead, so the update does
        # not depend on which engine answered first.
        batch.groups.sort(key=lambda g: g[0].group_index)
        self.data.trained(batch.groups)
        if cfg.run.dump_rollouts:
            await asyncio.to_thread(dump_rollout, self.run_dir, step, batch.groups)
        metrics = rollout_metrics(batch)
        samples = to_train_samples(
            batch.groups, cfg.recipe.algo, rollout.mask_offpolicy_in_partial_rollout
        )
        metrics.update(await self.session.train(samples, self.plan.work.reference_due(step)))
        done = step + 1
        eval_due = bool(self.inputs.eval_sets) and _due(
            cfg.recipe.eval.interval, done, rollout.num_rollout
        )
        # stopping before the last rollout, an evaluation waits for the resumed run: the save
        # comes first (`Unfinished`); and no push is due (no rollout follows). A SIGTERM
        # during the evaluation gives it up the same way.
        eval_waits = eval_due and self.stopping and done < rollout.num_rollout
        eval_now = eval_due and not eval_waits
        push_due = done % cfg.recipe.loop.update_weights_interval == 0 and not self.stopping
        if push_due or eval_now:
            metrics["perf/weight_sync_time_s"] = await self.session.push_weights(version=done)
            self.pipeline.weights_pushed(done)
        failed: EvaluationError | None = None
        if eval_now:
            try:
                evaluated = await self._evaluate_unless_stopped(done)
            except EvaluationError as exc:  # the record waits for it, as for a stop
                evaluated, failed = None, exc
            if evaluated is None:
                eval_waits = True
            else:
                metrics.update(evaluated)
        wall = time.perf_counter() - started
        metrics["perf/step_time_s"] = wall
        metrics["perf/rollout_tokens_per_s"] = metrics["rollout/response_tokens"] / wall
        metrics["perf/weight_version"] = float(self.session.weight_version)
        if first:
            metrics["perf/startup_time_s"] = startup
        groups = accounting(batch, self.outstanding())
        if failed is not None:
            failed.record = (metrics, groups)
            raise failed
        return metrics, groups, eval_waits

    def outstanding(self) -> list[int]:
        """Groups drawn but not yet trained, filtered or dropped: queued, generating, or
        waiting in the data buffer (partial rollouts, prompts put back)."""
        pipeline = self.pipeline.snapshot()
        groups = [*pipeline.queued, *pipeline.generating, *self.data.buffer]
        return sorted({g[0].group_index for g in groups})

    async def _evaluate_unless_stopped(self, done: int) -> dict[str, float] | None:
        """The evaluation after rollout `done`; None when a SIGTERM came before it began or
        while it ran (not after the last rollout): it is given up, to be done first by the
        resumed run."""
        if done >= self.cfg.recipe.rollout.num_rollout:
            return await self._evaluate(done)
        if self.stopping:  # the signal came during the push
            return None
        self._evaluating = asyncio.ensure_future(self._evaluate(done))
        try:
            return await self._evaluating
        except asyncio.CancelledError:
            this = asyncio.current_task()
            if this is not None and this.cancelling():  # the launch ends at once (2nd SIGTERM)
                raise
            status(f"the evaluation after rollout {done} is given up for the stop")
            return None
        finally:
            self._evaluating = None

    def _give_up_evaluating(self) -> None:
        """A SIGTERM came (the stop's wake-up): an evaluation running now waits for the
        resumed run instead of the save."""
        if self._evaluating is not None:
            self._evaluating.cancel()

    async def _evaluate(self, done: int) -> dict[str, float]:
        if self.eval_seeding is not None:
            self.eval_seeding.at(done)
        version = self.session.weight_version
        try:
            report = await evaluate(
                self.eval_runner, self.inputs.eval_sets, done, version, self.reward_seed
            )
        except Exception as exc:
            raise EvaluationError(done, exc) from exc
        self.reports.append(report)
        return report.metrics

    async def _save_when_due(self, done: int) -> None:
        save, total = self.cfg.recipe.save, self.cfg.recipe.rollout.num_rollout
        # the HF export first: a run killed between the two resumes from an older checkpoint
        # and exports again, where the other order would resume past a missing export
        if _due(save.save_hf_interval, done, total):
            await self._export_hf(done)
        if _due(save.interval, done, total):
            await self.save(done)

    async def _export_hf(self, done: int) -> None:
        try:
            await self.session.export_policy(self.run_dir / "hf" / f"rollout_{done}")
        except OSError as exc:
            status(f"the HF export after rollout {done} could not be written: {exc}")

    async def save(self, done: int, unfinished: Unfinished | None = None) -> Path | None:
        """Write ckpt/rollout_<done> atomically (see rlpost.runtime.checkpoint). A save the
        disk refuses (full, a quota, a size limit) is reported and the previous checkpoint
        stays the newest; when it was the run's last save, the run fails. `unfinished`: what
        the resumed run does first (a SIGTERM's save)."""
        start = time.perf_counter()
        cfg, data = self.cfg, self.data
        # one consistent cut of the data position, the buffer and the pipeline's groups
        pipeline = self.pipeline.snapshot()
        groups = SavedGroups(data.buffer, pipeline.queued, pipeline.generating)
        state = LoopState(
            rollouts_done=done,
            data=data.state(),
            wandb_run_id=self.logger.wandb_run_id,
            tensorboard_step=done,
            eval_history=[asdict(r) for r in self.reports],
            trainer_backend=self.plan.trainer_backend,
            parallel=plan_grid(self.plan),
            train_ranks=len(self.session.trainers),
            optimizer_saved=cfg.recipe.save.save_optimizer,
            unfinished=unfinished.to_state() if unfinished is not None else None,
        )

        async def write(staging: Path) -> None:
            await self.session.save_trainer(staging, cfg.recipe.save.save_optimizer)
            record = json.dumps(provenance(), indent=2) + "\n"
            write_driver_state(staging, state, groups, config_yaml(cfg), record)

        try:
            path = await checkpoint.save(self.run_dir, done, write, cfg.recipe.save.keep_last)
        except checkpoint.SaveError as exc:
            self._save_failed(done, exc)
            return None
        status(f"saved {path} ({time.perf_counter() - start:.1f} s)")
        self.saved_at = done
        return path

    def _save_failed(self, done: int, exc: checkpoint.SaveError) -> None:
        newest = checkpoint.scan(self.run_dir, check_hashes=False).latest
        self.failed_saves.append(done)
        kept = f"{newest} is still the newest checkpoint" if newest else "no checkpoint exists"
        message = f"the checkpoint after rollout {done} could not be written ({exc}); {kept}"
        if done == self.cfg.recipe.rollout.num_rollout:
            raise SaveFailedError(message) from exc
        status(message + "; training goes on and the next save tries again")

    async def _restore(self, resume: ResumePoint) -> None:
        """Load every rank, give the engines the resumed weights before the first rollout,
        and put the checkpoint's queued groups back in the pipeline."""
        without_rng = await self.session.load_trainer(resume.path)
        if without_rng:
            status(f"train rank(s) {without_rng} had no saved RNG state (more ranks than saved)")
        await self.session.push_weights(version=resume.start_rollout)
        if self._pipeline is not None:  # an evaluation of the checkpoint generates none of them
            saved = read_groups(resume.path)
            self._pipeline.restore(PipelineState(queued=saved.queued, generating=saved.generating))

    def _resumed_wandb_id(self) -> str | None:
        """The same wandb run when the run continues in its own directory; a fork starts
        a new one."""
        resume = self.resume
        if resume is None or resume.path.parent != checkpoint.checkpoint_root(self.run_dir):
            return None
        return resume.state.wandb_run_id


def step_records(
    before_training: dict[str, float], metrics: dict[str, float]
) -> list[dict[str, float]]:
    """What a step logs: its metrics, with the evaluation before training (if any) in the
    same record (rollout 0's), or in a record of its own ahead of it when the step evaluated
    too (eval.interval=1), so that neither evaluation overwrites the other."""
    if before_training.keys() & metrics.keys():
        return [before_training, metrics]
    return [{**before_training, **metrics}]


def _due(interval: int | None, done: int, total: int) -> bool:
    return interval is not None and (done % interval == 0 or done == total)
