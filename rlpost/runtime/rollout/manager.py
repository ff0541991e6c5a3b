"""One rollout: prompts in, rewarded groups of samples out, through the engine router.

The same code drives rlpost's CPU engines and SGLang servers: it only speaks HTTP to the
router (generation) and to each engine (abort).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rlpost.types import Sample, SampleStatus

Group = list[Sample]


class GenerateResult(Protocol):
    output_ids: list[int]
    text: str
    output_logprobs: list[float]
    finish_reason: str
    weight_version: str | None


class GenerationClient(Protocol):
    async def generate(self, input_ids: list[int], sampling_params: dict[str, Any]) -> Any: ...

    async def abort_all(self) -> None: ...


GroupSource = Callable[[int], list[Group]]
RewardFn = Callable[[list[Sample]], Awaitable[list[float]]]
GroupFilter = Callable[[list[Sample]], bool]
GenerateHook = Callable[[Sample, dict[str, Any], GenerationClient], Awaitable[Sample]]


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
        params: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "skip_special_tokens": self.skip_special_tokens,
            "no_stop_trim": True,
        }
        if self.stop:
            params["stop"] = list(self.stop)
        if self.stop_token_ids:
            params["stop_token_ids"] = list(self.stop_token_ids)
        return params


@dataclass
class RolloutResult:
    groups: list[Group]
    aborted: list[Group] = field(default_factory=list)
    num_filtered: int = 0
    wall_s: float = 0.0

    @property
    def samples(self) -> list[Sample]:
        return [s for g in self.groups for s in g]


async def generate_sample(
    sample: Sample, params: dict[str, Any], client: GenerationClient
) -> Sample:
    """Default generate function: one /generate call, continuing any partial response."""
    if sample.status in (SampleStatus.COMPLETED, SampleStatus.TRUNCATED):
        return sample
    budget = params["max_new_tokens"] - len(sample.response_ids)
    if budget <= 0:
        sample.status = SampleStatus.TRUNCATED
        return sample
    result = await client.generate(
        sample.prompt_ids + sample.response_ids, {**params, "max_new_tokens": budget}
    )
    sample.response_ids = sample.response_ids + list(result.output_ids)
    sample.rollout_logprobs = sample.rollout_logprobs + list(result.output_logprobs)
    sample.response_text = sample.response_text + result.text
    sample.weight_version = result.weight_version
    sample.status = {
        "stop": SampleStatus.COMPLETED,
        "length": SampleStatus.TRUNCATED,
        "abort": SampleStatus.ABORTED,
    }[result.finish_reason]
    return sample


class RolloutManager:
    """Generates rewarded groups, with optional dynamic sampling and partial rollout."""

    def __init__(
        self,
        client: GenerationClient,
        reward_fn: RewardFn,
        generate_fn: GenerateHook = generate_sample,
        group_filter: GroupFilter | None = None,
    ) -> None:
        self.client = client
        self.reward_fn = reward_fn
        self.generate_fn = generate_fn
        self.group_filter = group_filter

    async def _run_group(self, group: Group, params: dict[str, Any]) -> Group:
        await asyncio.gather(*(self.generate_fn(s, params, self.client) for s in group))
        if any(s.status is SampleStatus.ABORTED for s in group):
            return group
        rewards = await self.reward_fn(group)
        for sample, reward in zip(group, rewards, strict=True):
            sample.reward = float(reward)
        return group

    async def generate(
        self,
        source: GroupSource,
        num_groups: int,
        draw_size: int,
        sampling: SamplingSettings,
    ) -> RolloutResult:
        """Draw `draw_size` prompts at a time until `num_groups` groups pass the filter.

        Without a filter draw_size == num_groups and every group is kept. Groups still
        running once enough have passed are aborted and returned in `aborted` (the caller
        may keep them for the next rollout: partial rollout).
        """
        start = time.perf_counter()
        params = sampling.to_sglang()
        kept: list[Group] = []
        filtered = 0
        pending: set[asyncio.Task[Group]] = set()
        while len(kept) < num_groups:
            if not pending:
                pending = {
                    asyncio.create_task(self._run_group(g, params)) for g in source(draw_size)
                }
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                group = task.result()
                if len(kept) >= num_groups:
                    pending.add(task)  # finished late: treat like the aborted ones
                    continue
                if self.group_filter is None or self.group_filter(group):
                    kept.append(group)
                else:
                    filtered += 1
        aborted = await self._abort(pending)
        return RolloutResult(kept, aborted, filtered, time.perf_counter() - start)

    async def _abort(self, pending: set[asyncio.Task[Group]]) -> list[Group]:
        if not pending:
            return []
        await self.client.abort_all()
        groups = await asyncio.gather(*pending)
        return list(groups)
