"""Async HTTP client for rollout: /generate through the router, control calls to each engine.

It speaks SGLang's HTTP API, so the same client drives rlpost's CPU engines and SGLang
servers. The router forwards only generation; abort, pause, flush and weight updates are
sent to every engine directly (the router answers 404 to them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import TracebackType
from typing import Any

import aiohttp

from rlpost.backends.engine_key import auth_headers

logger = logging.getLogger(__name__)


class FinishKind(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


class EngineRequestError(RuntimeError):
    """A call to the router or an engine that failed for good."""

    def __init__(self, message: str, status: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class EngineAbortError(EngineRequestError):
    """Requests an engine answered aborted though rlpost asked no engine to abort anything
    while they ran (no weight update, no stop): `aborted` holds each one's position in the
    request (a batch's item), rid and the engine's message."""

    def __init__(self, aborted: Sequence[tuple[int, str | None, str | None]]) -> None:
        _, rid, message = aborted[0]
        super().__init__(f"the engine aborted request {rid} on its own: {message!r}")
        self.aborted = list(aborted)
        self.engine_message = message
        self.samples: list[int] | None = None  # the samples' indices, where the caller knows


@dataclass(frozen=True)
class GenerateResult:
    """One completion as SGLang reports it. `output_logprobs[i]` is the logprob of
    `output_ids[i]` (empty when logprobs were not requested)."""

    output_ids: list[int]
    text: str
    output_logprobs: list[float]
    finish_reason: FinishKind
    weight_version: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    rid: str | None = None
    finish_matched: int | str | None = None
    abort_message: str | None = None


def parse_generate_response(body: Any) -> list[GenerateResult]:
    """SGLang's /generate answer (one object, or a list for batches and n > 1)."""
    items = body if isinstance(body, list) else [body]
    return [_parse_one(item) for item in items]


def _parse_one(item: Any) -> GenerateResult:
    if not isinstance(item, Mapping) or not isinstance(item.get("meta_info"), Mapping):
        raise EngineRequestError(f"unexpected /generate answer: {str(item)[:300]}", body=item)
    meta = item["meta_info"]
    finish = meta.get("finish_reason") or {}
    pairs = meta.get("output_token_logprobs") or []
    logprobs = [float(p[0]) for p in pairs]
    output_ids = item.get("output_ids")
    if output_ids is None:
        output_ids = [int(p[1]) for p in pairs]
    try:
        kind = FinishKind(str(finish.get("type")))
    except ValueError as exc:
        raise EngineRequestError(f"unknown finish_reason {finish!r}", body=item) from exc
    version = meta.get("weight_version")
    return GenerateResult(
        output_ids=[int(t) for t in output_ids],
        text=str(item.get("text", "")),
        output_logprobs=logprobs,
        finish_reason=kind,
        weight_version=None if version is None else str(version),
        prompt_tokens=int(meta.get("prompt_tokens", 0)),
        completion_tokens=int(meta.get("completion_tokens", len(output_ids))),
        cached_tokens=int(meta.get("cached_tokens", 0) or 0),
        rid=meta.get("id"),
        finish_matched=finish.get("matched"),
        abort_message=finish.get("message") if kind is FinishKind.ABORT else None,
    )


def generate_body(
    input_ids: list[int] | list[list[int]],
    sampling_params: Mapping[str, Any],
    return_logprob: bool,
    rid: str | None = None,
) -> dict[str, Any]:
    """A /generate request: one prompt, or a batch of them (a list of lists)."""
    body: dict[str, Any] = {
        "input_ids": input_ids,
        "sampling_params": dict(sampling_params),
        "return_logprob": return_logprob,
    }
    if rid is not None:
        body["rid"] = rid
    return body


def _retryable(status: int) -> bool:
    # 4xx means the request itself is wrong; sending it again cannot help. Except 401: an
    # engine of another launch holds a dead engine's port (rlpost.backends.engine_key) and
    # refused; another engine, or this one restarted elsewhere, can serve the retry.
    return status >= 500 or status in (401, 408, 429)


class EngineClient:
    """Sends /generate to the router with bounded concurrency and bounded retries, and
    control calls to each engine. Use it inside one event loop, with `async with` or a
    final close()."""

    def __init__(
        self,
        router_url: str,
        *,
        worker_urls: Sequence[str] | None = None,
        max_concurrency: int = 256,
        max_attempts: int = 5,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        request_timeout_s: float | None = None,
        control_timeout_s: float = 600.0,
        gone: Callable[[], str | None] | None = None,
        key: str | None = None,
    ) -> None:
        """`gone()` says why no retry can succeed (the router's process exited), or None;
        asked before each retry, so a request does not outwait its retries for nothing.
        `key` is the launch's engine key (rlpost.backends.engine_key), sent with every
        request: to the router, to each engine, health checks included."""
        if max_attempts < 1 or max_concurrency < 1:
            raise ValueError("max_attempts and max_concurrency must be >= 1")
        self.router_url = router_url.rstrip("/")
        self._worker_urls = [u.rstrip("/") for u in worker_urls] if worker_urls else None
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_concurrency = max_concurrency
        self.gone = gone
        self._semaphore = asyncio.Semaphore(max_concurrency)
        self._taking = asyncio.Lock()
        self._generate_timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self._control_timeout = aiohttp.ClientTimeout(total=control_timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._headers = auth_headers(key)
        self._aborts_asked = 0  # aborts rlpost asked for, counted as each one starts
        self._aborting = 0  # those under way

    @contextlib.contextmanager
    def asking_aborts(self) -> Iterator[None]:
        """Around whatever aborts engines' requests on rlpost's behalf (a pause, an abort,
        a group stopped): requests it answers aborted were interrupted, not refused."""
        self._aborts_asked += 1
        self._aborting += 1
        try:
            yield
        finally:
            self._aborting -= 1

    def abort_mark(self) -> int | None:
        """Where the aborts rlpost asked for stand, taken as a request goes out (None: one
        is under way)."""
        return None if self._aborting else self._aborts_asked

    def asked_abort_since(self, mark: int | None) -> bool:
        """Whether rlpost asked for an abort since `mark` (or was asking then, or is now):
        what tells an interrupted request from one an engine aborted on its own."""
        return mark is None or self._aborting > 0 or self._aborts_asked != mark

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0)  # the semaphore bounds concurrency
            self._session = aiohttp.ClientSession(connector=connector, headers=self._headers)
        return self._session

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any],
        *,
        return_logprob: bool = True,
        rid: str | None = None,
    ) -> GenerateResult:
        """One completion for one prompt, through the router."""
        if int(sampling_params.get("n", 1) or 1) != 1:
            raise ValueError("generate() returns one completion; send n requests instead")
        body = generate_body(list(input_ids), sampling_params, return_logprob, rid)
        async with self._semaphore:
            answer = await self._post_with_retries(f"{self.router_url}/generate", body)
        return parse_generate_response(answer)[0]

    async def generate_batch(
        self,
        input_ids: Sequence[Sequence[int]],
        sampling_params: Mapping[str, Any],
        *,
        return_logprob: bool = True,
        rid: str | None = None,
    ) -> list[GenerateResult]:
        """One completion for each prompt, in one request through the router (SGLang's
        batch form; the engine names them `{rid}_{i}`). It holds one concurrency slot per
        prompt."""
        if int(sampling_params.get("n", 1) or 1) != 1:
            raise ValueError("generate_batch() returns one completion per prompt")
        prompts = [list(ids) for ids in input_ids]
        body = generate_body(prompts, sampling_params, return_logprob, rid)
        async with self._slots(len(input_ids)):
            answer = await self._post_with_retries(f"{self.router_url}/generate", body)
        results = parse_generate_response(answer)
        if len(results) != len(input_ids):
            raise EngineRequestError(
                f"/generate answered {len(results)} completions for {len(input_ids)} prompts",
                body=answer,
            )
        return results

    @contextlib.asynccontextmanager
    async def _slots(self, count: int) -> AsyncIterator[None]:
        """`count` slots of the concurrency bound (at most all of them), taken under a lock
        so two requests never each hold part of what they need."""
        count = min(count, self.max_concurrency)
        async with self._taking:
            for _ in range(count):
                await self._semaphore.acquire()
        try:
            yield
        finally:
            for _ in range(count):
                self._semaphore.release()

    async def _post_with_retries(self, url: str, body: Mapping[str, Any]) -> Any:
        last_error = ""
        for attempt in range(1, self.max_attempts + 1):
            try:
                async with self._http().post(
                    url, json=body, timeout=self._generate_timeout
                ) as response:
                    answer = await _read_body(response)
                    if response.status < 300:
                        return answer
                    last_error = f"HTTP {response.status}: {str(answer)[:300]}"
                    if not _retryable(response.status):
                        raise EngineRequestError(
                            f"POST {url} was rejected: {last_error}", response.status, answer
                        )
            except (aiohttp.ClientError, TimeoutError) as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            why = self.gone() if self.gone is not None else None
            if why is not None:
                raise EngineRequestError(f"POST {url} failed ({last_error}), and {why}")
            if attempt < self.max_attempts:
                delay = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
                logger.warning("POST %s failed (%s); retry %d in %.1f s", url, last_error,
                               attempt, delay)  # fmt: skip
                await asyncio.sleep(delay)
        raise EngineRequestError(
            f"POST {url} failed {self.max_attempts} times; last error: {last_error}. "
            f"Check that the router and its engines are up (GET {self.router_url}/workers)."
        )

    async def _call(
        self, method: str, url: str, body: Mapping[str, Any] | None = None
    ) -> tuple[int, Any]:
        async with self._http().request(
            method, url, json=body, timeout=self._control_timeout
        ) as response:
            return response.status, await _read_body(response)

    async def _call_ok(self, method: str, url: str, body: Mapping[str, Any] | None = None) -> Any:
        status, answer = await self._call(method, url, body)
        if status >= 300:
            raise EngineRequestError(f"{method} {url}: HTTP {status}: {answer}", status, answer)
        return answer

    def set_worker_urls(self, worker_urls: Sequence[str]) -> None:
        """The engines that control calls go to (the engine pool updates it on a restart)."""
        self._worker_urls = [u.rstrip("/") for u in worker_urls]

    async def post(self, worker_url: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        """One control call to one engine; raises EngineRequestError on a non-2xx answer."""
        return await self._call_ok("POST", f"{worker_url.rstrip('/')}{path}", body)

    async def generate_on(
        self,
        worker_url: str,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any],
        *,
        return_logprob: bool = True,
    ) -> GenerateResult:
        """One completion from one engine, bypassing the router (probes, checks)."""
        body = generate_body(list(input_ids), sampling_params, return_logprob)
        answer = await self._call_ok("POST", f"{worker_url.rstrip('/')}/generate", body)
        return parse_generate_response(answer)[0]

    async def health_status(self, worker_url: str, path: str, timeout_s: float) -> int:
        """The engine's HTTP status for `path`; raises on no answer within `timeout_s`."""
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with self._http().get(f"{worker_url.rstrip('/')}{path}", timeout=timeout) as reply:
            await reply.read()
            return reply.status

    async def worker_urls(self) -> list[str]:
        """The engines: those given at construction, else the router's registered workers."""
        if self._worker_urls is not None:
            return list(self._worker_urls)
        answer = await self._call_ok("GET", f"{self.router_url}/workers")
        return [str(w["url"]).rstrip("/") for w in answer.get("workers", [])]

    async def _each(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        worker_urls: Sequence[str] | None = None,
    ) -> list[Any]:
        urls = list(worker_urls) if worker_urls is not None else await self.worker_urls()
        calls = [self._call_ok(method, f"{u.rstrip('/')}{path}", body) for u in urls]
        return list(await asyncio.gather(*calls))

    async def _each_reachable(
        self, method: str, path: str, body: Mapping[str, Any] | None, worker_urls: Sequence[str]
    ) -> list[Any]:
        """Like _each, but an engine that cannot be reached is skipped: a dead engine holds
        no requests (the router re-sends its in-flight ones elsewhere), and the engine pool
        restarts it."""

        async def one(url: str) -> Any:
            try:
                return await self._call_ok(method, f"{url.rstrip('/')}{path}", body)
            except (aiohttp.ClientConnectionError, TimeoutError) as exc:
                logger.warning("%s%s: engine unreachable (%s); skipped", url, path, exc)
                return None

        answers = await asyncio.gather(*(one(u) for u in worker_urls))
        return [a for a in answers if a is not None]

    async def abort_all(
        self,
        worker_urls: Sequence[str] | None = None,
        wait: bool = True,
        timeout_s: float = 60.0,
    ) -> None:
        """Abort every request on every engine; with `wait`, until none is left running."""
        urls = list(worker_urls) if worker_urls is not None else await self.worker_urls()
        deadline = time.monotonic() + timeout_s
        with self.asking_aborts():
            while True:
                await self._each_reachable("POST", "/abort_request", {"abort_all": True}, urls)
                if not wait or await self.num_requests(urls) == 0:
                    return
                if time.monotonic() > deadline:
                    raise EngineRequestError(
                        f"requests still running after abort for {timeout_s} s"
                    )
                await asyncio.sleep(0.2)

    async def abort_rid(self, rid_prefix: str, worker_urls: Sequence[str] | None = None) -> None:
        """Abort the requests whose rid starts with `rid_prefix`, on every engine (they come
        back with what they generated so far)."""
        urls = list(worker_urls) if worker_urls is not None else await self.worker_urls()
        with self.asking_aborts():
            await self._each_reachable("POST", "/abort_request", {"rid": rid_prefix}, urls)

    async def num_requests(self, worker_urls: Sequence[str] | None = None) -> int:
        """Requests running or waiting, summed over the engines."""
        urls = list(worker_urls) if worker_urls is not None else await self.worker_urls()
        answers = await self._each_reachable("GET", "/v1/loads?include=core", None, urls)
        return sum(
            int(load.get("num_running_reqs", 0)) + int(load.get("num_waiting_reqs", 0))
            for answer in answers
            for load in answer.get("loads", [])
        )

    async def pause(self, mode: str = "abort", worker_urls: Sequence[str] | None = None) -> None:
        with self.asking_aborts():
            await self._each("POST", "/pause_generation", {"mode": mode}, worker_urls)

    async def continue_generation(self, worker_urls: Sequence[str] | None = None) -> None:
        await self._each("POST", "/continue_generation", {}, worker_urls)

    async def flush_cache(
        self,
        worker_urls: Sequence[str] | None = None,
        attempts: int = 60,
        interval_s: float = 1.0,
    ) -> None:
        """Flush each engine's cache, retrying while it answers 400 (requests still running)."""
        urls = list(worker_urls) if worker_urls is not None else await self.worker_urls()

        async def flush(url: str) -> None:
            for _ in range(attempts):
                status, answer = await self._call("POST", f"{url}/flush_cache")
                if status == 200:
                    return
                if status != 400:
                    raise EngineRequestError(f"flush_cache on {url}: HTTP {status}: {answer}")
                await asyncio.sleep(interval_s)
            raise EngineRequestError(f"flush_cache on {url} still refused after {attempts} tries")

        await asyncio.gather(*(flush(u.rstrip("/")) for u in urls))

    async def update_weights_from_disk(
        self,
        model_path: str,
        weight_version: str | None = None,
        worker_urls: Sequence[str] | None = None,
    ) -> None:
        """Each engine loads the checkpoint folder `model_path` (visible to every engine)."""
        body: dict[str, Any] = {"model_path": model_path}
        if weight_version is not None:
            body["weight_version"] = weight_version
        answers = await self._each("POST", "/update_weights_from_disk", body, worker_urls)
        failed = [a for a in answers if not (isinstance(a, Mapping) and a.get("success"))]
        if failed:
            raise EngineRequestError(f"update_weights_from_disk failed: {failed}")

    async def update_weight_version(
        self, version: str, worker_urls: Sequence[str] | None = None
    ) -> None:
        """Each engine serves `version` from now on (after the last bucket of an update);
        requests in flight are left alone (the engines are paused during an update)."""
        body = {"new_version": version, "abort_all_requests": False}
        answers = await self._each("POST", "/update_weight_version", body, worker_urls)
        failed = [a for a in answers if not (isinstance(a, Mapping) and a.get("success"))]
        if failed:
            raise EngineRequestError(f"update_weight_version failed: {failed}")

    async def get_weight_version(self, worker_url: str) -> str:
        """The version an engine serves. Stock SGLang 0.5.2x dropped /get_weight_version and
        reports it in /model_info instead."""
        url = worker_url.rstrip("/")
        status, answer = await self._call("GET", f"{url}/get_weight_version")
        if status == 404:
            answer = await self._call_ok("GET", f"{url}/model_info")
        elif status >= 300:
            raise EngineRequestError(f"GET {url}/get_weight_version: HTTP {status}: {answer}")
        return str(answer["weight_version"])

    async def release_memory(
        self, tags: Sequence[str], worker_urls: Sequence[str] | None = None
    ) -> None:
        """Free the engines' GPU memory for `tags` (weights, kv_cache, cuda_graph)."""
        await self._each("POST", "/release_memory_occupation", {"tags": list(tags)}, worker_urls)

    async def resume_memory(
        self, tags: Sequence[str], worker_urls: Sequence[str] | None = None
    ) -> None:
        await self._each("POST", "/resume_memory_occupation", {"tags": list(tags)}, worker_urls)

    async def wait_healthy(
        self,
        worker_urls: Sequence[str],
        timeout_s: float = 600.0,
        endpoint: str = "/health_generate",
        interval_s: float = 0.5,
    ) -> None:
        """Poll each engine's `endpoint` until it answers 200."""
        deadline = time.monotonic() + timeout_s

        async def wait_one(url: str) -> None:
            last: object = None
            while time.monotonic() < deadline:
                try:
                    status, last = await self._call("GET", f"{url.rstrip('/')}{endpoint}")
                    if status == 200:
                        return
                except (aiohttp.ClientError, TimeoutError) as exc:
                    last = exc
                await asyncio.sleep(interval_s)
            raise EngineRequestError(f"{url}{endpoint} not healthy after {timeout_s} s: {last}")

        await asyncio.gather(*(wait_one(u) for u in worker_urls))


async def _read_body(response: aiohttp.ClientResponse) -> Any:
    text = await response.text()
    if "json" in (response.content_type or ""):
        try:
            return await response.json(content_type=None)
        except ValueError:
            return text
    return text
