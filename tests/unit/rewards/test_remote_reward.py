import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from rlpost.rewards import RemoteRewardError, compute_rewards
from rlpost.runtime.metrics import reward_extra_means
from rlpost.schema import RewardConfig
from rlpost.types import Sample

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def sample(text: str) -> Sample:
    return Sample(
        group_index=0,
        index=0,
        prompt=[{"role": "user", "content": "What is 30+4?"}],
        prompt_ids=[1],
        label="34",
        metadata={"source": "unit"},
        response_text=text,
    )


async def score_with_server(handler: Handler, samples: list[Sample], **config: Any) -> list[float]:
    app = web.Application()
    app.router.add_post("/score", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        reward = RewardConfig(type="remote", remote_url=f"http://{host}:{port}/score", **config)
        return await compute_rewards(samples, reward)
    finally:
        await runner.cleanup()


def test_posts_each_sample_and_reads_the_reward() -> None:
    seen: list[dict[str, Any]] = []

    async def handler(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        score = 1.0 if "34" in body["response"] else 0.0
        return web.json_response({"reward": score} if len(seen) % 2 else score)

    out = asyncio.run(score_with_server(handler, [sample("it is 34"), sample("it is 35")]))
    assert sorted(out) == [0.0, 1.0]
    assert out[0] == 1.0
    assert seen[0]["prompt"] == [{"role": "user", "content": "What is 30+4?"}]
    assert seen[0]["label"] == "34"
    assert seen[0]["metadata"] == {"source": "unit"}


def test_retries_server_errors_then_succeeds() -> None:
    calls = 0

    async def flaky(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        if calls <= 2:
            return web.Response(status=503, text="warming up")
        return web.json_response({"score": 0.25})

    out = asyncio.run(score_with_server(flaky, [sample("x")], max_retries=2))
    assert out == [0.25]
    assert calls == 3


def test_gives_up_after_max_retries_with_the_last_problem() -> None:
    calls = 0

    async def down(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        return web.Response(status=500)

    with pytest.raises(RemoteRewardError, match=r"failed 2 attempts.*HTTP 500"):
        asyncio.run(score_with_server(down, [sample("x")], max_retries=1))
    assert calls == 2


def test_slow_server_times_out_per_attempt() -> None:
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(1.0)  # the runner waits for it on cleanup: keep it short
        return web.json_response(1.0)

    with pytest.raises(RemoteRewardError, match="TimeoutError"):
        asyncio.run(score_with_server(slow, [sample("x")], timeout_s=0.2, max_retries=1))


def test_client_errors_are_not_retried() -> None:
    calls = 0

    async def reject(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        return web.Response(status=422, text="missing field 'response'")

    with pytest.raises(RemoteRewardError, match=r"HTTP 422.*missing field"):
        asyncio.run(score_with_server(reject, [sample("x")], max_retries=3))
    assert calls == 1


def test_what_an_answers_object_holds_beside_the_reward_goes_with_the_sample() -> None:
    """The object's "reward" (else its "score") is the reward; its other keys are the
    sample's reward_extra, averaged as a verl-shaped function's are. A number keeps none."""

    async def handler(request: web.Request) -> web.Response:
        text = (await request.json())["response"]
        if text == "plain":
            return web.json_response(0.5)
        right = "34" in text
        if text.startswith("scored"):
            return web.json_response({"score": 0.25, "acc": right, "pred": text})
        return web.json_response(
            {"reward": float(right), "score": 0.9, "acc": right, "format": 1, "pred": text}
        )

    batch = [sample("it is 34"), sample("it is 35"), sample("scored 34"), sample("plain")]
    assert asyncio.run(score_with_server(handler, batch)) == [1.0, 0.0, 0.25, 0.5]
    assert [s.reward_extra for s in batch] == [
        {"score": 0.9, "acc": True, "format": 1, "pred": "it is 34"},
        {"score": 0.9, "acc": False, "format": 1, "pred": "it is 35"},
        {"acc": True, "pred": "scored 34"},
        None,
    ]
    assert reward_extra_means(batch, "rollout") == {
        "rollout/reward_extra/acc": 2 / 3,
        "rollout/reward_extra/format": 1.0,
        "rollout/reward_extra/score": 0.9,
    }


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ({"verdict": "good"}, "returned a dict without a 'reward' or 'score' for sample "
         "group_index=0, index=0: {'verdict': 'good'}; a dict holds the reward as a 'reward' "
         "or 'score' and other numbers beside it, logged as rollout/reward_extra/<key>: "
         "return {'reward': <number>, ...}, or the reward alone as a number"),
        ({"reward": "high", "acc": 1}, "returned {'reward': 'high', 'acc': 1} for sample "
         "group_index=0, index=0: its 'reward' ('high') is not a number"),
        ("high", "returned 'high' for sample group_index=0, index=0; expected a finite "
         'number or {"reward": <number>, ...}'),
        ([1.0], "returned [1.0] for sample group_index=0, index=0; expected a finite number"),
    ],
)  # fmt: skip
def test_a_malformed_answer_is_refused_naming_the_server_and_the_sample(
    answer: object, said: str
) -> None:
    async def odd(request: web.Request) -> web.Response:
        return web.json_response(answer)

    with pytest.raises(RemoteRewardError) as info:
        asyncio.run(score_with_server(odd, [sample("x")]))
    message = str(info.value)
    assert message.startswith("reward server http://127.0.0.1:")
    assert f"/score {said}" in message
