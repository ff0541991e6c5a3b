"""The rollout pipeline against a real CPU engine: ordering, accounting, the staleness bound
under a slow trainer and a slow engine, and generation interrupted by a weight update.

The consumer here plays the trainer's part in time only (it sleeps instead of training) and
updates the engine's weight version the way a weight push does: generation paused (requests
aborted with what they have), the version switched, generation continued.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rlpost.data.prompts import PromptRecord
from rlpost.data.source import DataSource
from rlpost.plan.loop import LoopPlan, most_buffered
from rlpost.runtime.pipeline import (
    Batch,
    FilterError,
    PipelineError,
    RolloutPipeline,
    load_group_filter,
)
from rlpost.runtime.rollout.client import EngineClient
from rlpost.runtime.rollout.context import GenerateContext
from rlpost.runtime.rollout.manager import GenerateHook, Group, GroupRunner, generate_sample
from rlpost.runtime.stop import StopRequested
from rlpost.types import Sample, SampleStatus

BATCH, PER_GROUP = 4, 2
HOOKS = Path(__file__).resolve().parents[2] / "hooks_fixtures"


def data_source(num_prompts: int = 64) -> DataSource:
    rng = random.Random(0)
    prompts = [
        PromptRecord(i + 1, f"p{i}", tuple(rng.randrange(40, 200) for _ in range(6)), None)
        for i in range(num_prompts)
    ]
    return DataSource.of_prompts(prompts, n_samples_per_prompt=PER_GROUP, shuffle=False, seed=0)


async def length_reward(samples: list[Sample]) -> list[float]:
    return [float(len(s.response_ids) % 3) for s in samples]


def bounds(mode: str, staleness: int, lookahead: int | None, buffered: int) -> LoopPlan:
    return LoopPlan(mode, 1, lookahead, staleness, buffered, BATCH, buffered, "regenerate", 0.0)


async def push(client: EngineClient, url: str, version: int) -> None:
    """What a weight push does to generation, without new weights."""
    await client.pause("abort", [url])
    await client.flush_cache([url])
    await client.post(url, "/update_weight_version", {"new_version": str(version)})
    await client.continue_generation([url])


@dataclass
class Trained:
    batches: list[Batch] = field(default_factory=list)
    outstanding: set[int] = field(default_factory=set)


async def drive(
    url: str,
    loop_plan: LoopPlan,
    steps: int,
    *,
    train_s: float,
    generate: GenerateHook = generate_sample,
) -> Trained:
    """Run the pipeline for `steps` train steps with a trainer that takes `train_s` each."""
    params = {"max_new_tokens": 24, "temperature": 1.0}
    data = data_source()
    trained = Trained()
    async with EngineClient(url, worker_urls=[url]) as client:
        await client.post(url, "/update_weight_version", {"new_version": "0"})
        runner = GroupRunner(client, length_reward, generate)
        pipeline = RolloutPipeline(runner, data, params, loop_plan, BATCH)
        pipeline.start()
        try:
            for step in range(steps):
                batch = await pipeline.take(step)
                trained.batches.append(batch)
                await asyncio.sleep(train_s)
                await push(client, url, step + 1)
                pipeline.weights_pushed(step + 1)
                pipeline.step_done(step)
            snapshot = pipeline.snapshot()
            waiting = [*snapshot.queued, *snapshot.generating, *data.buffer]
            trained.outstanding = {g[0].group_index for g in waiting}
        finally:
            await pipeline.close()
    return trained


def trained_indices(trained: Trained) -> list[int]:
    return [g[0].group_index for b in trained.batches for g in b.groups]


def check_accounting(trained: Trained) -> None:
    """No group trained twice, and every prompt drawn is trained, counted, or still waiting."""
    indices = trained_indices(trained)
    assert len(indices) == len(set(indices))
    settled = set(indices) | trained.outstanding
    for batch in trained.batches:
        tally = batch.tally
        settled |= {*tally.filtered, *tally.dropped_stale, *tally.cut_short}
        assert not set(tally.dropped_stale) & set(indices)
    assert set(range(max(indices) + 1)) <= settled


def check_versions(trained: Trained, max_staleness: int) -> None:
    for step, batch in enumerate(trained.batches):
        assert len(batch.groups) == BATCH
        assert max(batch.staleness) <= max_staleness, (step, batch.staleness)
        for group in batch.groups:
            for sample in group:
                versions = sample.token_versions
                assert versions == sorted(versions)  # a token never predates the one before
                assert len(versions) == len(sample.response_ids) == len(sample.rollout_logprobs)
                assert max(versions) <= step
                assert sample.reward is not None and sample.finished


def test_sync_trains_each_step_on_tokens_of_its_own_version(url: str) -> None:
    trained = asyncio.run(drive(url, bounds("sync", 0, 0, BATCH), 4, train_s=0.05))
    check_versions(trained, max_staleness=0)
    check_accounting(trained)
    for step, batch in enumerate(trained.batches):
        versions = {v for g in batch.groups for s in g for v in s.token_versions}
        assert versions == {step}
    assert trained_indices(trained) == list(range(4 * BATCH))  # in order, none skipped


def test_async_runs_one_step_ahead_at_most_one_version_old(url: str) -> None:
    trained = asyncio.run(drive(url, bounds("async", 1, 1, 2 * BATCH), 5, train_s=0.2))
    check_versions(trained, max_staleness=1)
    check_accounting(trained)
    assert max(max(b.staleness) for b in trained.batches[1:]) == 1  # it did run ahead


def test_a_filter_that_drops_groups_lets_a_whole_draw_pass_the_bound_by_what_the_plan_sizes(
    url: str,
) -> None:
    """Sync with over-sampling (draws of two batches) and a filter dropping every third group:
    a draw starts while fewer than a batch wait and starts whole, so the groups buffered pass
    the bound (one draw) and stay within the plan's most (rlpost.plan.loop.most_buffered)."""
    draw = 2 * BATCH
    plan = LoopPlan("sync", 1, 0, 0, draw, draw, 0, "regenerate", 0.0)
    most = most_buffered(draw, draw, BATCH, 0, whole_draws=False)
    counts: list[int] = []

    class Counted(RolloutPipeline):
        def _draw(self) -> None:
            super()._draw()
            counts.append(len(self.queue) + len(self.in_flight))

    async def scenario() -> None:
        params = {"max_new_tokens": 8, "temperature": 1.0}
        async with EngineClient(url, worker_urls=[url]) as client:
            await client.post(url, "/update_weight_version", {"new_version": "0"})
            runner = GroupRunner(client, length_reward, generate_sample)
            pipeline = Counted(
                runner, data_source(), params, plan, BATCH,
                group_filter=lambda group: group[0].group_index % 3 != 0,
            )  # fmt: skip
            pipeline.start()
            try:
                for step in range(3):
                    await asyncio.wait_for(pipeline.take(step), 60)
                    await push(client, url, step + 1)
                    pipeline.weights_pushed(step + 1)
                    pipeline.step_done(step)
            finally:
                await pipeline.close()

    asyncio.run(scenario())
    assert max(counts) > draw  # the bound alone would size the queue too small
    assert max(counts) <= most == BATCH - 1 + draw


async def equal_rewards(samples: list[Sample]) -> list[float]:
    return [0.0] * len(samples)  # a model that answers every prompt wrong


DRAW_LIMITS = {
    "sync": bounds("sync", 0, 0, BATCH),
    "async": bounds("async", 1, 1, 2 * BATCH),
    "fully_async": bounds("fully_async", 4, None, 2 * BATCH),
}


@pytest.mark.parametrize("mode", sorted(DRAW_LIMITS))
def test_a_filter_that_keeps_no_group_stops_the_run_at_max_draws_per_rollout(
    url: str, mode: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """DAPO's filter with rewards that are all equal drops every group: instead of drawing
    forever, the pipeline stops once max_draws_per_rollout draws' worth of groups finished
    without filling the batch (a line says so at half of it), naming the filter, the groups
    finished and kept, and the key; the groups still queued or generating stay the
    pipeline's, for the save before the run fails."""
    plan = dataclasses.replace(DRAW_LIMITS[mode], dynamic_sampling=True, max_draws_per_rollout=4)
    data = data_source()

    async def scenario() -> tuple[PipelineError, list[int]]:
        params = {"max_new_tokens": 4, "temperature": 1.0}
        async with EngineClient(url, worker_urls=[url]) as client:
            await client.post(url, "/update_weight_version", {"new_version": "0"})
            pipeline = RolloutPipeline(
                GroupRunner(client, equal_rewards), data, params, plan, BATCH,
                group_filter=load_group_filter("rlpost.filters.check_reward_nonzero_std"),
            )  # fmt: skip
            pipeline.start()
            try:
                with pytest.raises(PipelineError) as info:
                    await asyncio.wait_for(pipeline.take(0), 60)
                return info.value, pipeline.tally.filtered
            finally:
                await pipeline.close()

    error, filtered = asyncio.run(scenario())
    assert str(error) == (
        "dynamic sampling: DrawLimitError: rollout 0: 16 groups finished in "
        f"rollout.max_draws_per_rollout=4 draws of {BATCH} prompts, and the dynamic sampling "
        f"filter 'rlpost.filters.check_reward_nonzero_std' kept 0 of the {BATCH} its batch "
        "needs (16 dropped). Check what the filter drops (rlpost.filters."
        "check_reward_nonzero_std drops groups whose rewards are all equal: a model that "
        "answers every prompt wrong, or every one right, gets no signal from them: easier "
        "prompts, more samples per prompt, or a reward with partial credit), or raise "
        "rollout.max_draws_per_rollout (null: no limit)"
    )
    assert error.groups_kept
    # the groups generating when it failed may finish; no draw starts after it
    assert 16 <= len(filtered) < 16 + plan.max_buffered_groups + plan.draw_groups
    assert "rollout 0: 8 groups finished (2 draws of 4 prompts)" in capsys.readouterr().out


def test_a_filter_that_fills_each_rollout_within_the_limit_never_stops_the_run(
    url: str,
) -> None:
    """The limit counts one rollout's groups: a filter dropping a third of them fills each
    batch within 3 draws, over more rollouts than 3 draws' worth of groups in all."""
    plan = dataclasses.replace(
        bounds("sync", 0, 0, BATCH), dynamic_sampling=True, max_draws_per_rollout=3
    )

    async def scenario() -> list[Batch]:
        params = {"max_new_tokens": 4, "temperature": 1.0}
        async with EngineClient(url, worker_urls=[url]) as client:
            await client.post(url, "/update_weight_version", {"new_version": "0"})
            pipeline = RolloutPipeline(
                GroupRunner(client, length_reward), data_source(), params, plan, BATCH,
                group_filter=lambda group: group[0].group_index % 3 != 0,
            )  # fmt: skip
            pipeline.start()
            batches = []
            try:
                for step in range(4):
                    batches.append(await asyncio.wait_for(pipeline.take(step), 60))
                    await push(client, url, step + 1)
                    pipeline.weights_pushed(step + 1)
                    pipeline.step_done(step)
            finally:
                await pipeline.close()
            return batches

    batches = asyncio.run(scenario())
    assert sum(len(b.tally.filtered) for b in batches) + 4 * BATCH > 3 * BATCH


def test_a_slow_trainer_never_trains_groups_past_the_bound(url: str) -> None:
    # fully_async with room for three batches: a slow trainer leaves finished groups waiting,
    # and the producer holds back instead of generating groups that would be too old
    trained = asyncio.run(drive(url, bounds("fully_async", 1, None, 3 * BATCH), 5, train_s=0.6))
    check_versions(trained, max_staleness=1)
    check_accounting(trained)
    assert max(max(b.staleness) for b in trained.batches) == 1  # ahead by the whole bound
    assert not any(b.tally.dropped_stale or b.tally.regenerated for b in trained.batches)


def test_a_slow_engine_never_trains_groups_past_the_bound(url: str) -> None:
    # a third of the groups are slow to generate the first time: the others overtake them,
    # and those that could no longer be trained within the bound are stopped and generated
    # again
    first_time: set[int] = set()

    async def slow_for_some(sample: Sample, ctx: GenerateContext) -> Sample:
        if sample.group_index % 3 == 0 and sample.group_index not in first_time:
            first_time.add(sample.group_index)
            await asyncio.sleep(1.5)
        return await generate_sample(sample, ctx)

    plan = bounds("fully_async", 1, None, 3 * BATCH)
    trained = asyncio.run(drive(url, plan, 6, train_s=0.05, generate=slow_for_some))
    check_versions(trained, max_staleness=1)
    check_accounting(trained)
    regenerated = [i for b in trained.batches for i in b.tally.regenerated]
    assert regenerated, "no group outlived the bound"
    assert set(regenerated) <= set(trained_indices(trained)) | trained.outstanding


class CountingClient:
    """The engine client, counting the /generate calls a group makes."""

    def __init__(self, client: EngineClient) -> None:
        self.client, self.calls = client, 0

    async def generate(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return await self.client.generate(*args, **kwargs)

    async def generate_batch(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return await self.client.generate_batch(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


@pytest.mark.parametrize("together", [False, True], ids=["per_sample", "per_group"])
def test_an_interrupted_group_keeps_its_tokens_and_goes_on_under_the_new_version(
    url: str, together: bool
) -> None:
    async def scenario() -> tuple[Group, int]:
        async with EngineClient(url, worker_urls=[url]) as engine_client:
            await engine_client.post(url, "/update_weight_version", {"new_version": "0"})
            client = CountingClient(engine_client)
            runner = GroupRunner(client, length_reward, group_requests=together)
            prompt = [40, 41, 42]
            group = [
                Sample(group_index=0, index=i, prompt="p", prompt_ids=prompt) for i in range(32)
            ]
            params: dict[str, Any] = {"max_new_tokens": 240, "temperature": 1.0, "ignore_eos": True}
            task = asyncio.create_task(runner.run(group, params, runner.client_for(group)))
            async with asyncio.timeout(30):
                while await client.num_requests([url]) == 0:
                    assert not task.done(), task
                    await asyncio.sleep(0.005)
            await asyncio.sleep(0.05)  # some tokens under version 0
            await push(engine_client, url, 1)
            return await asyncio.wait_for(task, 60), client.calls

    group, calls = asyncio.run(scenario())
    # a request per sample, and one per interrupted sample; or the group's 32 in one
    # request, and those interrupted at the same length together again
    assert 32 < calls <= 64 if not together else 2 <= calls < 32
    interrupted = 0
    for sample in group:
        assert sample.status is SampleStatus.TRUNCATED and len(sample.response_ids) == 240
        assert len(sample.rollout_logprobs) == len(sample.loss_mask) == 240
        assert sample.token_versions == sorted(sample.token_versions)
        assert all(lp <= 0.0 for lp in sample.rollout_logprobs)
        interrupted += set(sample.token_versions) == {0, 1}
    assert interrupted > 0  # tokens from before the update were kept, the rest came after


def test_groups_whose_generation_failed_stay_in_a_checkpoint_taken_before_the_failure_surfaces(
    url: str,
) -> None:
    """One step ahead, the next step's groups fail (say the router died) while the trainer
    still trains the current step and saves: the save must keep them, to generate them again
    after a resume, or they would be lost."""

    taken = asyncio.Event()  # the next step's groups fail once the current step is taken

    async def failing_reward(samples: list[Sample]) -> list[float]:
        if samples[0].group_index >= BATCH:
            await taken.wait()
            raise RuntimeError("the sglang-router process exited")
        return await length_reward(samples)

    async def scenario() -> tuple[Batch, list[Group], list[Group]]:
        async with EngineClient(url, worker_urls=[url]) as client:
            await client.post(url, "/update_weight_version", {"new_version": "0"})
            params = {"max_new_tokens": 8, "temperature": 1.0}
            pipeline = RolloutPipeline(
                GroupRunner(client, failing_reward), data_source(), params,
                bounds("async", 1, 1, 2 * BATCH), BATCH,
            )  # fmt: skip
            pipeline.start()
            try:
                batch = await pipeline.take(0)
                taken.set()
                async with asyncio.timeout(60):  # the next step's groups fail meanwhile
                    while len(pipeline.failed) < BATCH:
                        await asyncio.sleep(0.01)
                saved = pipeline.snapshot()
                with pytest.raises(PipelineError, match="router process exited"):
                    await pipeline.take(1)
            finally:
                await pipeline.close()
        return batch, saved.queued, saved.generating

    batch, queued, generating = asyncio.run(scenario())
    assert sorted(g[0].group_index for g in batch.groups) == list(range(BATCH))
    assert not queued
    assert sorted(g[0].group_index for g in generating) == list(range(BATCH, 2 * BATCH))
    assert all(not s.response_ids and s.reward is None for g in generating for s in g)


def test_a_group_that_fails_stops_the_groups_in_flight_which_the_checkpoint_keeps(
    url: str,
) -> None:
    """One of the next step's groups fails while the others are still being generated (a
    slow tool): those stop at once instead of sending requests to engines the failing run
    is about to shut down, and the checkpoint saved before the failure surfaces keeps them
    all, to generate them again after a resume."""
    taken = asyncio.Event()
    stopped: set[int] = set()

    async def one_group_fails(sample: Sample, ctx: GenerateContext) -> Sample:
        if sample.group_index < BATCH:
            return await generate_sample(sample, ctx)
        if sample.group_index == BATCH:
            await taken.wait()
            raise RuntimeError("sandbox down")
        try:
            await generate_sample(sample, ctx)
            await asyncio.sleep(60)  # a slow tool
        except asyncio.CancelledError:
            stopped.add(sample.group_index)
            raise
        return sample

    async def scenario() -> tuple[list[Group], set[int]]:
        async with EngineClient(url, worker_urls=[url]) as client:
            await client.post(url, "/update_weight_version", {"new_version": "0"})
            params = {"max_new_tokens": 8, "temperature": 1.0}
            pipeline = RolloutPipeline(
                GroupRunner(client, length_reward, one_group_fails), data_source(), params,
                bounds("async", 1, 1, 2 * BATCH), BATCH,
            )  # fmt: skip
            pipeline.start()
            try:
                await pipeline.take(0)
                taken.set()
                async with asyncio.timeout(30):
                    while len(stopped) < BATCH - 1:
                        await asyncio.sleep(0.01)
                saved = pipeline.snapshot()
                with pytest.raises(PipelineError, match="sandbox down"):
                    await pipeline.take(1)
                return saved.generating, set(stopped)  # before close() stops anything
            finally:
                await pipeline.close()

    generating, stopped_before_close = asyncio.run(scenario())
    assert stopped_before_close == set(range(BATCH + 1, 2 * BATCH))
    assert sorted(g[0].group_index for g in generating) == list(range(BATCH, 2 * BATCH))
    assert all(not s.response_ids and s.reward is None for g in generating for s in g)


def rewarded(group_index: int, *rewards: float) -> Group:
    return [
        Sample(group_index=group_index, index=i, prompt="p", prompt_ids=[1], reward=r)
        for i, r in enumerate(rewards)
    ]


def test_a_filters_verdict_is_true_or_false_else_it_names_the_filter_and_the_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A filter that ends without a return (None) would drop every group it answers so,
    and the run would draw on forever with nothing to train."""
    monkeypatch.syspath_prepend(str(HOOKS))
    forgetful = load_group_filter("rlpost_test_hooks.keeps_without_a_return")
    assert forgetful(rewarded(0, 0.0, 1.0)) is True
    with pytest.raises(FilterError) as info:
        forgetful(rewarded(7, 1.0, 1.0))
    assert str(info.value) == (
        "dynamic sampling filter 'rlpost_test_hooks.keeps_without_a_return' returned None for "
        "group 7 (a function that ends without a return returns None); it returns True to "
        "keep the group, False to drop it"
    )
    numpy_bool = load_group_filter("rlpost_test_hooks.keeps_as_numpy")
    assert numpy_bool(rewarded(0, 0.0, 1.0)) is True
    assert numpy_bool(rewarded(1, 1.0, 1.0)) is False
    failing = load_group_filter("rlpost_test_hooks.filter_failing_from_group_4")
    with pytest.raises(FilterError, match="filter_failing_from_group_4' raised KeyError: 'acc' "
                       r"\(on group 5\)"):  # fmt: skip
        failing(rewarded(5, 1.0, 0.0))


def test_a_group_whose_filter_failed_stays_in_a_checkpoint_taken_before_the_failure_surfaces(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One step ahead, the filter raises on the next step's groups while the trainer trains
    the current step: the loop saves the finished rollouts before it fails, and that save
    must keep the groups the filter failed on, to generate them again after a resume."""
    monkeypatch.syspath_prepend(str(HOOKS))
    taken = asyncio.Event()

    async def reward_after_the_take(samples: list[Sample]) -> list[float]:
        if samples[0].group_index >= BATCH:
            await taken.wait()
        return await length_reward(samples)

    async def scenario() -> tuple[Batch, list[Group], list[Group], PipelineError]:
        async with EngineClient(url, worker_urls=[url]) as client:
            await client.post(url, "/update_weight_version", {"new_version": "0"})
            params = {"max_new_tokens": 8, "temperature": 1.0}
            pipeline = RolloutPipeline(
                GroupRunner(client, reward_after_the_take), data_source(), params,
                bounds("async", 1, 1, 2 * BATCH), BATCH,
                group_filter=load_group_filter("rlpost_test_hooks.filter_failing_from_group_4"),
            )  # fmt: skip
            pipeline.start()
            try:
                batch = await pipeline.take(0)
                taken.set()
                async with asyncio.timeout(60):
                    while not pipeline.failed:
                        await asyncio.sleep(0.01)
                saved = pipeline.snapshot()
                with pytest.raises(PipelineError, match="raised KeyError: 'acc'") as info:
                    await pipeline.take(1)
            finally:
                await pipeline.close()
        return batch, saved.queued, saved.generating, info.value

    batch, queued, generating, error = asyncio.run(scenario())
    assert sorted(g[0].group_index for g in batch.groups) == list(range(BATCH))
    assert error.groups_kept  # the loop saves the finished rollouts before it fails
    assert "filter_failing_from_group_4" in str(error)
    failed = [g[0].group_index for g in generating]
    assert failed and set(failed) <= set(range(BATCH, 2 * BATCH)) and not queued
    assert all(not s.response_ids and s.reward is None for g in generating for s in g)


def test_a_stop_while_the_trainer_waits_takes_nothing_and_the_snapshot_keeps_every_group(
    url: str,
) -> None:
    """SIGTERM while a take waits for generation (rlpost.runtime.stop): the take raises
    StopRequested without taking, and the checkpoint's snapshot holds every group drawn:
    those finished as queued, those still generating to generate again. A pipeline restored
    from it trains what an uninterrupted one would: the same groups, and nothing drawn on
    top of them (a fresh draw beside the restored groups would be cut short, its prompts
    lost)."""
    release = asyncio.Event()

    async def half_hang(sample: Sample, ctx: GenerateContext) -> Sample:
        if sample.group_index % 2:  # half the groups never finish before the stop
            await release.wait()
        return await generate_sample(sample, ctx)

    async def scenario() -> tuple[list[Group], list[Group], list[int], list[Batch]]:
        data = data_source()
        async with EngineClient(url, worker_urls=[url]) as client:
            await client.post(url, "/update_weight_version", {"new_version": "0"})
            params = {"max_new_tokens": 8, "temperature": 1.0}
            pipeline = RolloutPipeline(
                GroupRunner(client, length_reward, half_hang), data, params,
                bounds("sync", 0, 0, BATCH), BATCH,
            )  # fmt: skip
            pipeline.start()
            try:
                take = asyncio.ensure_future(pipeline.take(0))
                async with asyncio.timeout(60):  # the other half finishes
                    while len(pipeline.queue) < BATCH // 2:
                        await asyncio.sleep(0.01)
                assert not take.done()
                pipeline.stop_taking()
                async with asyncio.timeout(10):
                    with pytest.raises(StopRequested):
                        await take
                    with pytest.raises(StopRequested):  # and any take after it
                        await pipeline.take(0)
                saved = pipeline.snapshot()
                drawn = [g[0].group_index for g in [*pipeline.queue, *pipeline._generating()]]
            finally:
                release.set()
                await pipeline.close()
            # resumed: the data source stands where the save found it (past groups 0-3)
            resumed = RolloutPipeline(
                GroupRunner(client, length_reward), data, params,
                bounds("sync", 0, 0, BATCH), BATCH,
            )  # fmt: skip
            resumed.restore(pickle.loads(pickle.dumps(saved)))  # as a checkpoint keeps it
            resumed.start()
            batches = []
            try:
                async with asyncio.timeout(60):
                    for step in range(2):
                        batches.append(await resumed.take(step))
                        await push(client, url, step + 1)
                        resumed.weights_pushed(step + 1)
                        resumed.step_done(step)
            finally:
                await resumed.close()
        return saved.queued, saved.generating, drawn, batches

    queued, generating, drawn, batches = asyncio.run(scenario())
    assert sorted(drawn) == list(range(BATCH))
    assert sorted(g[0].group_index for g in queued) == [0, 2]
    assert all(s.response_ids and s.reward is not None for g in queued for s in g)
    assert sorted(g[0].group_index for g in generating) == [1, 3]
    assert all(not s.response_ids and s.reward is None for g in generating for s in g)
    for step, batch in enumerate(batches):
        indices = sorted(g[0].group_index for g in batch.groups)
        assert indices == list(range(step * BATCH, (step + 1) * BATCH)), (step, indices)
        assert batch.tally.cut_short == [] and batch.tally.dropped_stale == []
