"""Which function scores an evaluation set, through the evaluation itself against a real CPU
engine: a set's own custom_reward_function, else recipe.eval's, before training's scorer
(slime's per-set custom_rm_path, its eval config's defaults.custom_rm_path)."""

from __future__ import annotations

import asyncio
import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from rlpost.data.prompts import PromptDataError
from rlpost.rewards import compute_rewards
from rlpost.rewards.hub import sample_coin
from rlpost.runtime.evaluation import EvalReport, evaluate, load_eval_sets
from rlpost.runtime.rollout.client import EngineClient
from rlpost.runtime.rollout.manager import Group, GroupRunner
from rlpost.schema import RecipeConfig
from rlpost.types import Sample

OWN = "rlpost_test_hooks.async_three_quarter_reward"  # 0.75 a sample
WIDE = "rlpost_test_hooks.quarter_reward"  # 0.25 a sample
TRAINING = "rlpost_test_hooks.score_in_metadata_or_length"  # the line's score: 0.5


def write_set(path: Path, prompts: int = 3) -> str:
    lines = [
        {
            "input": f"What is {i}+{i}?",
            "label": str(2 * i),
            "metadata": {"score": 0.5, "set": path.stem},
        }
        for i in range(1, prompts + 1)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def recipe(tmp_path: Path, ev: dict[str, Any], reward: dict[str, Any]) -> RecipeConfig:
    return RecipeConfig.model_validate(
        {
            "name": "eval_rewards",
            "data": {"prompt_data": write_set(tmp_path / "train.jsonl"), "label_key": "label"},
            "rollout": {
                "num_rollout": 1,
                "batch_size": 1,
                "n_samples_per_prompt": 2,
                "max_response_len": 6,
                "reward": reward,
            },
            "train": {"global_batch_size": 2},
            "eval": {"interval": 1, "temperature": 0.0, **ev},
        }
    )


class KeepingRunner(GroupRunner):
    """The rollout's group runner, keeping every sample it generated and scored."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.samples: list[Sample] = []

    async def run(self, group: Group, *args: Any) -> Group:
        done = await super().run(group, *args)
        self.samples += done
        return done


def run_evaluation(
    url: str, tiny_lm_dir: Path, cfg: RecipeConfig, seed: int | None
) -> tuple[EvalReport, list[Sample]]:
    """The evaluation's report, and its samples as scored."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_lm_dir, local_files_only=True)
    sets = load_eval_sets(cfg, tokenizer, stop_token_ids=[])

    async def training_reward(samples: list[Sample]) -> list[float]:  # TrainLoop._reward's
        return await compute_rewards(samples, cfg.rollout.reward, seed)

    async def main() -> tuple[EvalReport, list[Sample]]:
        async with EngineClient(url, worker_urls=[url]) as client:
            runner = KeepingRunner(client, training_reward)
            report = await evaluate(runner, sets, 0, 0, reward_seed=seed)
            return report, runner.samples

    return asyncio.run(main())


def test_a_sets_own_function_then_the_evaluations_score_before_trainings(
    url: str, tiny_lm_dir: Path, tmp_path: Path, hook_modules: Path
) -> None:
    aime, gpqa = write_set(tmp_path / "aime.jsonl"), write_set(tmp_path / "gpqa.jsonl")
    datasets = [
        {"name": "own", "path": aime, "custom_reward_function": OWN},
        {"name": "wide", "path": gpqa},
    ]
    # training grades with math (no response of the tiny model boxes an answer: 0)
    cfg = recipe(tmp_path, {"datasets": datasets, "custom_reward_function": WIDE}, {})
    report, _ = run_evaluation(url, tiny_lm_dir, cfg, None)
    assert report.accuracy == {"own": 0.75, "wide": 0.25}

    # without recipe.eval's function, a set without its own is scored as training is: by
    # training's custom function, and a set's reward_type grades it (here random, seeded)
    datasets[1] = {"name": "plain", "path": gpqa}
    coins = write_set(tmp_path / "coins.jsonl", 32)
    datasets.append({"name": "coin", "path": coins, "reward_type": "random"})
    cfg = recipe(tmp_path, {"datasets": datasets}, {"custom_function": TRAINING})
    first, samples = run_evaluation(url, tiny_lm_dir, cfg, 11)
    assert (first.accuracy["own"], first.accuracy["plain"]) == (0.75, 0.5)
    # each sample scores the coin the run's seed draws for it (draws without the seed
    # would match all 32 one time in 2**32)
    drawn = [s for s in samples if s.metadata["set"] == "coins"]
    assert len(drawn) == 32
    assert [s.reward for s in drawn] == [float(sample_coin(11, s)) for s in drawn]
    assert first.accuracy["coin"] == statistics.fmean(s.reward or 0.0 for s in drawn)
    assert 0.0 < first.accuracy["coin"] < 1.0
    # greedy responses are the same again, and so is each one's seeded draw
    assert run_evaluation(url, tiny_lm_dir, cfg, 11)[0].accuracy == first.accuracy


def test_a_set_without_labels_is_read_and_scored_by_its_function(
    tiny_lm_dir: Path, tmp_path: Path, hook_modules: Path
) -> None:
    """label_key: false reads a set whose lines have no label field (training's data has
    one: data.label_key=label); its custom function scores the samples, which carry none. The
    same lines graded as training is (math, against the label) are refused as they load."""
    free = tmp_path / "free.jsonl"
    free.write_text("".join(json.dumps({"input": f"Say {i}."}) + "\n" for i in range(3)))
    unlabelled = {"name": "free", "path": str(free), "label_key": False}
    cfg = recipe(tmp_path, {"datasets": [{**unlabelled, "custom_reward_function": OWN}]}, {})
    tokenizer = AutoTokenizer.from_pretrained(tiny_lm_dir, local_files_only=True)
    [eval_set] = load_eval_sets(cfg, tokenizer, stop_token_ids=[])
    samples = [s for group in eval_set.groups for s in group]
    assert len(samples) == 3 and all(s.label is None for s in samples)
    assert eval_set.reward is not None
    assert asyncio.run(compute_rewards(samples, eval_set.reward)) == [0.75] * 3

    graded = recipe(tmp_path, {"datasets": [{"name": "free", "path": str(free)}]}, {})
    with pytest.raises(PromptDataError) as caught:
        load_eval_sets(graded, tokenizer, stop_token_ids=[])
    assert "'label'" in str(caught.value)


def test_a_sets_verl_shaped_function_reads_the_rows_data_source(
    tiny_lm_dir: Path, tmp_path: Path, hook_modules: Path
) -> None:
    """An evaluation set of verl's layout (data_source, prompt, reward_model.ground_truth,
    extra_info) scored by verl's compute_score as it is: the row's data_source reaches it,
    and its extra_info (data.metadata_key=extra_info)."""
    import rlpost_test_hooks

    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": f"What is {i}+{i}?",
            "reward_model": {"ground_truth": str(2 * i), "style": "rule"},
            "extra_info": {"index": i, "split": "test"},
        }
        for i in range(2)
    ]
    verl = tmp_path / "verl.jsonl"
    verl.write_text("".join(json.dumps(row) + "\n" for row in rows))
    dataset = {
        "name": "gsm8k",
        "path": str(verl),
        "input_key": "prompt",
        "label_key": "reward_model.ground_truth",
        "custom_reward_function": "rlpost_test_hooks.verl_exact_match",
    }
    cfg = recipe(tmp_path, {"datasets": [dataset]}, {})
    data = cfg.data.model_copy(update={"metadata_key": "extra_info"})
    cfg = cfg.model_copy(update={"data": data})
    tokenizer = AutoTokenizer.from_pretrained(tiny_lm_dir, local_files_only=True)
    [eval_set] = load_eval_sets(cfg, tokenizer, stop_token_ids=[])
    samples = [s for group in eval_set.groups for s in group]
    samples[0].response_text, samples[1].response_text = "0", "5"
    rlpost_test_hooks.VERL_CALLS.clear()
    assert eval_set.reward is not None
    assert asyncio.run(compute_rewards(samples, eval_set.reward)) == [1.0, 0.0]
    [call] = [c for c in rlpost_test_hooks.VERL_CALLS if c["ground_truth"] == "2"]
    assert call["data_source"] == "openai/gsm8k"
    assert call["extra_info"] == {"index": 1, "split": "test", "data_source": "openai/gsm8k"}


def test_numbers_a_sets_verl_shaped_function_returns_beside_the_score_are_its_metrics(
    url: str, tiny_lm_dir: Path, tmp_path: Path, hook_modules: Path
) -> None:
    """eval/<set>/reward_extra/<key>: each number the set's verl-shaped function returned
    beside the score, averaged over the set's samples; strings are no metric."""
    datasets = [
        {"name": "verl", "path": write_set(tmp_path / "verl.jsonl"),
         "custom_reward_function": "rlpost_test_hooks.verl_with_extras"},
        {"name": "plain", "path": write_set(tmp_path / "plain.jsonl")},
    ]  # fmt: skip
    cfg = recipe(tmp_path, {"datasets": datasets}, {"custom_function": TRAINING})
    report, samples = run_evaluation(url, tiny_lm_dir, cfg, None)
    scored = [s for s in samples if s.metadata["set"] == "verl"]
    assert len(scored) == 3 and all(s.reward_extra for s in scored)
    extras = {k: v for k, v in report.metrics.items() if "/reward_extra/" in k}
    assert extras == {
        "eval/verl/reward_extra/acc": statistics.fmean(
            float(s.reward_extra["acc"]) for s in scored if s.reward_extra
        ),
        "eval/verl/reward_extra/format_ok": 1.0,
        "eval/verl/reward_extra/length": statistics.fmean(
            len(s.response_text.strip()) for s in scored
        ),
        "eval/verl/reward_extra/reward_mean": 5.0,
        **(
            {"eval/verl/reward_extra/margin": 0.5}
            if any(s.reward_extra and s.reward_extra["acc"] for s in scored)
            else {}
        ),
    }
    assert report.accuracy["plain"] == 0.5  # training's function: no extras
