"""`run.dump_rollouts`: each rollout's samples as the trainer gets them, one JSON line per
sample in `<run.dir>/rollouts/rollout_<id>.jsonl` (groups in prompt order).

A line holds the sample's prompt and response tokens, the engines' logprobs, the loss mask,
the policy version of each token, its reward, status and label, and `reward_extra`: what its
scorer's dict held beside the reward, strings included (null where it returned a number):
what is needed to tell two runs apart sample by sample (`first_difference`), or to see what
a step trained on. Floats are written as Python's shortest repr, so they read back bit for
bit. A rollout that is run again (a resume, a restart in place) writes its file again; the
file is replaced whole, so a crash mid-write leaves the previous one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlpost.types import Sample

ROLLOUTS_DIR = "rollouts"


def dump_path(run_dir: Path, rollout_id: int) -> Path:
    return run_dir / ROLLOUTS_DIR / f"rollout_{rollout_id}.jsonl"


def sample_record(sample: Sample) -> dict[str, Any]:
    return {
        "group_index": sample.group_index,
        "index": sample.index,
        "status": str(sample.status),
        "reward": sample.reward,
        "reward_extra": sample.reward_extra,
        "label": sample.label,
        "prompt_ids": sample.prompt_ids,
        "response_ids": sample.response_ids,
        "response_text": sample.response_text,
        "rollout_logprobs": sample.rollout_logprobs,
        "loss_mask": sample.loss_mask,
        "token_versions": sample.token_versions,
        "resumed_at": sample.resumed_at,
        "turns": sample.turns,
        "weight_version": sample.weight_version,
    }


def dump_rollout(run_dir: Path, rollout_id: int, groups: Sequence[Sequence[Sample]]) -> Path:
    path = dump_path(run_dir, rollout_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with partial.open("w") as out:
        for group in groups:
            for sample in group:
                out.write(json.dumps(sample_record(sample)) + "\n")
    os.replace(partial, path)
    return path


def read_rollout(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def first_difference(ours: Path, theirs: Path) -> str:
    """Where two dumps of one rollout first part, in words: a missing file, the samples
    trained, then per sample (in order) its tokens, logprobs, reward and the rest; or that
    every sample is the same (what differs then came after them: training or evaluation)."""
    for path in (ours, theirs):
        if not path.exists():
            return f"{path} was not written"
    a, b = read_rollout(ours), read_rollout(theirs)
    if [s["index"] for s in a] != [s["index"] for s in b]:
        return f"other samples trained: {len(a)} against {len(b)}, or in another order"
    for x, y in zip(a, b, strict=True):
        where = f"sample {x['index']} (group {x['group_index']})"
        if x["prompt_ids"] != y["prompt_ids"]:
            return f"{where}: other prompt tokens"
        if x["response_ids"] != y["response_ids"]:
            at = _first_unequal(x["response_ids"], y["response_ids"])
            return (
                f"{where}: the response tokens part at token {at} "
                f"({len(x['response_ids'])} and {len(y['response_ids'])} tokens)"
            )
        if x["rollout_logprobs"] != y["rollout_logprobs"]:
            ours_lp, theirs_lp = x["rollout_logprobs"], y["rollout_logprobs"]
            unequal = [abs(p - q) for p, q in zip(ours_lp, theirs_lp, strict=True) if p != q]
            return (
                f"{where}: the same tokens, the engines' logprobs differ at {len(unequal)} of "
                f"{len(ours_lp)} from token {_first_unequal(ours_lp, theirs_lp)} "
                f"(by at most {max(unequal):.3g})"
            )
        differ = sorted(k for k in x if x[k] != y.get(k))
        if differ:
            return f"{where}: {', '.join(differ)} differ"
    return f"the same {len(a)} samples, bit for bit: what differs came after (training, evaluation)"


def _first_unequal(a: Sequence[Any], b: Sequence[Any]) -> int:
    return next(
        (i for i, (p, q) in enumerate(zip(a, b, strict=False)) if p != q), min(len(a), len(b))
    )
