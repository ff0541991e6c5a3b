"""Reward models: a class of the user's, built once per run, scoring batches of samples.

    recipe:
      rollout:
        reward:
          type: model
          model: my_pkg.rm.PreferenceModel     # cls(ctx); async __call__(samples) -> rewards
          model_settings: {path: /models/rm-7b, max_length: 4096}
          model_placement: actor               # driver (default) | actor
          model_batch_size: 64

`ctx` (RewardModelContext) carries the settings and the device the model may use: "cpu" in
the driver; in an actor, the device slot the plan gave it ("cuda" on GPU hardware, where Ray
has made its GPU the only one visible). Groups that finish around the same time are gathered
into one call of up to `model_batch_size` samples (a GPU model wants batches, not single
groups), and each group gets its own rewards back. It returns a number per sample, or a dict
per sample whose "score" is the reward and whose other keys are kept in the sample's
`reward_extra`, as a function of verl's shape's are (rlpost.rewards.scored).

With `model_placement: actor` the model lives in a Ray actor on a device slot of its own:
the plan takes that slot from the hardware (the last one), so training and the engines
never share it, and `mode=plan` shows it.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from rlpost.rewards.errors import RewardError
from rlpost.rewards.scored import Scored, read_scores
from rlpost.types import Sample


@dataclass(frozen=True)
class RewardModelContext:
    """What a reward model class is built with."""

    settings: Mapping[str, Any] = field(default_factory=dict)
    device: str = "cpu"


class RewardModel(Protocol):
    # a number per sample, or a dict per sample holding it as "score" (rlpost.rewards.scored)
    def __call__(self, samples: list[Sample]) -> Awaitable[list[float] | list[dict[str, Any]]]: ...


def build_reward_model(path: str, settings: Mapping[str, Any], device: str) -> Any:
    """The class at `path` built as cls(ctx) (validation has checked that it exists); a
    constructor that raises (weights not found, a device it cannot use) is a RewardError
    naming the class."""
    from rlpost.hooks import REWARD_MODEL, load_object

    cls = load_object(path, REWARD_MODEL)
    try:
        return cls(RewardModelContext(settings=dict(settings), device=device))
    except Exception as exc:
        raise RewardError(
            f"reward model '{path}' could not be built: {path.rpartition('.')[2]}(ctx) "
            f"raised {type(exc).__name__}: {exc} (its settings, "
            f"recipe.rollout.reward.model_settings: {dict(settings)!r}; device {device!r})"
        ) from exc


async def score(model: Any, samples: list[Sample], name: str) -> list[Scored]:
    """The model's rewards for `samples`, checked: one per sample, each a finite number or a
    dict holding it as "score" and other keys beside it (`Scored.extra`), all of one kind.
    What it returns beside the reward travels back from an actor in the `Scored`."""
    try:
        values = model(samples)
        if inspect.isawaitable(values):
            values = await values
    except Exception as exc:
        raise RewardError(f"reward model '{name}' raised {type(exc).__name__}: {exc}") from exc
    return read_scores(values, f"reward model '{name}'", samples)


Scorer = Callable[[list[Sample]], Awaitable[list[Scored]]]


class RewardBatcher:
    """Gathers the samples of groups that ask at about the same time into calls of at most
    `batch_size` samples; a call starts once `batch_size` samples wait, or `max_wait_s` after
    the first of them arrived. Each caller gets the rewards of its own samples back, and what
    the model returned beside each reward in that sample's `reward_extra`."""

    def __init__(self, scorer: Scorer, batch_size: int, max_wait_s: float = 0.02) -> None:
        self.scorer = scorer
        self.batch_size = batch_size
        self.max_wait_s = max_wait_s
        self._waiting: list[tuple[list[Sample], asyncio.Future[list[float]]]] = []
        self._flush: asyncio.TimerHandle | None = None
        self.calls = 0

    async def __call__(self, samples: list[Sample]) -> list[float]:
        future: asyncio.Future[list[float]] = asyncio.get_running_loop().create_future()
        self._waiting.append((list(samples), future))
        if sum(len(s) for s, _ in self._waiting) >= self.batch_size:
            self._start()
        elif self._flush is None:
            self._flush = asyncio.get_running_loop().call_later(self.max_wait_s, self._start)
        return await future

    def _start(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        waiting, self._waiting = self._waiting, []
        while waiting:  # calls of at most batch_size samples (a group is never split)
            batch: list[tuple[list[Sample], asyncio.Future[list[float]]]] = []
            size = 0
            while waiting and (not batch or size + len(waiting[0][0]) <= self.batch_size):
                batch.append(waiting.pop(0))
                size += len(batch[-1][0])
            asyncio.get_running_loop().create_task(self._run(batch))

    async def _run(self, batch: list[tuple[list[Sample], asyncio.Future[list[float]]]]) -> None:
        self.calls += 1
        samples = [s for group, _ in batch for s in group]
        try:
            rewards = await self.scorer(samples)
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        at = 0
        for group, future in batch:
            scored = rewards[at : at + len(group)]
            for sample, one in zip(group, scored, strict=True):
                sample.reward_extra = one.extra
            if not future.done():
                future.set_result([one.reward for one in scored])
            at += len(group)
