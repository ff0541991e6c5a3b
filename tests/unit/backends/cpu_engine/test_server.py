"""The CPU engine's HTTP API, in SGLang's request and response shapes."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from aiohttp.http_exceptions import BadHttpMessage
from aiohttp.test_utils import TestClient, TestServer
from transformers import AutoModelForCausalLM

from rlpost.backends.cpu_engine.engine import EngineSettings
from rlpost.backends.cpu_engine.server import (
    BackgroundServer,
    EngineServer,
    quiet_http2_probe,
    serve,
)
from rlpost.runtime.router import free_port, http_json

PROMPT = [40, 41, 42, 43]
GREEDY = {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True}
LONG = {"max_new_tokens": 240, "temperature": 0.0, "ignore_eos": True}
SHUTTING_DOWN = {"detail": "the engine is shutting down"}


@pytest.fixture(scope="module")
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=4) as executor:
        yield executor


def generate(url: str, **body: Any) -> tuple[int, Any]:
    return http_json("POST", f"{url}/generate", {"input_ids": PROMPT, **body}, timeout_s=60)


def wait_until(predicate: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def running(url: str) -> int:
    return int(http_json("GET", f"{url}/get_load")[1][0]["num_reqs"])


def answers(url: str) -> int | None:
    try:
        return http_json("GET", url, timeout_s=2)[0]
    except OSError:  # not listening yet
        return None


def test_generate_answers_in_sglang_shape_and_ignores_router_keys(url: str) -> None:
    router_keys = {"model": None, "stream": False, "log_metrics": True, "background": False,
                   "return_text_in_logprobs": False, "return_hidden_states": False}  # fmt: skip
    status, body = generate(
        url, sampling_params=GREEDY, return_logprob=True, rid="a1", **router_keys
    )
    assert status == 200
    meta = body["meta_info"]
    assert meta["id"] == "a1" and meta["finish_reason"] == {"type": "length", "length": 6}
    assert (meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"]) == (4, 6, 0)
    assert meta["weight_version"] == "default"
    assert [pair[1] for pair in meta["output_token_logprobs"]] == body["output_ids"]
    assert all(pair[0] <= 0 and pair[2] is None for pair in meta["output_token_logprobs"])
    assert isinstance(body["text"], str)
    assert generate(url, sampling_params=GREEDY)[1]["output_ids"] == body["output_ids"]


def test_bad_requests_are_400_with_an_error_message(url: str) -> None:
    status, body = generate(url, sampling_params={"max_new_tokens": 2, "temprature": 0.5})
    assert status == 400 and "temprature" in body["error"]["message"]
    status, body = http_json("POST", f"{url}/generate", {"sampling_params": {}})
    assert status == 400 and "input_ids" in body["error"]["message"]
    status, body = generate(url, sampling_params={"max_new_tokens": 1000})
    assert status == 400 and "context length" in body["error"]["message"]


def test_batches_and_n_return_lists_with_suffixed_rids(url: str) -> None:
    status, body = http_json(
        "POST", f"{url}/generate",
        {"input_ids": [PROMPT, PROMPT[:2]], "sampling_params": GREEDY, "rid": "b"},
    )  # fmt: skip
    assert status == 200 and [b["meta_info"]["id"] for b in body] == ["b_0", "b_1"]
    assert [b["meta_info"]["prompt_tokens"] for b in body] == [4, 2]
    sampled = {"max_new_tokens": 8, "temperature": 1.0, "n": 3, "ignore_eos": True}
    status, body = generate(url, sampling_params=sampled, rid="s")
    assert [b["meta_info"]["id"] for b in body] == ["s_0", "s_1", "s_2"]
    assert len({tuple(b["output_ids"]) for b in body}) > 1


def test_sampling_seed_makes_sampling_reproducible(url: str) -> None:
    seeded = {"max_new_tokens": 12, "temperature": 1.0, "ignore_eos": True, "sampling_seed": 5}
    first = generate(url, sampling_params=seeded)[1]["output_ids"]
    assert generate(url, sampling_params=seeded)[1]["output_ids"] == first
    other = generate(url, sampling_params={**seeded, "sampling_seed": 6})[1]["output_ids"]
    assert other != first


def test_text_drops_a_matched_stop_token_unless_no_stop_trim(url: str) -> None:
    free = generate(url, sampling_params=GREEDY)[1]
    stop = free["output_ids"][2]
    cut = free["output_ids"].index(stop)
    params = {**GREEDY, "stop_token_ids": [stop], "skip_special_tokens": False}
    trimmed = generate(url, sampling_params=params)[1]
    kept = generate(url, sampling_params={**params, "no_stop_trim": True})[1]
    assert trimmed["output_ids"] == kept["output_ids"] == free["output_ids"][: cut + 1]
    assert trimmed["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert len(kept["text"]) > len(trimmed["text"]) and kept["text"].startswith(trimmed["text"])


def test_abort_by_rid_prefix_returns_partial_output(url: str, pool: ThreadPoolExecutor) -> None:
    pending = pool.submit(generate, url, sampling_params=LONG, rid="job-7", return_logprob=True)
    wait_until(lambda: running(url) == 1)
    assert http_json("POST", f"{url}/abort_request", {"rid": "job-"})[0] == 200
    status, body = pending.result(timeout=30)
    assert status == 200
    # SGLang's shape for an abort asked for: no status_code (a 400 or 5xx one is an error)
    assert body["meta_info"]["finish_reason"] == {
        "type": "abort",
        "message": "aborted by abort_request",
        "status_code": None,
        "err_type": None,
    }
    assert len(body["output_ids"]) < LONG["max_new_tokens"]
    assert len(body["meta_info"]["output_token_logprobs"]) == len(body["output_ids"])


def test_pause_abort_blocks_new_requests_until_continue(url: str, pool: ThreadPoolExecutor) -> None:
    inflight = pool.submit(generate, url, sampling_params=LONG)
    wait_until(lambda: running(url) == 1)
    assert http_json("POST", f"{url}/pause_generation", {"mode": "abort"})[0] == 200
    finish = inflight.result(timeout=30)[1]["meta_info"]["finish_reason"]
    assert (finish["type"], finish["status_code"]) == ("abort", None)
    waiting: Future[tuple[int, Any]] = pool.submit(generate, url, sampling_params=GREEDY)
    time.sleep(0.3)
    assert not waiting.done()
    assert http_json("POST", f"{url}/continue_generation", {})[0] == 200
    status, body = waiting.result(timeout=30)
    assert status == 200 and body["meta_info"]["finish_reason"]["type"] == "length"


def test_pause_in_place_holds_running_requests(url: str, pool: ThreadPoolExecutor) -> None:
    inflight = pool.submit(generate, url, sampling_params=LONG)
    wait_until(lambda: running(url) == 1)
    assert http_json("POST", f"{url}/pause_generation", {"mode": "in_place"})[0] == 200
    time.sleep(0.3)
    assert not inflight.done() and running(url) == 1
    assert http_json("POST", f"{url}/flush_cache")[0] == 400
    http_json("POST", f"{url}/continue_generation", {})
    body = inflight.result(timeout=30)[1]
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 240}
    assert http_json("GET", f"{url}/flush_cache")[0] == 200


def save_perturbed(source: Path, target: Path) -> Path:
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    torch.manual_seed(3)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.5)
    model.save_pretrained(target)
    return target


def test_update_weights_from_disk_changes_outputs_and_version(
    url: str, tiny_lm_dir: Path, tmp_path: Path
) -> None:
    before = generate(url, sampling_params=GREEDY, return_logprob=True)[1]
    new_dir = save_perturbed(tiny_lm_dir, tmp_path / "step1")
    status, body = http_json(
        "POST", f"{url}/update_weights_from_disk",
        {"model_path": str(new_dir), "weight_version": "1"},
    )  # fmt: skip
    assert status == 200 and body["success"] and body["num_paused_requests"] == 0
    after = generate(url, sampling_params=GREEDY, return_logprob=True)[1]
    assert after["meta_info"]["weight_version"] == "1"
    assert (
        after["meta_info"]["output_token_logprobs"] != before["meta_info"]["output_token_logprobs"]
    )
    assert http_json("GET", f"{url}/get_weight_version")[1] == {"weight_version": "1"}
    http_json("POST", f"{url}/update_weights_from_disk", {"model_path": str(tiny_lm_dir)})
    restored = generate(url, sampling_params=GREEDY, return_logprob=True)[1]
    assert restored["output_ids"] == before["output_ids"]
    assert restored["meta_info"]["weight_version"] == "1"  # no new version given


def test_update_weights_from_a_bad_folder_fails_cleanly(url: str, tmp_path: Path) -> None:
    status, body = http_json(
        "POST", f"{url}/update_weights_from_disk", {"model_path": str(tmp_path)}
    )
    assert status == 400 and body["success"] is False and "safetensors" in body["message"]
    assert generate(url, sampling_params=GREEDY)[0] == 200


def test_release_and_resume_weights(url: str) -> None:
    before = generate(url, sampling_params=GREEDY)[1]["output_ids"]
    assert http_json("POST", f"{url}/release_memory_occupation", {"tags": ["weights"]}) == (
        200,
        None,
    )
    status, body = generate(url, sampling_params=GREEDY)
    assert status == 503 and "resume_memory_occupation" in body["detail"]
    assert http_json("POST", f"{url}/resume_memory_occupation", {"tags": ["weights"]})[0] == 200
    assert generate(url, sampling_params=GREEDY)[1]["output_ids"] == before


def test_info_and_load_endpoints(url: str, tiny_lm_dir: Path) -> None:
    for path in ("/model_info", "/get_model_info"):
        info = http_json("GET", url + path)[1]
        assert info["model_path"] == str(tiny_lm_dir) and info["is_generation"] is True
        assert info["architectures"] == ["Qwen3ForCausalLM"]
    for path in ("/server_info", "/get_server_info"):
        assert "internal_states" in http_json("GET", url + path)[1]
    load = http_json("GET", f"{url}/get_load")[1]
    assert load == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]
    assert http_json("GET", f"{url}/v1/loads?include=core")[1]["loads"][0]["num_running_reqs"] == 0
    assert http_json("GET", f"{url}/v1/models")[1]["data"][0]["id"] == str(tiny_lm_dir)
    assert http_json("GET", f"{url}/health_generate")[0] == 200
    status, body = http_json("POST", f"{url}/update_weight_version", {"new_version": "v9"})
    assert status == 200 and body["new_version"] == "v9"
    assert http_json("GET", f"{url}/get_weight_version")[1] == {"weight_version": "v9"}


def test_health_is_503_until_the_model_is_loaded(tiny_lm_dir: Path) -> None:
    async def scenario() -> None:
        server = EngineServer(EngineSettings(model_path=str(tiny_lm_dir), num_threads=1))
        async with TestClient(TestServer(server.app())) as client:
            assert (await client.get("/health")).status == 503
            assert (await client.post("/generate", json={"input_ids": [1]})).status == 503
            await server.load()
            assert (await client.get("/health")).status == 200
        assert server.engine is not None
        server.engine.shutdown()

    threads = torch.get_num_threads()
    asyncio.run(scenario())
    torch.set_num_threads(threads)


def test_the_routers_http2_preface_is_one_line_and_other_errors_keep_their_traceback() -> None:
    def record(error: Exception) -> logging.LogRecord:
        try:
            raise error
        except Exception:
            return logging.LogRecord(
                "aiohttp.server", logging.ERROR, "", 0, "Error handling request", (), sys.exc_info()
            )

    probe = record(BadHttpMessage("Pause on PRI/Upgrade:\n\n    b''"))
    assert quiet_http2_probe(probe)
    assert probe.levelno == logging.INFO and probe.exc_info is None
    assert "HTTP/2 preface" in probe.getMessage()
    other = record(BadHttpMessage("Invalid method encountered"))
    assert quiet_http2_probe(other)
    assert other.levelno == logging.ERROR and other.exc_info is not None


def test_a_server_started_with_a_key_answers_only_requests_that_carry_it(
    tiny_lm_dir: Path,
) -> None:
    threads = torch.get_num_threads()
    server = BackgroundServer(
        EngineSettings(model_path=str(tiny_lm_dir), num_threads=1), key="this-launch"
    )
    keyed = server.start()
    ours = {"Authorization": "Bearer this-launch"}
    other = {"Authorization": "Bearer another-launch"}
    body = {"input_ids": PROMPT, "sampling_params": GREEDY}
    try:
        for headers in ({}, other, {"Authorization": "this-launch"}):
            assert http_json("POST", f"{keyed}/generate", body, 60, headers)[0] == 401
            assert http_json("POST", f"{keyed}/pause_generation", {}, 10, headers)[0] == 401
            assert http_json("GET", f"{keyed}/health_generate", None, 10, headers)[0] == 401
            weights = {"model_path": str(tiny_lm_dir)}
            assert (
                http_json("POST", f"{keyed}/update_weights_from_disk", weights, 10, headers)[0]
                == 401
            )
        # Another launch's health check sends its own key: it fails, as everything does.
        assert http_json("GET", f"{keyed}/health", None, 10, other)[0] == 401
        # A bare /health (how the router probes a worker it registers) learns only liveness.
        assert http_json("GET", f"{keyed}/health")[0] == 200
        status, answer = http_json("POST", f"{keyed}/generate", body, 60, ours)
        assert status == 200 and len(answer["output_ids"]) == GREEDY["max_new_tokens"]
        assert http_json("GET", f"{keyed}/health_generate", None, 30, ours)[0] == 200
        assert server.server.engine is not None and server.server.engine.scheduler.is_idle
    finally:
        server.stop()
        torch.set_num_threads(threads)


def test_an_engine_stopped_from_outside_answers_its_requests_503(
    tiny_lm_dir: Path, pool: ThreadPoolExecutor
) -> None:
    """Stopped from outside (SIGTERM sets serve's stop event), the engine answers what it is
    running or holding as SGLang answers an abort carrying status_code 503: HTTP 503 with a
    "detail", which the router re-sends to another engine. A 200 abort would read as the
    engine refusing the request on its own, and stop the run."""
    threads = torch.get_num_threads()
    loop, stop, port = asyncio.new_event_loop(), asyncio.Event(), free_port()
    url = f"http://127.0.0.1:{port}"
    settings = EngineSettings(model_path=str(tiny_lm_dir), num_threads=1)
    serving = pool.submit(loop.run_until_complete, serve(settings, "127.0.0.1", port, stop))
    try:
        wait_until(lambda: answers(f"{url}/health") == 200, timeout_s=60)
        inflight = pool.submit(generate, url, sampling_params=LONG, return_logprob=True)
        wait_until(lambda: running(url) == 1)
        # paused in place: the running row is held between two steps, a new request waits
        assert http_json("POST", f"{url}/pause_generation", {"mode": "in_place"})[0] == 200
        held = pool.submit(generate, url, sampling_params=GREEDY)
        time.sleep(0.3)
        assert not inflight.done() and not held.done()
    finally:
        loop.call_soon_threadsafe(stop.set)
        serving.result(timeout=90)
        loop.close()
        torch.set_num_threads(threads)
    assert inflight.result(timeout=10) == (503, SHUTTING_DOWN)
    assert held.result(timeout=10) == (503, SHUTTING_DOWN)


def test_a_server_shutting_down_answers_503_to_requests_and_health_checks(
    tiny_lm_dir: Path,
) -> None:
    async def scenario() -> None:
        server = EngineServer(EngineSettings(model_path=str(tiny_lm_dir), num_threads=1))
        async with TestClient(TestServer(server.app())) as client:
            await server.load()
            assert (await client.get("/health")).status == 200
            await server.shut_down()
            later = await client.post("/generate", json={"input_ids": PROMPT})
            assert later.status == 503 and await later.json() == SHUTTING_DOWN
            assert (await client.get("/health")).status == 503
            assert (await client.get("/health_generate")).status == 503

    threads = torch.get_num_threads()
    asyncio.run(scenario())
    torch.set_num_threads(threads)
