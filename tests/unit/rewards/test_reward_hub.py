import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from rlpost.rewards import (
    REWARD_TYPES,
    RewardError,
    compute_rewards,
    grading_pool,
)
from rlpost.runtime.metrics import reward_extra_means
from rlpost.schema import RewardConfig
from rlpost.types import Sample


def sample(text: str, label: str | None = "34", group: int = 0, **metadata: Any) -> Sample:
    return Sample(
        group_index=group,
        index=0,
        prompt="What is 30+4?",
        prompt_ids=[1, 2, 3],
        label=label,
        metadata=dict(metadata),
        response_text=text,
    )


def rewards(samples: list[Sample], **config: Any) -> list[float]:
    return asyncio.run(compute_rewards(samples, RewardConfig(**config)))


def test_every_documented_reward_type_is_registered() -> None:
    assert {"math", "deepscaler", "dapo", "f1", "gpqa", "remote"} <= set(REWARD_TYPES)


def test_rule_based_types_grade_each_sample_in_order() -> None:
    texts = ["\\boxed{34}", "\\boxed{35}", "<think>\\boxed{1}</think>\\boxed{34}", "34"]
    assert rewards([sample(t) for t in texts], type="math") == [1.0, 0.0, 1.0, 0.0]
    assert rewards([sample(t) for t in texts], type="deepscaler") == [0.0, 0.0, 1.0, 0.0]
    dapo = [sample("x\nAnswer: 34"), sample("x\nAnswer: 33"), sample("no answer")]
    assert rewards(dapo, type="dapo") == [1.0, -1.0, -1.0]
    assert rewards([sample("thirty four", label="thirty four")], type="f1") == [1.0]
    assert rewards([], type="math") == []


def test_boxed_types_grade_the_last_boxed_answer_alone() -> None:
    """slime's boxed_ types: the grader reads only what the last \\boxed{} holds (braces
    nest), so the reasoning before it neither adds nor takes away; no box pays nothing."""
    label = "the Eiffel tower"
    texts = [
        "It is not the Louvre. \\boxed{the Eiffel tower}",  # the box alone is graded
        "The Eiffel tower, I think",  # no box
        "\\boxed{Louvre} then \\boxed{the {Eiffel} tower}",  # the last box, braces nested
        "\\boxed{the Eiffel tower",  # cut off inside its box
    ]
    boxed = rewards([sample(t, label=label) for t in texts], type="boxed_f1")
    assert boxed == [1.0, 0.0, 1.0, 0.0]
    plain = rewards([sample(t, label=label) for t in texts[:2]], type="f1")
    assert 0.0 < plain[0] < 1.0 and plain[1] > 0.0  # f1 grades the whole response
    # the end-of-turn token the engine wrote is not part of the answer (Sample.answer_text)
    ended = sample("\\boxed{the Eiffel tower}<|im_end|>", label=label)
    ended.end_text = "<|im_end|>"
    assert rewards([ended], type="boxed_f1") == [1.0]
    choices = {"choices": ["Paris", "Rome", "Oslo", "Bern"]}
    graded = [
        sample("A is tempting, but \\boxed{C}", label="C", **choices),
        sample("The answer is C.", label="C", **choices),  # no box
        sample("C is tempting, but \\boxed{A}", label="C", **choices),
    ]
    assert rewards(graded, type="boxed_gpqa") == [1.0, 0.0, 0.0]
    assert rewards([sample("\\boxed{34}", rm_type="boxed_f1")], type="math") == [1.0]
    with pytest.raises(RewardError, match="reward type 'boxed_f1' compares responses with"):
        rewards([sample("\\boxed{34}", label=None)], type="boxed_f1")


def test_random_pays_a_coin_flip_each_sample_keeps_under_a_seed() -> None:
    """slime's random: 0 or 1 at even odds, whatever the response and with no label. With
    the run's seed (run.deterministic) a sample's draw is fixed by the seed and the sample,
    whatever the batch or order it is scored in (a resumed run scores it the same)."""
    batch = [
        Sample(group_index=i // 4, index=i, prompt="p", prompt_ids=[7, i % 4],
               response_ids=[i, 3], response_text=f"r{i}")
        for i in range(64)
    ]  # fmt: skip
    config = RewardConfig(type="random")
    unseeded = asyncio.run(compute_rewards(batch, config))
    assert set(unseeded) == {0.0, 1.0}
    seeded = asyncio.run(compute_rewards(batch, config, seed=1234))
    assert set(seeded) == {0.0, 1.0} and 16 < sum(seeded) < 48
    halves = [
        asyncio.run(compute_rewards(part, config, seed=1234)) for part in (batch[32:], batch[:32])
    ]
    assert halves[1] + halves[0] == seeded
    assert list(reversed(asyncio.run(compute_rewards(batch[::-1], config, seed=1234)))) == seeded
    assert asyncio.run(compute_rewards(batch, config, seed=1235)) != seeded
    assert rewards([sample("anything", label=None, rm_type="random")], type="math")[0] in (0, 1)


def test_per_sample_rm_type_overrides_the_configured_type() -> None:
    batch = [
        sample("\\boxed{34}"),
        sample("\\boxed{34}", rm_type="deepscaler"),
        sample("Answer: 34", rm_type="dapo"),
    ]
    assert rewards(batch, type="math") == [1.0, 0.0, 1.0]


def test_unknown_type_names_the_source_and_a_close_match() -> None:
    with pytest.raises(RewardError, match=r"from metadata\['rm_type'\].*Did you mean 'deepscaler'"):
        rewards([sample("\\boxed{34}", rm_type="deepscalr")], type="math")


def test_a_registered_type_returning_a_dict_is_refused_naming_verls_shape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A registered type returns a number: a dict it returns stops the run, where float()
    failed on it, and says how to log more beside a reward."""

    async def graded(sample: Sample, ctx: Any) -> Any:
        return {"score": 1.0, "acc": 1}

    monkeypatch.setitem(REWARD_TYPES, "graded_with_extras", graded)
    with pytest.raises(RewardError) as info:
        rewards([sample("34", rm_type="graded_with_extras")])
    message = str(info.value)
    assert (
        "reward type 'graded_with_extras' returned a dict (['acc', 'score']) for sample "
        "group_index=0, index=0; a registered type returns its reward as a number" in message
    )
    assert "def fn(data_source, solution_str, ground_truth, extra_info=None)" in message


def test_a_missing_label_is_a_clear_error() -> None:
    with pytest.raises(RewardError, match=r"data\.label_key"):
        rewards([sample("\\boxed{34}", label=None)], type="math")


def test_custom_sync_function_runs_off_the_event_loop_thread(hook_modules: Path) -> None:
    import rlpost_test_hooks

    rlpost_test_hooks.CALL_THREADS.clear()
    out = rewards(
        [sample("abc"), sample("abcdef")], custom_function="rlpost_test_hooks.length_reward"
    )
    assert out == [3.0, 6.0]
    assert rlpost_test_hooks.CALL_THREADS
    assert threading.main_thread().name not in rlpost_test_hooks.CALL_THREADS


def test_a_custom_function_scores_before_a_lines_rm_type(hook_modules: Path) -> None:
    """slime's order: --custom-rm-path scores every sample, a line's rm_type included (the
    function may read it from the metadata); without one the line's rm_type grades it."""
    batch = [sample("\\boxed{34}", rm_type="math"), sample("abc")]
    assert rewards(batch, custom_function="rlpost_test_hooks.length_reward") == [10.0, 3.0]
    assert rewards(batch, type="f1") == [1.0, 0.0]


def test_custom_async_function(hook_modules: Path) -> None:
    out = rewards(
        [sample("it is 34"), sample("it is 43")],
        custom_function="rlpost_test_hooks.async_contains_label",
    )
    assert out == [1.0, 0.0]


def test_group_function_scores_each_group_and_keeps_order(hook_modules: Path) -> None:
    batch = [
        sample("a", group=0),
        sample("bbb", group=1),
        sample("cc", group=0),
        sample("b", group=1),
    ]
    out = rewards(batch, custom_function="rlpost_test_hooks.rank_in_group", group=True)
    assert out == [0.0, 1.0, 1.0, 0.0]


def test_a_group_functions_dicts_are_scored_by_their_score_and_the_rest_logged(
    hook_modules: Path,
) -> None:
    """A dict per sample, as verl's batch reward functions return: its "score" is the
    reward, its other keys the sample's reward_extra, averaged as the verl path's are."""
    batch = [sample("a", group=0), sample("bbb", group=1), sample("cc", group=0)]
    out = rewards(batch, custom_function="rlpost_test_hooks.ranked_group_with_extras", group=True)
    assert out == [0.0, 1.0, 1.0]
    assert [s.reward_extra for s in batch] == [
        {"acc": False, "length": 1, "pred": "a"},
        {"acc": True, "length": 3, "pred": "bbb"},
        {"acc": True, "length": 2, "pred": "cc"},
    ]
    assert reward_extra_means(batch, "rollout") == {
        "rollout/reward_extra/acc": 2 / 3,
        "rollout/reward_extra/length": 2.0,
    }
    numbers = [sample("a"), sample("bb")]
    rewards(numbers, custom_function="rlpost_test_hooks.rank_in_group", group=True)
    assert [s.reward_extra for s in numbers] == [None, None]


@pytest.mark.parametrize(
    ("hook", "said"),
    [
        (
            "wrong_length_group",
            ["returned 1 rewards for 2 samples ([1.0]; the first is sample group_index=0, "
             "index=0)", "one reward per sample, in the samples' order"],
        ),
        (
            "group_dicts_with_reward_key",
            ["returned a dict without a 'score' for sample group_index=0, index=0: "
             "{'reward': 1.0, 'acc': 1}", "return {'score': <number>, ...}"],
        ),
        (
            "group_numbers_and_dicts",
            ["returned numbers for some samples and dicts for others ([1.0, {'score': 0.0, "
             "'acc': 0}]: a number for sample group_index=0, index=0, a dict for sample "
             "group_index=0, index=1)", "a dict with a 'score' for every sample, or a number"],
        ),
        (
            "group_dict_with_text_score",
            ["returned {'score': 'high'} for sample group_index=0, index=0: its 'score' "
             "('high') is not a number"],
        ),
    ],
)  # fmt: skip
def test_a_group_functions_malformed_answer_is_refused_naming_it_and_the_fix(
    hook_modules: Path, hook: str, said: list[str]
) -> None:
    batch = [sample("a"), sample("b")]
    batch[1].index = 1
    with pytest.raises(RewardError) as info:
        rewards(batch, custom_function=f"rlpost_test_hooks.{hook}", group=True)
    message = str(info.value)
    assert f"group reward function 'rlpost_test_hooks.{hook}' returned" in message
    for part in said:
        assert part in message


@pytest.mark.parametrize("hook", ["sleepy_reward", "async_sleepy_reward"])
def test_custom_function_past_the_timeout_scores_zero(hook_modules: Path, hook: str) -> None:
    start = time.perf_counter()
    out = rewards([sample("x")], custom_function=f"rlpost_test_hooks.{hook}", timeout_s=0.3)
    assert out == [0.0]
    assert time.perf_counter() - start < 4.0  # the function sleeps 6 s


@pytest.mark.parametrize(
    ("hook", "message"),
    [
        ("text_reward", "returned 'high'; expected a number"),
        ("failing_reward", "raised KeyError: 'score'"),
        ("tensor_reward", r"returned Tensor tensor\(\[0.2500, 0.7500\]\) for sample group_index=3"),
    ],
)
def test_bad_custom_function_results_name_the_hook_and_the_sample(
    hook_modules: Path, hook: str, message: str
) -> None:
    with pytest.raises(RewardError, match=message) as info:
        rewards([sample("x", group=3)], custom_function=f"rlpost_test_hooks.{hook}")
    assert f"rlpost_test_hooks.{hook}" in str(info.value)
    assert "sample group_index=3, index=0" in str(info.value)


def test_a_numpy_number_is_a_reward(hook_modules: Path) -> None:
    assert rewards([sample("x")], custom_function="rlpost_test_hooks.numpy_reward") == [0.5]


def test_a_runaway_grader_is_killed_without_freezing_the_event_loop() -> None:
    async def main() -> tuple[list[float], float]:
        gaps: list[float] = []

        async def tick() -> None:
            last = time.perf_counter()
            while True:
                await asyncio.sleep(0.02)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        batch = [sample("\\boxed{9^{9^{9^{9}}}}"), sample("\\boxed{34}"), sample("\\boxed{3}")]
        await compute_rewards(batch[1:], RewardConfig(type="math"))  # workers started
        ticker = asyncio.create_task(tick())
        out = await compute_rewards(batch, RewardConfig(type="math", timeout_s=1.0))
        ticker.cancel()
        return out, max(gaps)

    restarts = grading_pool().restarts
    out, worst_gap_s = asyncio.run(main())
    assert out == [0.0, 1.0, 0.0]
    assert grading_pool().restarts == restarts + 1
    assert worst_gap_s < 0.9  # a loop the grader held would wait its whole 1.0-s timeout


def test_a_grading_worker_killed_while_it_starts_is_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SIGKILLed before it is ready (the OOM killer, a chaos run): the sample is graded by
    the next worker, not failed."""
    import os
    import signal

    from rlpost.rewards import pool

    class KilledAtStart(pool.GraderProcess):
        def _read(self) -> dict[str, Any]:
            os.kill(self.process.pid, signal.SIGKILL)
            monkeypatch.setattr(pool, "GraderProcess", original)  # the next one starts fine
            return super()._read()

    original = pool.GraderProcess
    fresh = pool.GradingPool(max_workers=1)
    monkeypatch.setattr(pool, "GraderProcess", KilledAtStart)
    try:
        assert asyncio.run(fresh.run("math", "\\boxed{34}", "34", timeout_s=30)) == 1.0
    finally:
        fresh.shutdown()


CTRL_C_DRIVER = """
import signal
from rlpost.rewards.pool import GraderProcess

worker = GraderProcess()
try:  # a Ctrl-C as soon as "ready" is read lands inside the try
    print("ready", flush=True)
    signal.pause()
except KeyboardInterrupt:
    worker.close()
    print("worker exit status", worker.process.returncode, flush=True)
"""


def ctrl_c_at_its_default() -> None:
    """In a child before it starts: Ctrl-C at its default, as a terminal's command has it,
    whether or not these tests were started with it ignored (in the background, under
    nohup), which the child would inherit."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_reaches_the_launch_not_its_grading_workers(tmp_path: Path) -> None:
    """The terminal sends Ctrl-C to the whole foreground process group: the launch handles it
    (and ends its pool), where a worker printed a traceback of its own and died."""
    import os
    import signal
    import subprocess
    import sys

    launch = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_DRIVER],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_at_its_default,
        start_new_session=True,  # a process group of its own, as a terminal's command has
    )
    assert launch.stdout is not None
    assert launch.stdout.readline() == "ready\n"
    os.killpg(launch.pid, signal.SIGINT)
    out, err = launch.communicate(timeout=60)
    assert "Traceback" not in err, err
    assert out == "worker exit status 0\n"


def test_a_grading_worker_killed_in_its_job_or_idle_is_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SIGKILLed from outside (the OOM killer, a chaos run) as a job is handed to it, then
    while it waits between jobs: each sample is graded by a new worker, not failed."""
    import os
    import signal

    from rlpost.rewards import pool

    class KilledInItsJob(pool.GraderProcess):
        def call(self, request: dict[str, Any]) -> dict[str, Any]:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
            monkeypatch.setattr(pool, "GraderProcess", original)  # the next one lives
            return super().call(request)

    original = pool.GraderProcess
    fresh = pool.GradingPool(max_workers=1)
    monkeypatch.setattr(pool, "GraderProcess", KilledInItsJob)
    try:
        assert asyncio.run(fresh.run("math", "\\boxed{34}", "34", timeout_s=30)) == 1.0
        assert fresh.restarts == 1
        (idle,) = fresh._idle
        os.kill(idle.process.pid, signal.SIGKILL)
        idle.process.wait()
        assert asyncio.run(fresh.run("math", "\\boxed{35}", "34", timeout_s=30)) == 0.0
        assert fresh._idle and fresh._idle[0] is not idle and fresh._idle[0].alive()
    finally:
        fresh.shutdown()


def test_rewards_from_a_loop_in_another_thread() -> None:
    results: list[list[float]] = []
    worker = threading.Thread(target=lambda: results.append(rewards([sample("\\boxed{34}")])))
    worker.start()
    worker.join()
    assert results == [[1.0]]


def test_the_schema_knows_every_registered_reward_type() -> None:
    from rlpost.schema.reward import RewardType

    # "model" is scored by reward.model's class on batches, not by a per-sample function
    assert set(RewardType.__args__) - {"model"} == set(REWARD_TYPES)


def test_the_schema_refuses_what_scoring_would_fail_on() -> None:
    with pytest.raises(ValidationError, match="'math'"):
        RewardConfig(type="mathh")
    with pytest.raises(ValidationError, match="remote_url is not set"):
        RewardConfig(type="remote")
    with pytest.raises(ValidationError, match="custom_function is not set"):
        RewardConfig(group=True)
    with pytest.raises(ValidationError, match="not an http"):
        RewardConfig(type="remote", remote_url="127.0.0.1:1/score")
    with pytest.raises(ValidationError, match=r"user:\*\*\*@"):
        RewardConfig(type="remote", remote_url="ftp://user:secret@host/score")


def test_the_reward_servers_url_is_read_by_remote_training_or_a_remote_evaluation_set() -> None:
    """remote_url serves reward type 'remote' and every evaluation set graded 'remote': math
    training with a remote benchmark takes it, and a URL neither posts to is refused."""
    from rlpost.config.loader import compose_run_config
    from rlpost.errors import UserError

    url = "recipe.rollout.reward.remote_url=http://127.0.0.1:1/score"
    remote_set = "recipe.eval.datasets=[{name: chat, path: /chat.jsonl, reward_type: remote}]"
    cfg, _ = compose_run_config([url, "recipe.rollout.reward.max_retries=5", remote_set])
    assert cfg.recipe.rollout.reward.type == "math"  # type: ignore[attr-defined]
    with pytest.raises(UserError) as refused:
        compose_run_config([remote_set])
    assert [i.key for i in refused.value.issues] == ["recipe.eval.datasets.0.reward_type"]
    assert "rollout.reward.remote_url is not set" in str(refused.value)
    with pytest.raises(UserError) as refused:
        compose_run_config([url])
    assert [i.key for i in refused.value.issues] == ["recipe.rollout.reward.remote_url"]
    assert "has no effect" in str(refused.value)


def test_multiple_choice_grades_the_letter_and_names_a_label_it_cannot_read() -> None:
    options = {"choices": ["London", "Paris", "Rome", "Oslo"]}
    graded = [
        sample("The answer is (B).", label="Paris", **options),
        sample("Answer: C", label="Paris", **options),
        sample("\\boxed{A}", label="0"),
    ]
    assert rewards(graded, type="gpqa") == [1.0, 0.0, 1.0]
    with pytest.raises(RewardError, match="names no option"):
        rewards([sample("(A)", label="Madrid", group=3, **options)], type="gpqa")


def test_stop_strings_are_judged_against_the_graders_the_run_uses(hook_modules: Path) -> None:
    """A stop string is refused only beside a grader whose marker it overlaps: a grader
    that needs nothing written (f1), or a custom function scoring in the rollout type's
    place, leaves it alone; an evaluation set's own grader counts."""
    from rlpost.config.loader import compose_run_config
    from rlpost.errors import UserError

    stop = 'recipe.rollout.stop=["Answer:"]'
    for accepted in (
        [stop],  # math reads \boxed, not Answer:
        [stop, "recipe.rollout.reward.type=f1"],
        ['recipe.rollout.stop=["</answer>"]', "recipe.rollout.reward.type=dapo"],
        [
            stop,
            "recipe.rollout.reward.type=dapo",
            "recipe.rollout.reward.custom_function=rlpost_test_hooks.length_reward",
        ],
    ):
        compose_run_config(accepted)
    graded = compose_run_config(["recipe.eval.datasets.0.reward_type=dapo"])[0]
    assert graded.recipe.rule_graders() == [  # type: ignore[attr-defined]
        ("rollout.reward.type", "math"),
        ("eval.datasets.0.reward_type", "dapo"),
    ]
    with pytest.raises(UserError) as refused:
        compose_run_config([stop, "recipe.eval.datasets.0.reward_type=dapo"])
    assert [i.key for i in refused.value.issues] == ["recipe.rollout.stop"]
    assert "eval.datasets.0.reward_type=dapo grades the answer" in str(refused.value)


def test_a_verl_shaped_function_scores_samples_as_verl_calls_it(hook_modules: Path) -> None:
    """verl's compute_score(data_source, solution_str, ground_truth, extra_info=None) is
    called by keyword with the row's data_source, the response alone (without the special
    token that ended it: verl decodes with skip_special_tokens), the label and the
    metadata; a number it returns is the reward."""
    import rlpost_test_hooks

    rlpost_test_hooks.VERL_CALLS.clear()
    right = sample("34<|im_end|>", data_source="openai/gsm8k", split="train")
    right.end_text = "<|im_end|>"
    batch = [right, sample("35"), sample("34", label=None)]
    out = rewards(batch, custom_function="rlpost_test_hooks.verl_exact_match")
    assert out == [1.0, 0.0, 0.0]
    calls = {(c["solution_str"], c["ground_truth"]): c for c in rlpost_test_hooks.VERL_CALLS}
    assert calls["34", "34"] == {
        "data_source": "openai/gsm8k",
        "solution_str": "34",
        "ground_truth": "34",
        "extra_info": {"data_source": "openai/gsm8k", "split": "train"},
    }
    assert calls["35", "34"]["data_source"] is None and calls["35", "34"]["extra_info"] == {}
    assert ("34", None) in calls
    assert right.metadata == {"data_source": "openai/gsm8k", "split": "train"}  # a copy


def test_a_verl_shaped_dict_is_scored_by_its_score(hook_modules: Path) -> None:
    """Without extra_info in its parameters it is called without one; a dict's "score" is
    the reward, and a dict without one is refused naming the function."""
    import rlpost_test_hooks

    rlpost_test_hooks.VERL_CALLS.clear()
    batch = [sample("so \\boxed{34}", data_source="math"), sample("33")]
    assert rewards(batch, custom_function="rlpost_test_hooks.verl_scored_dict") == [1.0, -1.0]
    assert {"data_source": "math", "solution_str": "so \\boxed{34}"} in rlpost_test_hooks.VERL_CALLS
    with pytest.raises(RewardError, match="returned a dict without a 'score'") as info:
        rewards([sample("x")], custom_function="rlpost_test_hooks.verl_dict_without_score")
    assert "rlpost_test_hooks.verl_dict_without_score" in str(info.value)


def test_what_a_verl_shaped_dict_holds_beside_its_score_goes_with_the_sample(
    hook_modules: Path,
) -> None:
    """The dict's other keys are kept in sample.reward_extra, as JSON holds them and the same
    for the same value: a NumPy number as Python's, a number that is not finite as None; a
    number or a timeout keeps nothing, and neither does a function of rlpost's shape."""
    batch = [sample("34", difficulty=2), sample("35")]
    out = rewards(batch, custom_function="rlpost_test_hooks.verl_with_extras")
    assert out == [1.0, -1.0]
    assert batch[0].reward_extra == {
        "acc": True, "pred": "34", "format_ok": 1, "length": 2, "reward_mean": 5.0,
        "margin": 0.5, "difficulty": 2,
    }  # fmt: skip
    assert batch[1].reward_extra == {
        "acc": False, "pred": "35", "format_ok": 1, "length": 2, "reward_mean": 5.0,
        "margin": None,
    }  # fmt: skip
    assert type(batch[0].reward_extra["length"]) is int
    assert "score" not in batch[0].reward_extra
    plain = [sample("34")]
    rewards(plain, custom_function="rlpost_test_hooks.verl_exact_match")
    slow = [sample("x")]
    rewards(slow, custom_function="rlpost_test_hooks.verl_sleepy_score", timeout_s=0.2)
    own = [sample("34")]
    rewards(own, custom_function="rlpost_test_hooks.quarter_reward")
    assert plain[0].reward_extra is slow[0].reward_extra is own[0].reward_extra is None


def test_a_dict_from_a_function_of_rlposts_shape_stops_the_run_naming_verls(
    hook_modules: Path,
) -> None:
    """fn(sample) returns a number; a dict it returns is refused naming the function, and
    verl's shape, whose dict's "score" is read."""
    with pytest.raises(RewardError) as info:
        rewards([sample("x")], custom_function="rlpost_test_hooks.slime_shape_dict")
    message = str(info.value)
    assert "'rlpost_test_hooks.slime_shape_dict' returned a dict (['acc', 'score'])" in message
    assert "def fn(data_source, solution_str, ground_truth, extra_info=None)" in message


def test_a_verl_shaped_function_async_or_past_the_timeout(hook_modules: Path) -> None:
    import rlpost_test_hooks

    rlpost_test_hooks.VERL_CALLS.clear()
    out = rewards(
        [sample("abc", data_source="d")], custom_function="rlpost_test_hooks.async_verl_score"
    )
    assert out == [3.0]
    assert rlpost_test_hooks.VERL_CALLS == [
        {"data_source": "d", "extra_info": {"data_source": "d"}}
    ]
    start = time.perf_counter()
    slow = rewards(
        [sample("x")], custom_function="rlpost_test_hooks.verl_sleepy_score", timeout_s=0.3
    )
    assert slow == [0.0] and time.perf_counter() - start < 4.0  # it sleeps 6 s
