"""The reward hub: a reward for every sample, by registered type, custom or group function.

Which function scores a sample, first match wins (slime's order: its --custom-rm-path runs
before any --rm-type, a line's or the run's):
1. `reward.group` set: `reward.custom_function(samples) -> list`, called once per group
   (samples sharing a group_index): a number per sample, or a dict per sample whose "score"
   is the reward, as verl's; per-sample types are not consulted.
2. `reward.custom_function(sample) -> float`, for every sample (it may read
   `sample.metadata["rm_type"]` itself); or a function of verl's shape,
   `compute_score(data_source, solution_str, ground_truth, extra_info=None)`, recognised by
   those parameter names and called by keyword (`verl_arguments`): it returns a number or a
   dict whose "score" is the reward.
3. `sample.metadata["rm_type"]`: a registered type, for datasets that mix tasks.
4. `reward.type`: a registered type.
An evaluation set scored otherwise than training is gets a config of its own
(rlpost.runtime.evaluation): with the evaluation's custom function (the set's
custom_reward_function, else recipe.eval's; slime's per-set custom_rm_path, which scores
before any rm_type there too), else with the set's reward_type and no custom function, so
that type grades its every line.

A dict's other keys (a function of verl's shape's, a group function's, a reward server's;
a reward model's, rlpost.rewards.model) are kept in `sample.reward_extra`, which the
rollout's metrics average and `run.dump_rollouts` writes (rlpost.rewards.scored).

A `boxed_` type (slime's `boxed_f1`, `boxed_gpqa`) grades only the last `\\boxed{}` answer of
the response with the grader it names, and pays that grader's floor where there is none.
`random` (slime's) pays 0 or 1 at even odds; given a seed (`run.deterministic`), each sample's
draw is fixed by the seed and the sample, so a resumed run scores as an uninterrupted one.

Rule-based types grade in worker processes under `reward.timeout_s`; a grader that runs
past it scores as a wrong answer. Custom functions, plain or async, get the same limit.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import logging
import random
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlpost.errors import did_you_mean
from rlpost.hooks import (
    GROUP_REWARD_FUNCTION,
    REWARD_FUNCTION,
    VERL_COMPUTE_SCORE,
    HookError,
    HookSignature,
    is_async_hook,
    load_hook,
)
from rlpost.rewards.answers import choice_label, last_boxed
from rlpost.rewards.errors import RewardError
from rlpost.rewards.pool import grading_pool
from rlpost.rewards.remote import post_reward
from rlpost.rewards.scored import Scored, as_reward, read_score, read_scores, sample_name
from rlpost.types import Sample

if TYPE_CHECKING:
    import aiohttp

    from rlpost.schema.reward import RewardConfig

logger = logging.getLogger(__name__)

RewardFn = Callable[[Sample, "RewardContext"], Awaitable[float]]
REWARD_TYPES: dict[str, RewardFn] = {}


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Register `async def fn(sample, ctx) -> float` as reward type `name`."""

    def register(fn: RewardFn) -> RewardFn:
        if name in REWARD_TYPES:
            raise ValueError(f"reward type '{name}' is already registered")
        REWARD_TYPES[name] = fn
        return fn

    return register


@dataclass
class RewardContext:
    """What reward functions share during one `compute_rewards` call."""

    config: RewardConfig
    # the run's seed where draws must repeat (run.deterministic); None draws afresh
    seed: int | None = None
    _session: aiohttp.ClientSession | None = None

    async def http_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            import aiohttp

            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def compute_rewards(
    samples: Sequence[Sample], config: RewardConfig, seed: int | None = None
) -> list[float]:
    """One reward per sample, in order. Does not write `sample.reward`; writes
    `sample.reward_extra`: what a dict returned beside the reward, None where a number came
    (rlpost.rewards.scored). `seed` (the run's,
    in deterministic mode) fixes what a random reward draws for each sample."""
    if config.group:
        return await _group_rewards(samples, config)
    ctx = RewardContext(config, seed)
    try:
        return list(await asyncio.gather(*(_sample_reward(s, ctx) for s in samples)))
    finally:
        await ctx.close()


async def _sample_reward(sample: Sample, ctx: RewardContext) -> float:
    if ctx.config.custom_function:
        return await _custom_reward(sample, ctx, ctx.config.custom_function)
    rm_type = sample.metadata.get("rm_type") if isinstance(sample.metadata, dict) else None
    if rm_type:
        return await _typed_reward(str(rm_type), sample, ctx, source="metadata['rm_type']")
    return await _typed_reward(ctx.config.type, sample, ctx, source="reward.type")


async def _custom_reward(sample: Sample, ctx: RewardContext, path: str) -> float:
    """The number `path`'s fn(sample) returns; or, for a function of verl's shape, the number
    or the dict's "score" it returns, the dict's other keys kept in `sample.reward_extra`."""
    hook = _load_cached(path, REWARD_FUNCTION)
    timeout_s = ctx.config.timeout_s
    if VERL_COMPUTE_SCORE.fits(hook):
        keywords = VERL_COMPUTE_SCORE.arguments(hook, verl_arguments(sample))
        value = await _call_hook(hook, sample, timeout_s, path, keywords)
        scored = Scored(0.0) if value is _TIMED_OUT else read_score(value, _who(path), sample)
        sample.reward_extra = scored.extra
        return scored.reward
    value = await _call_hook(hook, sample, timeout_s, path)
    if isinstance(value, dict):
        raise RewardError(
            f"reward function '{path}' returned a dict ({sorted(map(str, value))}); a "
            "function fn(sample) returns its reward as a number. One of verl's shape, "
            f"{VERL_COMPUTE_SCORE.describe()}, may return a dict: its 'score' is the "
            "reward and its other numbers are logged (rollout/reward_extra/<key>)"
        )
    return 0.0 if value is _TIMED_OUT else as_reward(value, _who(path), sample)


def _who(path: str) -> str:
    return f"reward function '{path}'"


async def _typed_reward(name: str, sample: Sample, ctx: RewardContext, source: str) -> float:
    fn = REWARD_TYPES.get(name)
    if fn is None:
        raise RewardError(
            f"unknown reward type {name!r} from {source} (sample group_index="
            f"{sample.group_index}, index={sample.index}).{did_you_mean(name, REWARD_TYPES)} "
            f"Known types: {sorted(REWARD_TYPES)}"
        )
    value = await fn(sample, ctx)
    if isinstance(value, Mapping):
        raise RewardError(
            f"reward type {name!r} returned a dict ({sorted(map(str, value))}) for "
            f"{sample_name(sample)}; a registered type returns its reward as a number "
            "(async def fn(sample, ctx) -> float) and carries nothing beside it. To log more "
            f"beside a reward, score with a custom function of verl's shape, "
            f"{VERL_COMPUTE_SCORE.describe()}, whose dict's 'score' is the reward"
        )
    return as_reward(value, f"reward type {name!r}", sample)


async def _group_rewards(samples: Sequence[Sample], config: RewardConfig) -> list[float]:
    path = config.custom_function
    if not path:
        raise RewardError("reward.group is set but reward.custom_function is not")
    hook = _load_cached(path, GROUP_REWARD_FUNCTION)
    groups: dict[int, list[int]] = {}
    for position, sample in enumerate(samples):
        groups.setdefault(sample.group_index, []).append(position)

    async def score(positions: list[int]) -> list[float]:
        group = [samples[p] for p in positions]
        values = await _call_hook(hook, group, config.timeout_s, path)
        if values is _TIMED_OUT:
            scored = [Scored(0.0)] * len(group)
        else:
            scored = read_scores(values, f"group reward function '{path}'", group)
        for sample, one in zip(group, scored, strict=True):
            sample.reward_extra = one.extra
        return [one.reward for one in scored]

    rewards = [0.0] * len(samples)
    scored = await asyncio.gather(*(score(positions) for positions in groups.values()))
    for positions, values in zip(groups.values(), scored, strict=True):
        for position, value in zip(positions, values, strict=True):
            rewards[position] = value
    return rewards


_TIMED_OUT: Any = object()
_HOOK_CACHE: dict[tuple[str, HookSignature], Callable[..., Any]] = {}
_HOOK_THREADS: ThreadPoolExecutor | None = None
_LOCK = threading.Lock()


def _load_cached(path: str, signature: HookSignature) -> Callable[..., Any]:
    key = (path, signature)
    if key not in _HOOK_CACHE:
        try:
            _HOOK_CACHE[key] = load_hook(path, signature)
        except HookError as exc:
            raise RewardError(str(exc)) from None
    return _HOOK_CACHE[key]


async def _call_hook(
    hook: Callable[..., Any],
    arg: Any,
    timeout_s: float,
    path: str,
    keywords: dict[str, Any] | None = None,
) -> Any:
    """`hook(arg)`, or `hook(**keywords)` where given, under `timeout_s`: awaited when async,
    in a thread when plain."""
    global _HOOK_THREADS
    call = (
        functools.partial(hook, **keywords)
        if keywords is not None
        else functools.partial(hook, arg)
    )
    if is_async_hook(hook):
        pending: Awaitable[Any] = call()
    else:
        with _LOCK:
            if _HOOK_THREADS is None:
                _HOOK_THREADS = ThreadPoolExecutor(16, thread_name_prefix="rlpost-reward")
        pending = asyncio.get_running_loop().run_in_executor(_HOOK_THREADS, call)
    try:
        value = await asyncio.wait_for(pending, timeout_s)
        if inspect.isawaitable(value):  # a plain function that returned a coroutine
            value = await asyncio.wait_for(value, timeout_s)
        return value
    except TimeoutError:
        logger.warning("reward function %s ran past %.1f s; scoring 0", path, timeout_s)
        return _TIMED_OUT
    except Exception as exc:
        raise RewardError(
            f"reward function '{path}' raised {type(exc).__name__}: {exc} (scoring {_scored(arg)})"
        ) from exc


def _scored(arg: Any) -> str:
    """The sample, or the group, a hook was called for, for messages."""
    if isinstance(arg, Sample):
        return sample_name(arg)
    if isinstance(arg, list) and arg and isinstance(arg[0], Sample):
        return f"the group of {len(arg)} samples of group_index={arg[0].group_index}"
    return "a sample"


def verl_arguments(sample: Sample) -> dict[str, Any]:
    """What a reward function of verl's shape is called with for `sample`, as verl's reward
    managers call it: the data set's name (the row's data_source column, kept in the
    metadata; None where there is none), the response's text alone (no prompt, no ending
    special token: verl decodes it with skip_special_tokens), the label, and a copy of the
    metadata (verl's extra_info column: data.metadata_key=extra_info reads it there)."""
    metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
    return {
        "data_source": metadata.get("data_source"),
        "solution_str": sample.answer_text,
        "ground_truth": sample.label,
        "extra_info": dict(metadata),
    }


def _label_of(sample: Sample, reward_type: str) -> str:
    if sample.label is None:
        raise RewardError(
            f"reward type '{reward_type}' compares responses with a label, and sample "
            f"group_index={sample.group_index} has none: set data.label_key to the field "
            "holding the answer"
        )
    return str(sample.label)


async def _grade(
    grader: str,
    failed: float,
    sample: Sample,
    ctx: RewardContext,
    label: str | None = None,
    *,
    boxed: str = "",
) -> float:
    """`grader` on the response, against the label; for reward type `boxed`, on its last
    `\\boxed{}` answer alone, and `failed` where it has none."""
    label = _label_of(sample, boxed or grader) if label is None else label
    response = last_boxed(sample.answer_text) if boxed else sample.answer_text
    if response is None:
        return failed
    pool = grading_pool()
    value = await pool.run(grader, response, label, timeout_s=ctx.config.timeout_s)
    return failed if value is None else value


@register_reward("math")
async def math_reward(sample: Sample, ctx: RewardContext) -> float:
    """1 when the last `\\boxed{}` answer equals the label (math_verify), else 0."""
    return await _grade("math", 0.0, sample, ctx)


@register_reward("deepscaler")
async def deepscaler_reward(sample: Sample, ctx: RewardContext) -> float:
    """The math reward of the text after `</think>`; 0 without `</think>`."""
    return await _grade("deepscaler", 0.0, sample, ctx)


@register_reward("dapo")
async def dapo_reward(sample: Sample, ctx: RewardContext) -> float:
    """+1 when the answer after the last `Answer:` equals the label, else -1."""
    return await _grade("dapo", -1.0, sample, ctx)


@register_reward("f1")
async def f1_reward(sample: Sample, ctx: RewardContext) -> float:
    """Token F1 between response and label."""
    return await _grade("f1", 0.0, sample, ctx)


@register_reward("gpqa")
async def choice_reward(sample: Sample, ctx: RewardContext) -> float:
    """Multiple choice (GPQA, MMLU-style): 1 when the option the response settles on is the
    labelled one (rlpost.rewards.answers.chosen_letter), else 0."""
    return await _grade("gpqa", 0.0, sample, ctx, _choice_label(sample, "gpqa"))


@register_reward("boxed_f1")
async def boxed_f1_reward(sample: Sample, ctx: RewardContext) -> float:
    """Token F1 between the last `\\boxed{}` answer and the label; 0 without a box."""
    return await _grade("f1", 0.0, sample, ctx, boxed="boxed_f1")


@register_reward("boxed_gpqa")
async def boxed_choice_reward(sample: Sample, ctx: RewardContext) -> float:
    """1 when the last `\\boxed{}` answer settles on the labelled option, else 0 (0 without
    a box): the choice is read from the box alone, not from the reasoning before it."""
    label = _choice_label(sample, "boxed_gpqa")
    return await _grade("boxed_gpqa", 0.0, sample, ctx, label, boxed="boxed_gpqa")


def _choice_label(sample: Sample, reward_type: str) -> str:
    metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
    try:
        return choice_label(_label_of(sample, reward_type), metadata)
    except ValueError as exc:
        raise RewardError(f"sample group_index={sample.group_index}: {exc}") from None


@register_reward("random")
async def random_reward(sample: Sample, ctx: RewardContext) -> float:
    """0 or 1 at even odds, reading nothing of the response (slime's random). With a seed,
    drawn from it and the sample (`sample_coin`), else afresh."""
    if ctx.seed is None:
        return float(random.randint(0, 1))
    return float(sample_coin(ctx.seed, sample))


def sample_coin(seed: int, sample: Sample) -> int:
    """0 or 1, fixed by the seed and the sample: its group and index (unique over a run's
    training samples), its prompt and its response. A resumed deterministic run regenerates
    the same responses, so it draws the same; independent of Python's hash randomisation."""
    key = hashlib.blake2b(digest_size=8)
    key.update(f"{seed}/reward/{sample.group_index}/{sample.index}/".encode())
    key.update(",".join(map(str, sample.prompt_ids)).encode())
    key.update(b"/")
    key.update(",".join(map(str, sample.response_ids)).encode())
    return key.digest()[0] & 1


@register_reward("remote")
async def remote_reward(sample: Sample, ctx: RewardContext) -> float:
    """What the reward server at `reward.remote_url` answers for this sample."""
    url = ctx.config.remote_url
    if not url:
        raise RewardError("reward type 'remote' needs reward.remote_url")
    scored = await post_reward(
        await ctx.http_session(),
        url,
        sample,
        timeout_s=ctx.config.timeout_s,
        max_retries=ctx.config.max_retries,
    )
    sample.reward_extra = scored.extra
    return scored.reward
