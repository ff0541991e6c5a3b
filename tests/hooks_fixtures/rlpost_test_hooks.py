"""User hooks for the reward and hook-loading tests, imported by dotted path.

tests/hooks_fixtures is put on sys.path by the tests' `hook_modules` fixture.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from rlpost.types import Sample

CALL_THREADS: list[str] = []


def length_reward(sample: Sample) -> float:
    """Plain function: runs in a worker thread."""
    CALL_THREADS.append(threading.current_thread().name)
    return float(len(sample.response_text))


def length_reward_failing_from_group_12(sample: Sample) -> float:
    """`length_reward` until the groups of the fourth rollout of 4 prompts (group 12 on),
    whose rewarding raises; an evaluation's samples (`"split": "eval"`) are scored."""
    if sample.metadata.get("split") != "eval" and sample.group_index >= 12:
        raise RuntimeError("the grader broke")
    return length_reward(sample)


def length_reward_marking_evaluations(sample: Sample) -> float:
    """`length_reward`; an evaluation's sample (its prompt's metadata has `"split": "eval"`)
    first appends a line to the file $RLPOST_TEST_EVAL_MARK names, when set, and takes a
    second: a test sees an evaluation running and has time to signal it. A training sample
    does the same with $RLPOST_TEST_TRAIN_MARK: a test sees a rollout being generated."""
    split = "eval" if sample.metadata.get("split") == "eval" else "train"
    mark = os.environ.get(f"RLPOST_TEST_{split.upper()}_MARK")
    if mark:
        with open(mark, "a", encoding="utf-8") as out:
            out.write(f"{sample.group_index}\n")
        time.sleep(1.0)
    return length_reward(sample)


def score_in_metadata_or_length(sample: Sample) -> float:
    """The prompt's own `score` when its line has one (the same for every sample of its
    group, whatever was generated), else the response's length."""
    if "score" in sample.metadata:
        return float(sample.metadata["score"])
    return float(len(sample.response_text))


def quarter_reward(sample: Sample) -> float:
    """0.25 for every sample: which function scored a set shows in its accuracy."""
    return 0.25


async def async_three_quarter_reward(sample: Sample) -> float:
    """0.75 for every sample."""
    return 0.75


async def async_contains_label(sample: Sample) -> float:
    await asyncio.sleep(0)
    return 1.0 if sample.label and sample.label in sample.response_text else 0.0


def rank_in_group(samples: list[Sample]) -> list[float]:
    """Group reward: 1 for the longest response of the group, 0 for the others."""
    longest = max(len(s.response_text) for s in samples)
    return [1.0 if len(s.response_text) == longest else 0.0 for s in samples]


def wrong_length_group(samples: list[Sample]) -> list[float]:
    return [1.0]


def ranked_group_with_extras(samples: list[Sample]) -> list[dict[str, Any]]:
    """Group reward as verl's batch reward functions return it: a dict per sample, the
    reward as "score", beside it whether it is the longest, its length and its text."""
    longest = max(len(s.response_text) for s in samples)
    return [
        {
            "score": 1.0 if len(s.response_text) == longest else 0.0,
            "acc": len(s.response_text) == longest,
            "length": len(s.response_text),
            "pred": s.response_text,
        }
        for s in samples
    ]


def group_dicts_with_reward_key(samples: list[Sample]) -> list[dict[str, Any]]:
    """A reward server's key, "reward", where a group function's dict holds "score"."""
    return [{"reward": 1.0, "acc": 1} for _ in samples]


def group_numbers_and_dicts(samples: list[Sample]) -> list[Any]:
    return [1.0] + [{"score": 0.0, "acc": 0} for _ in samples[1:]]


def group_dict_with_text_score(samples: list[Sample]) -> list[dict[str, Any]]:
    return [{"score": "high"} for _ in samples]


def sleepy_reward(sample: Sample) -> float:
    time.sleep(6.0)  # far past the tests' timeouts, whatever the machine's load
    return 1.0


async def async_sleepy_reward(sample: Sample) -> float:
    await asyncio.sleep(30)
    return 1.0


def text_reward(sample: Sample) -> str:
    return "high"


def failing_reward(sample: Sample) -> float:
    raise KeyError("score")


def tensor_reward(sample: Sample) -> Any:
    """A reward model's logits for the sample, one per class, where one number was due."""
    import torch

    return torch.tensor([0.25, 0.75])


def numpy_reward(sample: Sample) -> Any:
    import numpy

    return numpy.float32(0.5)


def two_args(sample: Sample, extra: int) -> float:
    return 0.0


# verl's shape (verl.utils.reward_score's compute_score), called by keyword; each call's
# arguments are recorded here
VERL_CALLS: list[dict[str, Any]] = []


def verl_exact_match(data_source, solution_str, ground_truth, extra_info=None):  # type: ignore[no-untyped-def]
    """verl's shape as verl's users write it, untyped: 1.0 when the response is the label."""
    VERL_CALLS.append(
        {"data_source": data_source, "solution_str": solution_str,
         "ground_truth": ground_truth, "extra_info": extra_info}
    )  # fmt: skip
    return 1.0 if solution_str.strip() == ground_truth else 0.0


def verl_scored_dict(data_source: str, solution_str: str, ground_truth: str) -> dict[str, Any]:
    """Without extra_info, returning a dict: "score" is the reward, the rest is logged."""
    VERL_CALLS.append({"data_source": data_source, "solution_str": solution_str})
    correct = ground_truth in solution_str
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": solution_str[-8:]}


async def async_verl_score(
    data_source: str, solution_str: str, ground_truth: str, **kwargs: Any
) -> float:
    """Async, taking extra_info through **kwargs."""
    await asyncio.sleep(0)
    VERL_CALLS.append({"data_source": data_source, **kwargs})
    return float(len(solution_str))


def verl_with_extras(data_source, solution_str, ground_truth, extra_info=None):  # type: ignore[no-untyped-def]
    """verl's dict with more beside the score, as verl's users return it: a bool, an int,
    a NumPy number, the answer read; a key only some samples have (the row's difficulty),
    a key named as a rollout metric is, and a ratio that is not finite where it is wrong."""
    import numpy as np

    pred = solution_str.strip()
    correct = pred == ground_truth
    extra: dict[str, Any] = {
        "score": 1.0 if correct else -1.0,
        "acc": correct,
        "pred": pred,
        "format_ok": 1,
        "length": np.int64(len(pred)),
        "reward_mean": 5.0,
        "margin": 0.5 if correct else float("nan"),
    }
    if extra_info and "difficulty" in extra_info:
        extra["difficulty"] = extra_info["difficulty"]
    return extra


def verl_extras_or_length(data_source, solution_str, ground_truth, extra_info=None):  # type: ignore[no-untyped-def]
    """verl's shape for a run: the prompt's own `score` when its line has one (in
    extra_info, the metadata), else the response's length; beside it whether it scored
    above zero, the length, and the response's first character."""
    if extra_info and "score" in extra_info:
        score = float(extra_info["score"])
    else:
        score = float(len(solution_str))
    return {"score": score, "scored": score > 0, "length": len(solution_str),
            "first": solution_str[:1]}  # fmt: skip


def slime_shape_dict(sample: Sample) -> dict[str, Any]:
    """rlpost's shape returning what only verl's shape may: a dict."""
    return {"score": 1.0, "acc": True}


def verl_dict_without_score(data_source: str, solution_str: str, ground_truth: str) -> dict:
    return {"acc": 1.0}


def verl_sleepy_score(data_source: str, solution_str: str, ground_truth: str) -> float:
    time.sleep(6.0)  # far past the tests' timeouts, whatever the machine's load
    return 1.0


def verl_and_sample(
    sample: Sample, data_source: str, solution_str: str, ground_truth: str
) -> float:
    """Neither shape: verl's names and a required sample besides."""
    return 0.0


def keep_everything(rollout_id: int, buffer: list[list[Sample]], num_groups: int) -> list:
    """A buffer filter that forgets to remove what it returns."""
    return buffer[:num_groups]


NOT_A_FUNCTION = 3


class FeedbackSource:
    """A data source whose draws depend on what was trained: the prompts of
    ctx.prompt_data in file order, except that a group whose mean reward fell below the
    median so far is asked again first (at most `max_repeats` waiting). Everything it needs
    to continue is in its state_dict, so a resumed run draws what an uninterrupted one does.
    """

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        lines = Path(ctx.prompt_data).read_text(encoding="utf-8").splitlines()
        self.rows = [json.loads(line) for line in lines]
        self.max_repeats = int(ctx.settings.get("max_repeats", 2))
        self.position = 0
        self.again: list[int] = []
        self.next_index = 0
        self.history: list[float] = []

    @staticmethod
    def check_settings(settings: dict[str, Any]) -> list[tuple[str, str, str]]:
        value = settings.get("max_repeats", 2)
        if not isinstance(value, int) or value < 0:
            return [("max_repeats", f"{value!r} must be an integer >= 0", "e.g. 2")]
        return []

    def get_samples(self, num_groups: int) -> list[list[Sample]]:
        groups = []
        for _ in range(num_groups):
            if self.again:
                row = self.again.pop(0)
            else:
                row, self.position = self.position, (self.position + 1) % len(self.rows)
            record = self.rows[row]
            fmt = self.ctx.fmt
            label = str(record[fmt.label_key]) if fmt.label_key else None
            group = self.ctx.make_group(self.next_index, record[fmt.input_key], label, {"row": row})
            self.next_index += 1
            groups.append(group)
        return groups

    def add_samples(self, groups: list[list[Sample]]) -> None:
        for group in groups:
            mean = sum(float(s.reward or 0.0) for s in group) / len(group)
            below = bool(self.history) and mean < statistics.median(self.history)
            if below and len(self.again) < self.max_repeats:
                self.again.append(int(group[0].metadata["row"]))
            self.history = [*self.history, mean][-32:]

    def state_dict(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "again": self.again,
            "next_index": self.next_index,
            "history": self.history,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = int(state["position"])
        self.again = [int(r) for r in state["again"]]
        self.next_index = int(state["next_index"])
        self.history = [float(v) for v in state["history"]]


class BoxedAnswerModel:
    """A reward model class: built once per run, scoring whole batches. `scale` when the
    last \\boxed{} answer equals the label, else 0. With settings `log_dir`, each call
    appends '<pid> <batch size>' to <log_dir>/calls.txt (which process scored, how many)."""

    def __init__(self, ctx: Any) -> None:
        self.scale = float(ctx.settings.get("scale", 1.0))
        self.log = (
            Path(ctx.settings["log_dir"]) / "calls.txt" if "log_dir" in ctx.settings else None
        )
        self.device = ctx.device

    async def __call__(self, samples: list[Sample]) -> list[float]:
        from rlpost.rewards.answers import last_boxed

        if self.log is not None:
            with self.log.open("a", encoding="utf-8") as f:
                f.write(f"{os.getpid()} {len(samples)}\n")
        return [
            self.scale if s.label is not None and last_boxed(s.response_text) == s.label else 0.0
            for s in samples
        ]


class BoxedAnswerModelWithExtras(BoxedAnswerModel):
    """`BoxedAnswerModel`'s reward as a dict's "score", as reward servers and verl's batch
    managers answer, with whether a box was found and the answer read beside it."""

    async def __call__(self, samples: list[Sample]) -> list[dict[str, Any]]:  # type: ignore[override]
        from rlpost.rewards.answers import last_boxed

        rewards = await super().__call__(samples)
        boxes = [last_boxed(s.response_text) for s in samples]
        return [
            {"score": r, "boxed": box is not None, "answer": box}
            for r, box in zip(rewards, boxes, strict=True)
        ]


class PlainCallModel:
    def __init__(self, ctx: Any) -> None: ...

    def __call__(self, samples: list[Sample]) -> list[float]:
        return [0.0] * len(samples)


async def calculator_on_a_copy(sample: Sample, ctx: Any) -> Sample:
    """The shipped calculator episode, run on a new Sample object built from the one given
    (the loop trains what a generate function returns)."""
    import dataclasses

    from rlpost.envs.calculator import generate

    copy = dataclasses.replace(sample, metadata={**sample.metadata, "copied": True})
    return await generate(copy, ctx)


async def drops_a_logprob(sample: Sample, ctx: Any) -> Sample:
    """A generate function with a bug: one logprob short of the response."""
    await ctx.policy_turn(sample)
    if sample.rollout_logprobs:
        sample.rollout_logprobs.pop()
    return sample


class ModelWhoseCheckReturnsNothing(BoxedAnswerModel):
    """A settings check that ends without a return when the settings are fine."""

    @staticmethod
    def check_settings(settings: dict[str, Any]) -> Any:
        if settings.get("scale", 1.0) <= 0:
            return [("scale", "must be positive", "e.g. 1.0")]


class ModelWhoseCheckReturnsMessages(BoxedAnswerModel):
    """A settings check that returns its problems as plain messages."""

    @staticmethod
    def check_settings(settings: dict[str, Any]) -> Any:
        return [f"scale {settings.get('scale')} must be positive"]


def keeps_without_a_return(samples: list[Sample]) -> Any:
    """A dynamic sampling filter that ends without a return when the rewards are equal."""
    rewards = [s.reward for s in samples]
    if min(rewards) != max(rewards):  # type: ignore[type-var]
        return True


def keeps_as_numpy(samples: list[Sample]) -> Any:
    import numpy

    return numpy.std([s.reward for s in samples]) > 0


def keeps_groups_before_12(samples: list[Sample]) -> bool:
    """A filter that drops every group from the fourth rollout of four prompts on."""
    return samples[0].group_index < 12


def filter_failing_from_group_4(samples: list[Sample]) -> bool:
    if samples[0].group_index >= 4:
        raise KeyError("acc")
    return True


class ModelWithoutWeights(BoxedAnswerModel):
    """A reward model whose weights are not where its settings say."""

    def __init__(self, ctx: Any) -> None:
        path = Path(ctx.settings["path"])
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} holds no config.json")
        super().__init__(ctx)


def takes_samples(rollout_id: int, buffer: list[list[Sample]], num_groups: int) -> list:
    """A buffer filter that hands out the samples of the groups it takes, not the groups."""
    taken = buffer[:num_groups]
    del buffer[:num_groups]
    return [sample for group in taken for sample in group]
