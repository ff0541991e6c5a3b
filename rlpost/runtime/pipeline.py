"""The rollout pipeline: a producer of rewarded groups, a bounded queue, and a trainer that
takes one batch per train step. Every `recipe.loop.mode` is this pipeline with the bounds of
its LoopPlan (rlpost.plan.loop):

- draw: `draw_groups` prompts are drawn while fewer than `max_buffered_groups` groups are
  queued or generating, and the step they would land in, s, satisfies s <= steps_done +
  lookahead (when bounded) and s - engine_version <= max_staleness;
- finish: a finished group passes the dynamic-sampling filter into the queue, or is counted
  as filtered; once max_draws_per_rollout draws' worth of groups finished without filling
  the batch the queue fills, the run stops (DrawLimitError);
- take: the trainer takes `batch_size` queued groups in queue order; a group whose oldest
  policy token is more than max_staleness versions behind the trained step is dropped or
  regenerated; groups still generating that could no longer land within the bounds (sync:
  everything still running once a batch is complete) are stopped: to the partial-rollout
  buffer, regenerated or dropped.

Staleness counts the tokens generated since a group was drawn; tokens a partial rollout
carried over from an earlier rollout are off-policy by design (recipe.rollout.
mask_offpolicy_in_partial_rollout takes them out of the loss).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from dataclasses import dataclass, field
from typing import Any

from rlpost.data.source import DataSource
from rlpost.hooks import DYNAMIC_SAMPLING_FILTER, load_hook, shown
from rlpost.plan.loop import LoopPlan
from rlpost.runtime.progress import status
from rlpost.runtime.rollout.manager import Group, GroupClient, GroupFilter, GroupRunner
from rlpost.runtime.stop import StopRequested
from rlpost.types import Sample

log = logging.getLogger(__name__)


@dataclass
class InFlight:
    group: Group
    client: GroupClient
    task: asyncio.Task[Group]
    start_version: int
    drawn_for: int
    stop_reason: str | None = None


@dataclass
class Tally:
    """What happened to groups since the last take (group indices), for metrics and the
    accounting record of each step."""

    filtered: list[int] = field(default_factory=list)
    dropped_stale: list[int] = field(default_factory=list)
    regenerated: list[int] = field(default_factory=list)
    to_buffer: list[int] = field(default_factory=list)
    cut_short: list[int] = field(default_factory=list)

    def as_record(self) -> dict[str, list[int]]:
        return {name: list(values) for name, values in self.__dict__.items()}


@dataclass(frozen=True)
class Batch:
    """The groups of one train step, and how stale each sample is."""

    groups: list[Group]
    staleness: list[int]
    tally: Tally
    wait_s: float


@dataclass(frozen=True)
class PipelineState:
    """For a checkpoint: finished groups waiting for the trainer (trained after a resume as
    they would have been) and prompts being generated, or whose generation failed (generated
    again)."""

    queued: list[Group]
    generating: list[Group]


class PipelineError(RuntimeError):
    """Generating or rewarding a group failed (the cause is chained). `groups_kept`: every
    group drawn is still the pipeline's (the failed one among those generating again after
    a resume), so a checkpoint taken now loses no prompt."""

    def __init__(self, message: str, groups_kept: bool = False) -> None:
        super().__init__(message)
        self.groups_kept = groups_kept


class FilterError(RuntimeError):
    """A dynamic sampling filter raised, or returned something other than True or False."""


class DrawLimitError(RuntimeError):
    """The dynamic sampling filter kept too few groups to fill a rollout's batch within
    recipe.rollout.max_draws_per_rollout draws."""


@dataclass(frozen=True)
class NamedFilter:
    """The dynamic sampling filter at `path`, each verdict checked: True or False (a NumPy or
    torch bool too), else FilterError naming the filter and the group. Unchecked, a filter
    that ends without a return (None) would drop every group, and the run draw on forever."""

    path: str
    hook: GroupFilter

    def __call__(self, group: Group) -> bool:
        path, where = self.path, f"group {group[0].group_index}"
        try:
            verdict: Any = self.hook(group)
        except Exception as exc:
            raise FilterError(
                f"dynamic sampling filter '{path}' raised {type(exc).__name__}: {exc} (on {where})"
            ) from exc
        if isinstance(verdict, bool):
            return verdict
        with contextlib.suppress(Exception):  # a NumPy or torch bool holds a bool
            if isinstance(verdict.item(), bool):
                return bool(verdict.item())
        hint = " (a function that ends without a return returns None)" if verdict is None else ""
        raise FilterError(
            f"dynamic sampling filter '{path}' returned {shown(verdict)} for {where}{hint}; "
            "it returns True to keep the group, False to drop it"
        )


def load_group_filter(path: str) -> NamedFilter:
    """The dynamic sampling filter at `path`, its verdicts checked (NamedFilter)."""
    return NamedFilter(path, load_hook(path, DYNAMIC_SAMPLING_FILTER))


@dataclass
class Filling:
    """The groups finished since the queue last completed a batch: kept by the filter, and
    all of them (kept or dropped). `warned`: the run was told that this batch is slow to
    fill."""

    finished: int = 0
    kept: int = 0
    warned: bool = False


def oldest_version(group: Group) -> int | None:
    """The oldest policy version among the tokens generated since the group was drawn."""
    versions = [v for s in group for v in s.policy_versions(s.resumed_at)]
    return min(versions) if versions else None


def _oldest(sample: Sample, default: int) -> int:
    versions = sample.policy_versions(sample.resumed_at)
    return min(versions) if versions else default


class RolloutPipeline:
    def __init__(
        self,
        runner: GroupRunner,
        data: DataSource,
        params: dict[str, Any],
        bounds: LoopPlan,
        batch_size: int,
        *,
        group_filter: GroupFilter | None = None,
        partial_rollout: bool = False,
        start_step: int = 0,
        start_version: int = 0,
    ) -> None:
        self.runner, self.data, self.params = runner, data, params
        self.bounds, self.batch_size = bounds, batch_size
        self.group_filter = group_filter
        self.partial_rollout = partial_rollout
        self.steps_taken = start_step
        self.steps_done = start_step
        self.engine_version = start_version
        self.queue: list[Group] = []
        self.in_flight: list[InFlight] = []
        self.tally = Tally()
        self.filling = Filling()
        self._changed = asyncio.Event()
        self._error: BaseException | None = None
        self._failed_at = ""
        self._groups_kept = False
        # Groups whose generation failed: until the failure reaches the trainer (at its next
        # take) a checkpoint may still be written, and it must keep them to generate again.
        self.failed: list[Group] = []
        self._given_up: list[asyncio.Task[Group]] = []  # their tasks, cancelled
        self._producer: asyncio.Task[None] | None = None
        self._stopping = False
        # a checkpoint's groups that were generating: generated again before any new draw
        self._resumed: list[Group] = []

    # ---- the trainer's side ------------------------------------------------------------

    def start(self) -> None:
        self._producer = asyncio.get_running_loop().create_task(self._produce())

    async def take(self, step: int) -> Batch:
        """The next train step's groups, once `batch_size` fresh enough ones are queued;
        StopRequested, with nothing taken, once `stop_taking` was called."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        while True:
            self._raise_failure()
            if self._stopping:
                raise StopRequested(f"train step {step} was not taken")
            self._drop_stale(step)
            if len(self.queue) >= self.batch_size:
                break
            self._changed.clear()
            await self._changed.wait()
        taken, self.queue = self.queue[: self.batch_size], self.queue[self.batch_size :]
        self.steps_taken = step + 1
        await self._stop_out_of_bounds()
        groups = list(taken)
        staleness = [step - _oldest(s, step) for g in groups for s in g]
        tally, self.tally = self.tally, Tally()
        self._changed.set()
        return Batch(groups, staleness, tally, loop.time() - started)

    def stop_taking(self) -> None:
        """The run stops (rlpost.runtime.stop): a take waiting for its groups, or the next
        one, raises StopRequested and takes nothing, so the queue stays whole for the
        checkpoint. Generation goes on until `close`."""
        self._stopping = True
        self._changed.set()

    def weights_pushed(self, version: int) -> None:
        """The engines serve `version` now."""
        self.engine_version = version
        self._changed.set()

    def step_done(self, step: int) -> None:
        """Train step `step` is complete (trained, pushed, evaluated, saved): generation
        may run ahead of the next one."""
        self.steps_done = step + 1
        self._changed.set()

    def snapshot(self) -> PipelineState:
        """The pipeline's groups as a checkpoint keeps them (synchronous: a consistent cut
        with the data position)."""
        generating = [*self._resumed, *self._generating(), *self.failed]
        return PipelineState(
            queued=list(self.queue), generating=[[s.fresh() for s in g] for g in generating]
        )

    def _generating(self) -> list[Group]:
        return [f.group for f in self.in_flight]

    def restore(self, state: PipelineState) -> None:
        """Queued groups go back in the queue; groups that were generating are generated
        again first, as the draw they were part of: a new draw would top them up with fresh
        prompts, more than the run had drawn, and those past the step's need would be cut
        short, their prompts lost."""
        self.queue.extend(state.queued)
        self._resumed.extend(state.generating)

    async def close(self) -> None:
        """Stop generating: the producer, then every group in flight."""
        if self._producer is not None:
            self._producer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._producer
            self._producer = None
        tasks = [f.task for f in self.in_flight] + self._given_up
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        self.in_flight.clear()
        self._given_up.clear()

    # ---- the producer ------------------------------------------------------------------

    def _landing_step(self, ahead: int = 0) -> int:
        """The train step a group finishing now would land in (after `ahead` more)."""
        return self.steps_taken + (len(self.queue) + ahead) // self.batch_size

    def _may_draw(self) -> bool:
        b = self.bounds
        if len(self.queue) + len(self.in_flight) >= b.max_buffered_groups:
            return False
        step = self._landing_step(len(self.in_flight))
        if b.lookahead_steps is not None and step > self.steps_done + b.lookahead_steps:
            return False
        return step - self.engine_version <= b.max_staleness

    async def _produce(self) -> None:
        try:
            if self._resumed:
                resumed, self._resumed = self._resumed, []
                self._launch(resumed, self._landing_step(len(self.in_flight)))
            while True:
                while self._error is None and self._may_draw():
                    self._draw()
                self._changed.clear()
                await self._changed.wait()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # drawing failed (data, buffer filter): the trainer reports it
            self._fail(exc, "drawing prompts")

    def _draw(self) -> None:
        step = self._landing_step(len(self.in_flight))
        self._launch(self.data.next_groups(self.bounds.draw_groups, step), step)

    def _launch(self, groups: list[Group], step: int) -> None:
        for group in groups:
            for sample in group:
                sample.resumed_at = len(sample.response_ids)
            client = self.runner.client_for(group)
            task = asyncio.get_running_loop().create_task(
                self.runner.run(group, self.params, client)
            )
            flight = InFlight(group, client, task, self.engine_version, step)
            self.in_flight.append(flight)
            task.add_done_callback(functools.partial(self._finished, flight))

    def _finished(self, flight: InFlight, _: asyncio.Task[Group]) -> None:
        if flight not in self.in_flight:  # given up for another group's failure: kept failed
            return
        self.in_flight.remove(flight)
        self._changed.set()
        if flight.task.cancelled():
            return
        error = flight.task.exception()
        index = flight.group[0].group_index
        if error is not None:
            self.failed.append(flight.group)
            self._fail(
                error,
                f"generating group {index} (prompt of sample {flight.group[0].index})",
                groups_kept=True,
            )
            return
        group = flight.task.result()
        try:
            if flight.stop_reason is not None:
                self._settle_stopped(group, flight.stop_reason)
            elif self.group_filter is None or self.group_filter(group):
                self.queue.append(group)
                self._count_finished(kept=True)
            else:
                self.tally.filtered.append(index)
                self._count_finished(kept=False)
        except Exception as exc:  # a filter hook that raised: the group is generated again
            self.failed.append(group)  # after a resume, as a group whose generation failed
            self._fail(exc, f"filtering group {index}", groups_kept=True)

    def _count_finished(self, kept: bool) -> None:
        """Count a group the filter judged toward the batch the queue is filling; past
        max_draws_per_rollout draws' worth of them with the batch not full, the run stops
        (verl's filter_groups.max_num_gen_batches). Counted by finished groups rather than
        draws started, so that how far generation runs ahead (the loop mode, a slow trainer)
        does not count."""
        filling, limit = self.filling, self.bounds.max_draws_per_rollout
        filling.finished += 1
        filling.kept += kept
        if filling.kept >= self.batch_size:
            self.filling = Filling()
            return
        if limit is None:
            return
        draws = filling.finished / self.bounds.draw_groups
        if draws >= limit:
            error = DrawLimitError(self._draw_limit_message())
            self._fail(error, "dynamic sampling", groups_kept=True)
        elif draws >= max(limit / 2, 2) and not filling.warned:
            filling.warned = True
            status(self._slow_filling_message(limit))

    def _filling_rollout(self) -> int:
        return self.steps_taken + len(self.queue) // self.batch_size

    def _filter_name(self) -> str:
        f = self.group_filter
        named = f" '{f.path}'" if isinstance(f, NamedFilter) else ""
        return f"the dynamic sampling filter{named}"

    def _slow_filling_message(self, limit: int) -> str:
        f, draw = self.filling, self.bounds.draw_groups
        return (
            f"rollout {self._filling_rollout()}: {f.finished} groups finished "
            f"({f.finished / draw:g} draws of {draw} prompts), and {self._filter_name()} "
            f"kept {f.kept} of the {self.batch_size} its batch needs; the run stops at "
            f"rollout.max_draws_per_rollout={limit} draws"
        )

    def _draw_limit_message(self) -> str:
        f, b = self.filling, self.bounds
        return (
            f"rollout {self._filling_rollout()}: {f.finished} groups finished in "
            f"rollout.max_draws_per_rollout={b.max_draws_per_rollout} draws of "
            f"{b.draw_groups} prompts, and {self._filter_name()} kept "
            f"{f.kept} of the {self.batch_size} its batch needs ({f.finished - f.kept} "
            "dropped). Check what the filter drops (rlpost.filters.check_reward_nonzero_std "
            "drops groups whose rewards are all equal: a model that answers every prompt "
            "wrong, or every one right, gets no signal from them: easier prompts, more "
            "samples per prompt, or a reward with partial credit), or raise "
            "rollout.max_draws_per_rollout (null: no limit)"
        )

    # ---- bounds ------------------------------------------------------------------------

    def _drop_stale(self, step: int) -> None:
        kept = []
        for group in self.queue:
            oldest = oldest_version(group)
            if oldest is not None and step - oldest > self.bounds.max_staleness:
                self._settle_stale(group)
            else:
                kept.append(group)
        self.queue = kept

    async def _stop_out_of_bounds(self) -> None:
        """Stop the groups in flight that could no longer be trained within the bounds, and
        wait until they have stopped (a colocated run releases the engines next)."""
        b, land = self.bounds, self._landing_step()
        doomed = []
        for flight in self.in_flight:
            ahead = b.lookahead_steps is not None and land > self.steps_done + b.lookahead_steps
            stale = land - flight.start_version > b.max_staleness
            if ahead or stale:
                flight.stop_reason = "stale" if stale and not ahead else "cut short"
                doomed.append(flight)
        await asyncio.gather(*(f.client.stop() for f in doomed), return_exceptions=True)
        await asyncio.gather(*(f.task for f in doomed), return_exceptions=True)

    def _settle_stopped(self, group: Group, reason: str) -> None:
        index = group[0].group_index
        if self.partial_rollout:
            self.data.add_to_buffer([group], self.steps_taken)
            self.tally.to_buffer.append(index)
        elif reason == "stale":
            self._settle_stale(group)
        else:
            self.tally.cut_short.append(index)

    def _settle_stale(self, group: Group) -> None:
        index = group[0].group_index
        if self.bounds.stale_groups == "regenerate":
            self.data.add_to_buffer([[s.fresh() for s in group]])
            self.tally.regenerated.append(index)
        else:
            self.tally.dropped_stale.append(index)

    def _fail(self, error: BaseException, what: str, groups_kept: bool = False) -> None:
        if self._error is None:
            self._error = error
            self._failed_at = what
            self._groups_kept = groups_kept
            self._give_up_in_flight()
        self._changed.set()

    def _give_up_in_flight(self) -> None:
        """The run fails at the trainer's next take: the groups still generating stop now,
        rather than go on sending requests to engines that the failing run shuts down (each
        request retried and logged). They stay the pipeline's, generated again after a
        resume, as the failed group is."""
        flights, self.in_flight = self.in_flight, []
        for flight in flights:
            self.failed.append(flight.group)
            flight.task.cancel()
            self._given_up.append(flight.task)

    def _raise_failure(self) -> None:
        if self._error is not None:
            error = self._error
            message = f"{self._failed_at}: {type(error).__name__}: {error}"
            raise PipelineError(message, self._groups_kept) from error
