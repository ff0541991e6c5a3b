"""run.dump_rollouts: a rollout's samples written one per line, read back bit for bit, and
where two dumps of a rollout first part (what a violated chaos oracle reports)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from rlpost.runtime.rollout_dump import dump_path, dump_rollout, first_difference, read_rollout
from rlpost.types import Sample, SampleStatus

ROOT = Path(__file__).resolve().parents[3]


def sample(index: int, tokens: list[int], logprobs: list[float], reward: float = 1.0) -> Sample:
    return Sample(
        group_index=index // 2,
        index=index,
        prompt="What is 1+1?",
        prompt_ids=[5, 6, 7],
        response_ids=tokens,
        response_text="".join(map(str, tokens)),
        rollout_logprobs=logprobs,
        loss_mask=[1] * len(tokens),
        token_versions=[0] * len(tokens),
        status=SampleStatus.COMPLETED,
        reward=reward,
    )


def groups(**change: object) -> list[list[Sample]]:
    """Two groups of two samples; `change` sets fields of sample 3."""
    made = [sample(i, [10 + i, 20, 30], [-0.1 / 3, -1e-9 * i, -2.5]) for i in range(4)]
    for key, value in change.items():
        setattr(made[3], key, value)
    return [made[:2], made[2:]]


def test_a_dump_reads_back_bit_for_bit_and_a_rerun_replaces_it(tmp_path: Path) -> None:
    path = dump_rollout(tmp_path, 7, groups())
    assert path == dump_path(tmp_path, 7) == tmp_path / "rollouts" / "rollout_7.jsonl"
    records = read_rollout(path)
    assert [r["index"] for r in records] == [0, 1, 2, 3]
    assert records[1]["rollout_logprobs"] == [-0.1 / 3, -1e-9, -2.5]  # exact floats
    assert records[3]["status"] == "completed" and records[3]["reward"] == 1.0
    dump_rollout(tmp_path, 7, groups(reward=0.0))  # the rollout run again
    assert read_rollout(path)[3]["reward"] == 0.0
    assert sorted(p.name for p in path.parent.iterdir()) == ["rollout_7.jsonl"]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({}, "the same 4 samples, bit for bit: what differs came after (training, evaluation)"),
        ({"response_ids": [13, 21, 30]}, "sample 3 (group 1): the response tokens part at token 1"),
        ({"response_ids": [13, 20]}, "sample 3 (group 1): the response tokens part at token 2"),
        (
            {"rollout_logprobs": [-0.1 / 3, -1e-9 * 3, -2.5000001]},
            "sample 3 (group 1): the same tokens, the engines' logprobs differ at 1 of 3 "
            "from token 2 (by at most 1e-07)",
        ),
        ({"reward": 0.0}, "sample 3 (group 1): reward differ"),
        ({"reward_extra": {"pred": "7"}}, "sample 3 (group 1): reward_extra differ"),
        ({"status": SampleStatus.TRUNCATED}, "sample 3 (group 1): status differ"),
    ],
)
def test_first_difference_says_where_two_dumps_part(
    tmp_path: Path, change: dict[str, object], says: str
) -> None:
    ours = dump_rollout(tmp_path / "ours", 0, groups(**change))
    theirs = dump_rollout(tmp_path / "theirs", 0, groups())
    assert first_difference(ours, theirs).startswith(says)


def test_what_a_verl_shaped_reward_function_returned_beside_the_score_is_dumped(
    tmp_path: Path,
) -> None:
    """Strings included, which no metric holds; null where the reward came alone."""
    extra = {"acc": True, "pred": "42", "margin": None, "steps": [1, 2]}
    records = read_rollout(dump_rollout(tmp_path, 0, groups(reward_extra=extra)))
    assert records[3]["reward_extra"] == extra
    assert records[0]["reward_extra"] is None


def test_first_difference_names_a_missing_dump_and_other_samples(tmp_path: Path) -> None:
    theirs = dump_rollout(tmp_path / "theirs", 0, groups())
    missing = dump_path(tmp_path / "ours", 0)
    assert first_difference(missing, theirs) == f"{missing} was not written"
    fewer = dump_rollout(tmp_path / "ours", 0, groups()[:1])
    assert first_difference(fewer, theirs).startswith("other samples trained: 2 against 4")


def test_the_chaos_oracle_says_where_the_first_differing_rollouts_samples_part(
    tmp_path: Path,
) -> None:
    spec = importlib.util.spec_from_file_location("chaos", ROOT / "benchmarks" / "chaos.py")
    assert spec is not None and spec.loader is not None
    chaos = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = chaos
    spec.loader.exec_module(chaos)
    runs = {}
    for name, entropy, logprobs in (
        ("ours", 1.25, [-0.5, -0.25, -2.0]),
        ("theirs", 1.5, [-0.5, -0.25, -2.5]),
    ):
        run = tmp_path / name
        run.mkdir()
        records = [
            {"rollout_id": 0, "train/entropy": 1.0, "perf/step_time_s": 0.1},
            {"rollout_id": 1, "train/entropy": entropy, "perf/step_time_s": 0.2},
        ]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        for rollout_id in (0, 1):
            made = groups()
            if rollout_id == 1:
                made[0][1].rollout_logprobs = logprobs
            dump_rollout(run, rollout_id, made)
        runs[name] = run
    found = chaos.same_records(runs["ours"], runs["theirs"])
    assert found == [
        "rollout 1's samples: sample 1 (group 0): the same tokens, the engines' logprobs differ "
        "at 1 of 3 from token 2 (by at most 0.5)",
        "rollout 1: train/entropy differ",
    ]
    assert chaos.same_records(runs["ours"], runs["ours"]) == []
