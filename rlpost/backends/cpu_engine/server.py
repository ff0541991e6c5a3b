"""The CPU engine's HTTP server: the part of SGLang's HTTP API that rollout and the router use.

    python -m rlpost.backends.cpu_engine --model-path DIR --host 127.0.0.1 --port P

The server listens at once and answers /health with 503 until the model is loaded. Stopped
(SIGTERM, SIGINT), it answers its open requests, new ones and /health with 503 (see
EngineServer.shut_down). Started with a key in $RLPOST_ENGINE_KEY
(rlpost.backends.engine_key), it answers every request, health included, with 401 unless it
carries `Authorization: Bearer <key>` (a bare GET /health, the router's registration probe,
only learns that the server is up).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict
from typing import Any

from aiohttp import web

from rlpost.backends.cpu_engine.engine import MEMORY_TAGS, CpuEngine, EngineSettings
from rlpost.backends.cpu_engine.protocol import parse_generate_request, render_output
from rlpost.backends.cpu_engine.row import Row
from rlpost.backends.cpu_engine.sampling import RequestError
from rlpost.backends.cpu_engine.scheduler import SHUTTING_DOWN
from rlpost.backends.cpu_engine.weights import WeightLoadError
from rlpost.backends.engine_key import ENGINE_KEY_ENV, is_authorized
from rlpost.backends.sglang.buckets import WeightInfo

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
HEALTH_GENERATE_TIMEOUT_S = 20.0
PAUSE_MODES = ("abort", "in_place", "retract")


def error_response(message: str, status: int = 400) -> web.Response:
    if status >= 500:  # SGLang's shape for retryable errors, which the router retries
        return web.json_response({"detail": message}, status=status)
    return web.json_response({"error": {"message": message}}, status=status)


async def read_json(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        body = await request.json(loads=json.loads)
    except json.JSONDecodeError as exc:
        raise RequestError(f"the body is not valid JSON: {exc}") from exc
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    return body


def raise_error_status(rows: Sequence[Row]) -> None:
    """Where a finished request's HTTP status is decided: 200 with the outputs, unless a row
    finished with an abort carrying a status_code (the engine shutting down), which answers
    that status instead, as SGLang does (error_response gives the body its shape)."""
    for row in rows:
        finish = row.finish
        if finish is not None and finish.error_status is not None:
            raise RequestError(finish.message or "aborted", status=finish.error_status)


class EngineServer:
    """aiohttp routes over a CpuEngine that is loaded in the background."""

    def __init__(self, settings: EngineSettings, key: str | None = None) -> None:
        self.settings = settings
        self.key = key or None
        self.engine: CpuEngine | None = None
        self.load_error: BaseException | None = None
        self._unpaused = asyncio.Event()
        self._unpaused.set()
        self._stopping = asyncio.Event()

    async def load(self) -> None:
        try:
            self.engine = await asyncio.to_thread(CpuEngine, self.settings)
        except BaseException as exc:
            self.load_error = exc
            raise
        logger.info("engine ready: %s", self.settings.model_path)

    def ready_engine(self) -> CpuEngine:
        if self._stopping.is_set():
            raise RequestError(SHUTTING_DOWN, status=503)
        if self.engine is None:
            raise RequestError("the engine is still loading", status=503)
        return self.engine

    async def shut_down(self) -> None:
        """Stop serving, as SGLang does on SIGTERM: the requests running or held by a pause,
        and any that arrive now, health checks included, are answered 503 with a "detail"
        (SGLang's answer to an abort carrying status_code 503), which the router re-sends to
        another engine. Only aborts asked for (abort_request, pause_generation) answer 200
        with the partial output."""
        self._stopping.set()
        if self.engine is not None:
            await asyncio.to_thread(self.engine.shutdown)

    def app(self) -> web.Application:
        middlewares = [self._errors] if self.key is None else [self._authorize, self._errors]
        app = web.Application(middlewares=middlewares, client_max_size=1 << 30)
        routes = [
            ("GET", "/health", self.health),
            ("GET", "/health_generate", self.health_generate),
            ("POST", "/generate", self.generate),
            ("POST", "/abort_request", self.abort_request),
            ("POST", "/pause_generation", self.pause_generation),
            ("POST", "/continue_generation", self.continue_generation),
            ("*", "/flush_cache", self.flush_cache),
            ("POST", "/update_weights_from_disk", self.update_weights_from_disk),
            ("POST", "/update_weight_version", self.update_weight_version),
            ("POST", "/init_weights_update_group", self.init_weights_update_group),
            ("POST", "/update_weights_from_distributed", self.update_weights_from_distributed),
            ("POST", "/destroy_weights_update_group", self.destroy_weights_update_group),
            ("GET", "/get_weight_version", self.get_weight_version),
            ("GET", "/model_info", self.model_info),
            ("GET", "/get_model_info", self.model_info),
            ("GET", "/server_info", self.server_info),
            ("GET", "/get_server_info", self.server_info),
            ("GET", "/get_load", self.get_load),
            ("GET", "/v1/loads", self.v1_loads),
            ("*", "/release_memory_occupation", self.release_memory),
            ("*", "/resume_memory_occupation", self.resume_memory),
            ("GET", "/v1/models", self.v1_models),
        ]
        for method, path, handler in routes:
            app.router.add_route(method, path, handler)
        return app

    @web.middleware
    async def _authorize(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every request needs the key, with one exception: GET /health without any
        Authorization header. The sglang-router probes a worker it registers with exactly
        that and never sends its key there (sglang_router 0.3.2; SGLang's own servers leave
        /health open too). A client of another launch sends its own key, and gets 401 here
        as everywhere: its health check fails, so it never takes this engine for its own."""
        assert self.key is not None
        header = request.headers.get("Authorization")
        if header is None and request.method == "GET" and request.path == "/health":
            return await handler(request)
        if not is_authorized(header, self.key):
            return error_response("this engine belongs to another launch (no or wrong key)", 401)
        return await handler(request)

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except RequestError as exc:
            return error_response(exc.message, exc.status)
        except WeightLoadError as exc:
            return error_response(str(exc), 400)

    async def health(self, request: web.Request) -> web.Response:
        if self._stopping.is_set():
            return web.Response(status=503, text=SHUTTING_DOWN)
        if self.engine is None:
            state = "loading" if self.load_error is None else f"failed: {self.load_error}"
            return web.Response(status=503, text=state)
        return web.Response(text="ok")

    async def health_generate(self, request: web.Request) -> web.Response:
        engine = self.ready_engine()  # 503 while loading or shutting down
        body = {"input_ids": [0], "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
        try:
            await asyncio.wait_for(self._run_generate(engine, body), HEALTH_GENERATE_TIMEOUT_S)
        except (TimeoutError, RequestError) as exc:
            return web.Response(status=503, text=f"unhealthy: {exc}")
        return web.Response(text="ok")

    async def generate(self, request: web.Request) -> web.Response:
        engine = self.ready_engine()
        body = await read_json(request)
        return web.json_response(await self._run_generate(engine, body))

    async def _run_generate(self, engine: CpuEngine, body: dict[str, Any]) -> Any:
        parsed = parse_generate_request(body, engine.encode, engine.context_len)
        await self._wait_unpaused()
        rows = engine.make_rows(parsed)
        engine.submit(rows)
        try:
            await asyncio.gather(*(asyncio.wrap_future(r.done) for r in rows))
        except asyncio.CancelledError:  # the client went away: free the rows' batch slots
            for row in rows:
                engine.scheduler.abort(row.rid, "client disconnected")
            raise
        raise_error_status(rows)
        outputs = [render_output(engine.output_of(r), parsed, engine.decode) for r in rows]
        return outputs if parsed.returns_list else outputs[0]

    async def _wait_unpaused(self) -> None:
        """Hold a request while generation is paused; one held when the server shuts down
        is answered 503."""
        if not self._unpaused.is_set():
            waits = [asyncio.create_task(e.wait()) for e in (self._unpaused, self._stopping)]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
        if self._stopping.is_set():
            raise RequestError(SHUTTING_DOWN, status=503)

    async def abort_request(self, request: web.Request) -> web.Response:
        engine = self.ready_engine()
        body = await read_json(request)
        if body.get("abort_all"):
            engine.scheduler.abort(None, "aborted by abort_request")
        elif body.get("rid"):
            engine.scheduler.abort(str(body["rid"]), "aborted by abort_request")
        return web.Response()

    async def pause_generation(self, request: web.Request) -> web.Response:
        engine = self.ready_engine()
        mode = (await read_json(request)).get("mode") or "abort"
        if mode not in PAUSE_MODES:
            raise RequestError(f"pause mode '{mode}' is unknown; use one of {list(PAUSE_MODES)}")
        self._unpaused.clear()
        await asyncio.to_thread(engine.scheduler.pause, mode)
        return web.json_response({"status": "ok", "message": f"generation paused ({mode})"})

    async def continue_generation(self, request: web.Request) -> web.Response:
        engine = self.ready_engine()
        engine.scheduler.resume()
        self._unpaused.set()
        return web.json_response({"status": "ok"})

    async def flush_cache(self, request: web.Request) -> web.Response:
        engine = self.ready_engine()
        if not engine.scheduler.is_idle:
            return web.Response(status=400, text="Cache not flushed: requests are running.")
        return web.Response(text="Cache flushed.")

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        engine = self.ready_engine()
        body = await read_json(request)
        path = body.get("model_path")
        if not isinstance(path, str) or not path:
            raise RequestError("update_weights_from_disk needs 'model_path' (a folder)")
        if body.get("abort_all_requests"):
            engine.scheduler.abort(None, "aborted for a weight update")
        version = body.get("weight_version")
        try:
            await asyncio.wrap_future(engine.update_weights_from_disk(path, version))
        except WeightLoadError as exc:
            return web.json_response(
                {"success": False, "message": str(exc), "num_paused_requests": 0}, status=400
            )
        message = f"loaded weights from {path}, weight_version={engine.weight_version}"
        return web.json_response({"success": True, "message": message, "num_paused_requests": 0})

    async def init_weights_update_group(self, request: web.Request) -> web.Response:
        engine = self.ready_engine()
        body = await read_json(request)
        try:
            address = (str(body["master_address"]), int(body["master_port"]))
            rank, world = int(body["rank_offset"]), int(body["world_size"])
        except (KeyError, TypeError, ValueError) as exc:
            raise RequestError(f"init_weights_update_group: bad or missing field: {exc}") from exc
        name = str(body.get("group_name") or "weight_update_group")
        backend = str(body.get("backend") or "gloo")
        await asyncio.to_thread(engine.join_update_group, address, rank, world, name, backend)
        return web.json_response({"success": True, "message": f"joined {name} as rank {rank}"})

    async def update_weights_from_distributed(self, request: web.Request) -> web.Response:
        engine = self.ready_engine()
        body = await read_json(request)
        names, dtypes, shapes = body.get("names"), body.get("dtypes"), body.get("shapes")
        if not (isinstance(names, list) and isinstance(dtypes, list) and isinstance(shapes, list)):
            raise RequestError("update_weights_from_distributed needs names, dtypes, shapes")
        if not len(names) == len(dtypes) == len(shapes):
            raise RequestError("names, dtypes and shapes must have the same length")
        infos = [
            WeightInfo(str(n), str(d), tuple(int(x) for x in s))
            for n, d, s in zip(names, dtypes, shapes, strict=True)
        ]
        name = str(body.get("group_name") or "weight_update_group")
        version = body.get("weight_version")
        loaded = await asyncio.to_thread(
            engine.receive_weights, infos, name, None if version is None else str(version)
        )
        try:
            await asyncio.wrap_future(loaded)
        except WeightLoadError as exc:
            return web.json_response({"success": False, "message": str(exc)}, status=400)
        return web.json_response({"success": True, "message": f"received {len(infos)} tensors"})

    async def destroy_weights_update_group(self, request: web.Request) -> web.Response:
        engine = self.ready_engine()
        name = str((await read_json(request)).get("group_name") or "weight_update_group")
        await asyncio.to_thread(engine.leave_update_group, name)
        return web.json_response({"success": True, "message": f"left {name}"})

    async def update_weight_version(self, request: web.Request) -> web.Response:
        engine = self.ready_engine()
        body = await read_json(request)
        version = body.get("new_version")
        if not isinstance(version, str) or not version:
            raise RequestError("update_weight_version needs 'new_version' (a string)")
        if body.get("abort_all_requests", True):
            engine.scheduler.abort(None, "aborted for a weight version update")
        await asyncio.wrap_future(engine.set_weight_version(version))
        return web.json_response(
            {"success": True, "message": "weight version updated", "new_version": version}
        )

    async def get_weight_version(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": self.ready_engine().weight_version})

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response(self.ready_engine().model_info())

    async def server_info(self, request: web.Request) -> web.Response:
        engine = self.ready_engine()
        load = engine.load()
        state = {"num_running_reqs": load.num_running, "num_served_reqs": load.num_served}
        info = {**asdict(self.settings), "internal_states": [state], "version": "rlpost-cpu"}
        return web.json_response(info)

    async def get_load(self, request: web.Request) -> web.Response:
        load = self.ready_engine().load()
        return web.json_response(
            [
                {
                    "dp_rank": 0,
                    "num_reqs": load.num_running + load.num_waiting,
                    "num_waiting_reqs": load.num_waiting,
                    "num_tokens": load.num_tokens,
                }
            ]
        )

    async def v1_loads(self, request: web.Request) -> web.Response:
        load = self.ready_engine().load()
        entry = {
            "dp_rank": 0,
            "num_running_reqs": load.num_running,
            "num_waiting_reqs": load.num_waiting,
            "num_total_reqs": load.num_running + load.num_waiting,
            "num_used_tokens": load.num_tokens,
        }
        return web.json_response({"timestamp": time.time(), "loads": [entry]})

    async def release_memory(self, request: web.Request) -> web.Response:
        engine = self.ready_engine()
        tags = (await read_json(request)).get("tags") or list(MEMORY_TAGS)
        await asyncio.wrap_future(engine.release_memory(tags))
        return web.json_response(None)

    async def resume_memory(self, request: web.Request) -> web.Response:
        engine = self.ready_engine()
        tags = (await read_json(request)).get("tags") or list(MEMORY_TAGS)
        await asyncio.wrap_future(engine.resume_memory(tags))
        return web.json_response(None)

    async def v1_models(self, request: web.Request) -> web.Response:
        engine = self.ready_engine()
        model = {
            "id": self.settings.model_path,
            "object": "model",
            "owned_by": "rlpost",
            "root": self.settings.model_path,
            "max_model_len": engine.context_len,
        }
        return web.json_response({"object": "list", "data": [model]})


async def serve(
    settings: EngineSettings, host: str, port: int, stop: asyncio.Event, key: str | None = None
) -> None:
    """Listen on host:port, load the engine, and serve until `stop` is set."""
    server = EngineServer(settings, key)
    runner = web.AppRunner(server.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    logger.info("listening on http://%s:%d", host, port)
    loading = asyncio.create_task(server.load())
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if loading.done() and loading.exception() is not None:
            raise loading.exception()  # type: ignore[misc]
        await stopping
    finally:
        loading.cancel()
        stopping.cancel()
        # Engine first: it answers open requests 503, so they answer before the listener
        # closes instead of holding shutdown for their full generation.
        await server.shut_down()
        await runner.cleanup()


class BackgroundServer:
    """An engine server on its own event-loop thread, for tests and single-process runs."""

    def __init__(
        self,
        settings: EngineSettings,
        host: str = "127.0.0.1",
        port: int = 0,
        key: str | None = None,
    ) -> None:
        self.settings = settings
        self.host = host
        self.port = port
        self.server = EngineServer(settings, key)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> str:
        """Bind, load the model, and return the base URL once /health answers 200."""
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result()
        return self.url

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.server.app(), handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        await self.server.load()

    def stop(self) -> None:
        """Shut the server down (see EngineServer.shut_down); once stopped, a no-op."""
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self.server.shut_down(), self._loop).result()
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


def parse_args(argv: Sequence[str] | None) -> tuple[EngineSettings, str, int]:
    parser = argparse.ArgumentParser(prog="python -m rlpost.backends.cpu_engine")
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--num-threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--batch-wait-ms", type=float, default=5.0)
    parser.add_argument("--weight-version", default="default")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    parser.add_argument(
        "--nice", type=int, default=0, help="added to the process's niceness before it loads"
    )
    args = parser.parse_args(argv)
    if args.nice:
        os.nice(args.nice)
    settings = EngineSettings(
        model_path=args.model_path,
        seed=args.seed,
        max_batch_size=args.max_batch_size,
        batch_wait_s=args.batch_wait_ms / 1000,
        num_threads=args.num_threads,
        weight_version=args.weight_version,
    )
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("aiohttp.server").addFilter(quiet_http2_probe)
    return settings, args.host, args.port


def quiet_http2_probe(record: logging.LogRecord) -> bool:
    """The sglang-router's first connections to a worker it registers start with the HTTP/2
    preface; aiohttp answers it with a 400 and logs a traceback. That answer is expected (the
    router then speaks HTTP/1.1), not an error: one line instead."""
    error = record.exc_info[1] if record.exc_info else None
    if error is None or "PRI/Upgrade" not in str(error):
        return True
    record.msg, record.args, record.exc_info, record.exc_text = (
        "a connection opened with the HTTP/2 preface (the router registering this server) "
        "was answered 400: this server speaks HTTP/1.1",
        (),
        None,
        None,
    )
    record.levelno, record.levelname = logging.INFO, "INFO"
    return True


def main(argv: Sequence[str] | None = None) -> None:
    settings, host, port = parse_args(argv)
    key = os.environ.pop(ENGINE_KEY_ENV, None)  # not inherited by anything this starts

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(settings, host, port, stop, key)

    code = 0
    try:
        asyncio.run(run())
    except (OSError, ValueError) as exc:  # what a bad --model-path or a taken port raises
        logger.error("cpu engine failed to start: %s", exc)
        code = 1
    # Everything is shut down by now; skipping interpreter teardown (seconds for torch and
    # transformers) makes SIGTERM answer promptly.
    logging.shutdown()
    os._exit(code)
