"""A tool behind HTTP (a search engine, a code sandbox, a retrieval service), in the style of
search-r1: the model writes a call between two tags, the environment service answers, the
answer comes back as a tool turn (never trained), for up to `max_turns` policy turns.

    recipe:
      rollout:
        generate_function: rlpost.envs.http_tool.generate
        max_turns: 4
        generate_settings:
          url: http://search.internal:8000/query   # required
          open_tag: <search>                        # default
          close_tag: </search>                      # default
          timeout_s: 10                             # per attempt
          max_retries: 3                            # attempts after the first
          backoff_s: 0.5                            # doubled each retry, capped at 8 s
          top_k: 3                                  # anything else goes along in the request

The service gets `POST url` with JSON `{"query": <the call's text>, "sample_index": ...,
"turn": ..., "evaluation": ..., **extra settings}` and answers `{"result": "<text>"}`. A
connection error, a timeout, or an HTTP 5xx/408/429 answer is retried with backoff; a 4xx
answer is not. A call that fails for good is answered with an error text the model can read
(the episode goes on; a warning is logged), so a flaky service costs a sample's quality,
never the run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlpost.envs.calculator import run_tool_loop
from rlpost.types import Sample

if TYPE_CHECKING:
    from rlpost.runtime.rollout.context import GenerateContext

logger = logging.getLogger(__name__)

KNOWN = ("url", "open_tag", "close_tag", "timeout_s", "max_retries", "backoff_s")
MAX_BACKOFF_S = 8.0


@dataclass(frozen=True)
class ToolService:
    """The service's address and how to call it, from `recipe.rollout.generate_settings`."""

    url: str
    open_tag: str = "<search>"
    close_tag: str = "</search>"
    timeout_s: float = 10.0
    max_retries: int = 3
    backoff_s: float = 0.5
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> ToolService:
        problems = check_settings(settings)
        if problems:
            raise ValueError("; ".join(f"{key}: {message}" for key, message, _ in problems))
        known = {k: settings[k] for k in KNOWN if k in settings}
        extra = {k: v for k, v in settings.items() if k not in KNOWN}
        return cls(**known, extra=extra)


def check_settings(settings: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(setting, problem, fix) for every problem; config validation calls this before
    anything starts (a generate function's optional `check_settings`)."""
    problems = []
    url = settings.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        problems.append(
            (
                "url",
                f"{url!r} is not an http(s) URL: the tool service must be named",
                "set generate_settings.url: http://host:port/path",
            )
        )
    for key in ("timeout_s", "backoff_s"):
        value = settings.get(key, 1.0)
        if not isinstance(value, int | float) or value <= 0:
            problems.append((key, f"{value!r} must be a positive number of seconds", "e.g. 10"))
    retries = settings.get("max_retries", 0)
    if not isinstance(retries, int) or retries < 0:
        problems.append(("max_retries", f"{retries!r} must be an integer >= 0", "e.g. 3"))
    for key in ("open_tag", "close_tag"):
        if key in settings and (not isinstance(settings[key], str) or not settings[key]):
            problems.append((key, f"{settings[key]!r} must be a non-empty string", "e.g. <search>"))
    return problems


def _retryable(status: int) -> bool:
    return status >= 500 or status in (408, 429)


async def call_service(service: ToolService, payload: Mapping[str, Any]) -> str:
    """The service's `result` for `payload`, retried on transient failures; an error text
    when it fails for good."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=service.timeout_s)
    last = ""
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for attempt in range(service.max_retries + 1):
            if attempt:
                await asyncio.sleep(min(MAX_BACKOFF_S, service.backoff_s * 2 ** (attempt - 1)))
            try:
                async with session.post(service.url, json=dict(payload)) as reply:
                    if reply.status < 300:
                        body = await reply.json(content_type=None)
                        if isinstance(body, Mapping) and "result" in body:
                            return str(body["result"])
                        last = f"the answer has no 'result': {str(body)[:200]}"
                        break
                    last = f"HTTP {reply.status}: {(await reply.text())[:200]}"
                    if not _retryable(reply.status):
                        break
            except (aiohttp.ClientError, TimeoutError) as exc:
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    logger.warning("tool service %s failed: %s", service.url, last)
    return f"error: the tool service failed ({last})"


async def generate(sample: Sample, ctx: GenerateContext) -> Sample:
    """Policy turns, each call sent to the service of `generate_settings`; see the module
    docstring."""
    service = ToolService.from_settings(ctx.settings)

    async def tool(call: str, ctx: GenerateContext) -> str:
        payload = {
            **service.extra,
            "query": call.strip(),
            "sample_index": sample.index,
            "turn": sample.turns,
            "evaluation": ctx.evaluation,
        }
        return await call_service(service, payload)

    return await run_tool_loop(sample, ctx, tool, service.open_tag, service.close_tag)


generate.check_settings = check_settings  # type: ignore[attr-defined]
generate.min_turns = 2  # type: ignore[attr-defined]  # a call, then the answer
