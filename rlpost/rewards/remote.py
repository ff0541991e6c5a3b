"""A reward model behind HTTP: POST one sample as JSON, read back its reward.

The server answers a JSON number, or an object holding the reward as "reward" (else
"score") and anything else beside it: the object's other keys are the sample's
`reward_extra` (rlpost.rewards.scored), their numbers logged as rollout/reward_extra/<key>.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import TYPE_CHECKING, Any

from rlpost.rewards.errors import RemoteRewardError, RewardError
from rlpost.rewards.scored import Scored, as_reward, read_score, sample_name, shown

if TYPE_CHECKING:
    import aiohttp

    from rlpost.types import Sample

logger = logging.getLogger(__name__)

BACKOFF_BASE_S = 0.25
BACKOFF_MAX_S = 8.0
_RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
# where a server's JSON object holds the reward, the first found
REMOTE_KEYS = ("reward", "score")


def reward_payload(sample: Sample) -> dict[str, Any]:
    """The JSON body a reward server receives for one sample."""
    return {
        "prompt": sample.prompt,
        "response": sample.response_text,
        "label": sample.label,
        "metadata": sample.metadata,
    }


async def post_reward(
    session: aiohttp.ClientSession,
    url: str,
    sample: Sample,
    *,
    timeout_s: float,
    max_retries: int,
) -> Scored:
    """POST `sample` (`reward_payload`) to `url`; retry timeouts, connection errors, 429 and
    5xx. Other 4xx answers are not retried: the request itself is wrong.
    """
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    last_problem = ""
    payload = reward_payload(sample)
    for attempt in range(max_retries + 1):
        if attempt:
            delay_s = min(BACKOFF_BASE_S * 2 ** (attempt - 1), BACKOFF_MAX_S)
            await asyncio.sleep(delay_s * random.uniform(0.5, 1.0))
        try:
            async with session.post(url, json=payload, timeout=timeout) as response:
                if response.status in _RETRY_STATUSES:
                    last_problem = f"HTTP {response.status}"
                    continue
                if response.status >= 400:
                    body = (await response.text())[:300]
                    raise RemoteRewardError(
                        f"reward server {url} answered HTTP {response.status}: {body!r}"
                    )
                return parse_reward(await response.json(content_type=None), url, sample)
        except (aiohttp.ClientError, TimeoutError) as exc:
            last_problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        logger.info("reward server %s: %s (attempt %d)", url, last_problem, attempt + 1)
    raise RemoteRewardError(
        f"reward server {url} failed {max_retries + 1} attempts (timeout {timeout_s} s "
        f"each); last: {last_problem}. Check that it is up, or raise reward.max_retries / "
        "reward.timeout_s"
    )


def parse_reward(body: Any, url: str, sample: Sample) -> Scored:
    """The reward in a reward server's JSON answer for `sample` (a number, or an object
    holding it under REMOTE_KEYS, the rest kept), or RemoteRewardError naming what came."""
    who = f"reward server {url}"
    try:
        if isinstance(body, dict):
            return read_score(body, who, sample, REMOTE_KEYS)
        if isinstance(body, int | float):
            return Scored(as_reward(body, who, sample))
    except RewardError as exc:
        raise RemoteRewardError(str(exc)) from None
    raise RemoteRewardError(
        f"{who} returned {shown(body)} for {sample_name(sample)}; expected a finite number "
        'or {"reward": <number>, ...}'
    )
