"""Generating and rewarding one group of samples through the engine router.

The same code drives rlpost's CPU engines and SGLang servers: it only speaks HTTP to the
router (generation) and to each engine (abort). A group's requests carry a rid prefix of its
own, so the group can be stopped alone; a weight update interrupts generation (the engines
abort their requests and hold new ones until the update is done) and the group simply goes
on generating under the new weights, each token recording the version that produced it.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from rlpost.runtime.rollout.client import EngineAbortError
from rlpost.runtime.rollout.context import ContextFactory, GenerateContext
from rlpost.runtime.rollout.episode import EPISODE, EpisodeClock, engine_request
from rlpost.types import Sample, SampleStatus

Group = list[Sample]
T = TypeVar("T")


class GenerateResult(Protocol):
    output_ids: list[int]
    text: str
    output_logprobs: list[float]
    finish_reason: str
    weight_version: str | None


class GenerationClient(Protocol):
    async def generate(
        self, input_ids: list[int], sampling_params: dict[str, Any], *, rid: str | None = None
    ) -> Any: ...

    async def generate_batch(
        self, input_ids: list[list[int]], sampling_params: dict[str, Any], *, rid: str | None = None
    ) -> list[Any]: ...

    async def abort_rid(self, rid_prefix: str) -> None: ...

    def abort_mark(self) -> int | None: ...

    def asked_abort_since(self, mark: int | None) -> bool: ...


RewardFn = Callable[[list[Sample]], Awaitable[list[float]]]
GroupFilter = Callable[[list[Sample]], bool]
GenerateHook = Callable[[Sample, GenerateContext], Awaitable[Sample]]


NEUTRAL_SAMPLING: dict[str, Any] = {
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
}
"""The sampling parameters every rollout request states at their neutral values."""


@dataclass(frozen=True)
class SamplingSettings:
    max_new_tokens: int
    temperature: float
    top_p: float = 1.0
    top_k: int = -1
    stop: Sequence[str] = ()
    stop_token_ids: Sequence[int] = ()
    skip_special_tokens: bool = False

    def to_sglang(self) -> dict[str, Any]:
        """The request's sampling parameters, every one that shapes the distribution stated
        (`NEUTRAL_SAMPLING` besides temperature, top_p and top_k): SGLang fills a parameter a
        request leaves out from the checkpoint's generation_config.json (its default
        `--sampling-defaults model`) or `--preferred-sampling-params`, and a repetition
        penalty or min_p from there would sample from a distribution the trainer's softmax
        does not compute."""
        params: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            **NEUTRAL_SAMPLING,
            "skip_special_tokens": self.skip_special_tokens,
            "no_stop_trim": True,
        }
        if self.stop:
            params["stop"] = list(self.stop)
        if self.stop_token_ids:
            params["stop_token_ids"] = list(self.stop_token_ids)
        return params


async def generate_sample(sample: Sample, ctx: GenerateContext) -> Sample:
    """Default generate function: one policy turn continuing the sample's response.

    An aborted call (a weight update, or the group being stopped) leaves the sample ABORTED
    with the tokens generated so far; calling again continues from there.
    """
    if not sample.finished:
        await ctx.policy_turn(sample)
    return sample


class GroupClient:
    """The engine client as one group sees it: its requests carry the group's rid prefix,
    so `stop()` aborts exactly them (on every engine) and they come back with what they
    generated so far. `interrupted` counts the answers that came back aborted because rlpost
    asked for it (a weight update's pause, the stop). An answer aborted while rlpost asked
    for no abort is the engine's own (a request it refused to serve): generating it again
    would meet the same abort, so it raises EngineAbortError."""

    _serial = itertools.count()

    def __init__(self, client: Any, key: str) -> None:
        self.client = client
        self.prefix = f"{key}-{next(self._serial)}-"
        self._count = itertools.count()
        self.stopping = False
        self.interrupted = 0

    async def generate(
        self, input_ids: list[int], sampling_params: dict[str, Any], *, rid: str | None = None
    ) -> Any:
        mark = self.client.abort_mark()
        with engine_request():
            result = await self.client.generate(input_ids, sampling_params, rid=self._rid(rid))
        self._sort_aborted([result], mark)
        return result

    async def generate_batch(
        self, input_ids: list[list[int]], sampling_params: dict[str, Any], *, rid: str | None = None
    ) -> list[Any]:
        mark = self.client.abort_mark()
        with engine_request():
            answers = await self.client.generate_batch(
                input_ids, sampling_params, rid=self._rid(rid)
            )
        results = list(answers)
        self._sort_aborted(results, mark)
        return results

    def _sort_aborted(self, results: list[Any], mark: int | None) -> None:
        aborted = [i for i, r in enumerate(results) if str(r.finish_reason) == "abort"]
        if not aborted:
            return
        if self.stopping or self.client.asked_abort_since(mark):
            self.interrupted += len(aborted)
            return
        raise EngineAbortError(
            [(i, getattr(results[i], "rid", None), results[i].abort_message) for i in aborted]
        )

    def _rid(self, rid: str | None) -> str:
        """The caller's rid, else the group's next (the engine adds `_i` per batch item)."""
        return rid if rid is not None else f"{self.prefix}{next(self._count)}"

    async def stop(self) -> None:
        self.stopping = True
        await self.client.abort_rid(self.prefix)

    def __getattr__(self, name: str) -> Any:  # everything else: the shared client
        return getattr(self.client, name)


class MalformedSampleError(RuntimeError):
    """A generate hook returned something the loop cannot train on."""


class EngineAbortedSampleError(RuntimeError):
    """An engine aborted a sample's request on its own (the cause is the EngineAbortError)."""


class GenerateError(RuntimeError):
    """A generate hook raised (the cause is chained, so a dead engine behind it is still a
    fault: rlpost.runtime.failures.is_fault)."""


class EpisodeTimeoutError(GenerateError):
    """A call of a generate function ran past recipe.rollout.episode_timeout_s of its own
    time (rlpost.runtime.rollout.episode)."""


def check_generated(
    sample: Any, original: Sample, hook_name: str, max_response_len: int | None = None
) -> Sample:
    """What a generate hook returned, checked: a Sample of the same prompt whose per-token
    lists are as long as its response, within the response budget, in a final status."""
    if not isinstance(sample, Sample):
        raise MalformedSampleError(
            f"generate function '{hook_name}' returned {type(sample).__name__}, not a Sample "
            f"(sample index {original.index})"
        )
    lengths = {
        name: len(getattr(sample, name))
        for name in ("rollout_logprobs", "loss_mask", "token_versions")
    }
    wrong = {name: n for name, n in lengths.items() if n != len(sample.response_ids)}
    if wrong:
        raise MalformedSampleError(
            f"generate function '{hook_name}' returned sample {sample.index} with "
            f"{len(sample.response_ids)} response tokens but {wrong}: every per-token list "
            "must be as long as response_ids (use Sample.append_policy_tokens / "
            "append_inserted_tokens)"
        )
    if sample.group_index != original.group_index or sample.prompt_ids != original.prompt_ids:
        raise MalformedSampleError(
            f"generate function '{hook_name}' returned a sample of another prompt (group "
            f"{sample.group_index}, for group {original.group_index}): return the sample it "
            "was given, or one built from it"
        )
    if max_response_len is not None and len(sample.response_ids) > max_response_len:
        raise MalformedSampleError(
            f"generate function '{hook_name}' returned sample {sample.index} with "
            f"{len(sample.response_ids)} response tokens, over max_response_len="
            f"{max_response_len}: every turn counts (ctx.policy_turn and "
            "ctx.environment_turn keep within it)"
        )
    if not isinstance(sample.status, SampleStatus):
        raise MalformedSampleError(
            f"generate function '{hook_name}' returned sample {sample.index} with status "
            f"{sample.status!r}: use a SampleStatus"
        )
    if sample.status is SampleStatus.PENDING:
        raise MalformedSampleError(
            f"generate function '{hook_name}' returned sample {sample.index} still pending: "
            "set its status to completed, truncated or aborted"
        )
    return sample


async def all_or_none(calls: Iterable[Awaitable[T]]) -> list[T]:
    """Every call's result; when one raises, the others are cancelled before its error goes
    on (asyncio.gather leaves them running: requests to a router the failing run is shutting
    down, retried and logged until the process ends)."""
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


class GroupRunner:
    """Generates every sample of a group (continuing across weight updates), then rewards
    the group. A stopped group comes back unrewarded, its samples ABORTED.

    With `group_requests` (the plan's `runtime.requests == "group"`; only for the default
    generate function), the group's samples go out together (`GenerateContext.policy_turns`)
    instead of one generate call each."""

    def __init__(
        self,
        client: Any,
        reward_fn: RewardFn,
        generate_fn: GenerateHook = generate_sample,
        hook_name: str = "rlpost.runtime.rollout.manager.generate_sample",
        contexts: ContextFactory | None = None,
        group_requests: bool = False,
        episode_timeout_s: float | None = None,
    ) -> None:
        if group_requests and generate_fn is not generate_sample:
            raise ValueError("group requests need the default generate function")
        self.episode_timeout_s = episode_timeout_s
        self.client = client
        self.reward_fn = reward_fn
        self.generate_fn = generate_fn
        self.hook_name = hook_name
        self.contexts = contexts or ContextFactory()
        self.group_requests = group_requests

    async def run(
        self,
        group: Group,
        params: dict[str, Any],
        gclient: GroupClient,
        reward_fn: RewardFn | None = None,
    ) -> Group:
        """The group generated, then rewarded by `reward_fn` (else the runner's)."""
        ctx = self.contexts.context(gclient, params)
        while True:
            pending = [i for i, s in enumerate(group) if not s.finished]
            interrupted = gclient.interrupted
            if self.group_requests:
                try:
                    await ctx.policy_turns([group[i] for i in pending])
                except EngineAbortError as exc:
                    raise self._engine_aborted(exc, group[pending[0]]) from exc
            else:
                for i in pending:
                    group[i].begin_generation()
                results = await all_or_none(self._generate(group[i], ctx) for i in pending)
                for i, result in zip(pending, results, strict=True):
                    group[i] = check_generated(
                        result, group[i], self.hook_name, ctx.max_response_len
                    )
            if gclient.stopping or all(s.finished for s in group):
                break
            if gclient.interrupted == interrupted:
                raise self._aborted_uninterrupted(group)
            # Aborted by a weight update: the rest is generated under the new weights.
        if gclient.stopping:
            return group
        rewards = await (reward_fn or self.reward_fn)(group)
        for sample, reward in zip(group, rewards, strict=True):
            sample.reward = float(reward)
        return group

    async def _generate(self, sample: Sample, ctx: GenerateContext) -> Any:
        """The generate function's answer for `sample`; a user's function that raises is
        named in the error, with the sample it was generating."""
        try:
            if self.generate_fn is generate_sample or self.episode_timeout_s is None:
                return await self.generate_fn(sample, ctx)
            return await self._timed(sample, ctx, self.episode_timeout_s)
        except EngineAbortError as exc:
            raise self._engine_aborted(exc, sample) from exc
        except EpisodeTimeoutError:
            raise
        except Exception as exc:
            if self.generate_fn is generate_sample:  # rlpost's own: its error says enough
                raise
            raise GenerateError(
                f"generate function '{self.hook_name}' raised {type(exc).__name__}: {exc} "
                f"(generating sample {sample.index} of group {sample.group_index})"
            ) from exc

    async def _timed(self, sample: Sample, ctx: GenerateContext, limit_s: float) -> Any:
        """The generate function's answer, or EpisodeTimeoutError once it ran `limit_s` of
        its own time (its engine requests not counted) without one; then it is cancelled."""
        clock = EpisodeClock()

        async def episode() -> Any:
            EPISODE.set(clock)  # in the episode's task, and the tasks it starts
            return await self.generate_fn(sample, ctx)

        task = asyncio.ensure_future(episode())
        try:
            while not task.done():
                # the clock stands still while a request is out: look again, not at once
                await asyncio.wait({task}, timeout=max(limit_s - clock.own_s(), 0.1))
                if not task.done() and clock.own_s() >= limit_s:
                    raise EpisodeTimeoutError(
                        f"generate function '{self.hook_name}' ran {limit_s:g} s of its own "
                        f"time on sample {sample.index} of group {sample.group_index} without "
                        f"returning (recipe.rollout.episode_timeout_s={limit_s:g}; its requests "
                        "to the engines are not counted): a tool or environment it awaits "
                        "seems to hang. Give that call a timeout of its own, or raise "
                        "recipe.rollout.episode_timeout_s (null: no limit) if its episodes "
                        "need longer"
                    )
            return task.result()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    def _engine_aborted(self, exc: EngineAbortError, sample: Sample) -> EngineAbortedSampleError:
        """The run stops naming the engine's message, the sample(s) and the group: an abort
        rlpost did not ask for is the engine refusing the request, which it would refuse
        again each time the loop sent it, without end."""
        samples = exc.samples if exc.samples is not None else [sample.index]
        rids = [rid for _, rid, _ in exc.aborted]
        return EngineAbortedSampleError(
            f"an engine aborted sample(s) {samples} of group {sample.group_index} on its own: "
            f"{exc.engine_message!r} (request(s) {rids}). rlpost asked no engine to abort "
            "anything while it ran (no weight update, no stop), so the engine refused the "
            "request, and would refuse it again each time it were sent. The engine's log says "
            "why; a request over an engine's limits needs a shorter prompt or response "
            "(recipe.data.max_prompt_len, recipe.rollout.max_response_len) or the engine's "
            "limit raised; an abort sent to the engine by something other than rlpost stops "
            "the run the same way"
        )

    def _aborted_uninterrupted(self, group: Group) -> MalformedSampleError:
        """A sample came back ABORTED though no request of its group was: the generate
        function says "aborted" on its own, and calling it again would go on forever."""
        aborted = [s.index for s in group if s.status is SampleStatus.ABORTED]
        return MalformedSampleError(
            f"generate function '{self.hook_name}' returned sample(s) {aborted} aborted, and "
            "no request of the group came back aborted (no weight update or stop "
            "interrupted it): ABORTED means an interrupted episode that the loop continues "
            "by calling the function again, so it would be called forever. Return the "
            "sample completed or truncated; to leave it out of training, mark it (in "
            "sample.metadata) and drop its group with rollout.dynamic_sampling_filter"
        )

    def client_for(self, group: Group) -> GroupClient:
        return GroupClient(self.client, f"g{group[0].group_index}")
