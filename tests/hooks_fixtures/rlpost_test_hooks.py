"""User hooks for the reward and hook-loading tests, imported by dotted path.

tests/hooks_fixtures is put on sys.path by the tests' `hook_modules` fixture.
"""

from __future__ import annotations

import asyncio
import threading
import time

from rlpost.types import Sample

CALL_THREADS: list[str] = []


def length_reward(sample: Sample) -> float:
    """Plain function: runs in a worker thread."""
    CALL_THREADS.append(threading.current_thread().name)
    return float(len(sample.response_text))


async def async_contains_label(sample: Sample) -> float:
    await asyncio.sleep(0)
    return 1.0 if sample.label and sample.label in sample.response_text else 0.0


def rank_in_group(samples: list[Sample]) -> list[float]:
    """Group reward: 1 for the longest response of the group, 0 for the others."""
    longest = max(len(s.response_text) for s in samples)
    return [1.0 if len(s.response_text) == longest else 0.0 for s in samples]


def wrong_length_group(samples: list[Sample]) -> list[float]:
    return [1.0]


def sleepy_reward(sample: Sample) -> float:
    time.sleep(2.0)
    return 1.0


async def async_sleepy_reward(sample: Sample) -> float:
    await asyncio.sleep(30)
    return 1.0


def text_reward(sample: Sample) -> str:
    return "high"


def failing_reward(sample: Sample) -> float:
    raise KeyError("score")


def two_args(sample: Sample, extra: int) -> float:
    return 0.0


def keep_everything(rollout_id: int, buffer: list[list[Sample]], num_groups: int) -> list:
    """A buffer filter that forgets to remove what it returns."""
    return buffer[:num_groups]


NOT_A_FUNCTION = 3
