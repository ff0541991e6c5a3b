"""What a scorer returns, read: a reward, and what came beside it.

Every scorer that returns one value per sample (a function of verl's shape, a group
function, a reward model, a reward server) may return a number, or a dict that holds the
reward under the key its kind documents ("score"; a reward server's "reward" or "score") and
anything else beside it: the dict's other keys are the sample's `reward_extra`, which the
rollout's metrics average (`rollout/reward_extra/<key>`, `eval/<set>/reward_extra/<key>`)
and `run.dump_rollouts` writes. A scorer that returns a list returns one kind for all of
it: a number for every sample, or a dict for every one.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlpost.rewards.errors import RewardError
from rlpost.types import Sample

# the key that holds the reward in a dict, as verl's compute_score returns it
SCORE_KEYS = ("score",)


@dataclass(frozen=True)
class Scored:
    """A sample's reward and what its scorer returned beside it (None where it came alone),
    as `reward_extra` holds it. Crosses from a reward model's actor to the driver."""

    reward: float
    extra: dict[str, Any] | None = None


def read_score(value: Any, who: str, sample: Sample, keys: tuple[str, ...] = SCORE_KEYS) -> Scored:
    """The reward in what `who` returned for `sample`: a number, or a dict holding it under
    the first of `keys` it has, whose other keys are kept (`reward_extra`)."""
    if not isinstance(value, Mapping):
        return Scored(as_reward(value, who, sample))
    key = next((k for k in keys if k in value), None)
    if key is None:
        raise RewardError(
            f"{who} returned a dict without {_either(keys)} for {sample_name(sample)}: "
            f"{shown(value)}; a dict holds the reward as {_either(keys)} and other numbers "
            "beside it, logged as rollout/reward_extra/<key>: return "
            f"{{{keys[0]!r}: <number>, ...}}, or the reward alone as a number"
        )
    if not _is_number(value[key]):
        raise RewardError(
            f"{who} returned {shown(value)} for {sample_name(sample)}: its {key!r} "
            f"({value[key]!r}) is not a number; the reward under {key!r} is a finite number"
        )
    return Scored(as_reward(value[key], who, sample), reward_extra(value, key) or None)


def read_scores(
    values: Any, who: str, samples: Sequence[Sample], keys: tuple[str, ...] = SCORE_KEYS
) -> list[Scored]:
    """One `Scored` per sample from the list `who` returned for `samples` (a group, or a
    reward model's batch): a number for every sample, or a dict for every one."""
    n = len(samples)
    if not isinstance(values, Sequence) or isinstance(values, str | bytes):
        raise RewardError(
            f"{who} returned {type(values).__name__} {shown(values)} for {n} samples (the "
            f"first is {sample_name(samples[0])}); it returns a list of {n}, in the samples' "
            f"order: a number per sample, or a dict per sample holding the reward as "
            f"{_either(keys)[2:]}"
        )
    if len(values) != n:
        raise RewardError(
            f"{who} returned {len(values)} rewards for {n} samples ({shown(values)}; the "
            f"first is {sample_name(samples[0])}); it returns one reward per sample, "
            "in the samples' order"
        )
    dicts = [isinstance(v, Mapping) for v in values]
    if any(dicts) and not all(dicts):
        number = samples[dicts.index(False)]
        as_dict = samples[dicts.index(True)]
        raise RewardError(
            f"{who} returned numbers for some samples and dicts for others ({shown(values)}: "
            f"a number for {sample_name(number)}, a dict for {sample_name(as_dict)}); "
            f"return a dict with {_either(keys)} for every sample, or a number for every one"
        )
    return [read_score(v, who, s, keys) for v, s in zip(values, samples, strict=True)]


def reward_extra(value: Any, key: str = "score") -> dict[str, Any]:
    """What a dict returned holds beside its reward (under `key`), by key (as text), each
    value as JSON can hold it and the same for the same value: a number as Python's (bool,
    int or float; one that is not finite as None), a string, a JSON value (a list of
    numbers), anything else as its str(). Nothing for a number."""
    if not isinstance(value, Mapping):
        return {}
    return {str(k): _extra_value(v) for k, v in value.items() if k != key}


def _extra_value(value: Any) -> Any:
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        # a NumPy or torch scalar; an array of more than one value is written as its str()
        with contextlib.suppress(Exception):
            value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            float(value)
        except OverflowError:  # no float holds it: not averaged
            return str(value)
    if value is None or isinstance(value, bool | int | str):
        return value
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return str(value)
    return value


def as_reward(value: Any, who: str, sample: Sample | None = None) -> float:
    """`value` as a reward: a finite number, else RewardError naming `who` and the sample."""
    where = f" for {sample_name(sample)}" if sample is not None else ""
    if not _is_number(value):
        raise RewardError(f"{who} returned {shown(value)}; expected a number{where}")
    try:
        reward = float(value)
    except (TypeError, ValueError) as exc:  # an array or tensor of more than one value
        raise RewardError(
            f"{who} returned {type(value).__name__} {shown(value)}{where}, which is not one "
            f"number ({exc}); return one number per sample (a tensor's .item())"
        ) from None
    if not math.isfinite(reward):
        raise RewardError(f"{who} returned {reward}{where}; rewards must be finite")
    return reward


def _is_number(value: Any) -> bool:
    return not isinstance(value, str | bytes) and hasattr(value, "__float__")


def sample_name(sample: Sample) -> str:
    return f"sample group_index={sample.group_index}, index={sample.index}"


def shown(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _either(keys: tuple[str, ...]) -> str:
    return "a " + " or ".join(repr(k) for k in keys)
