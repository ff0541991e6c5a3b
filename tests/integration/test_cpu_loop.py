"""The real loop on the embedded CPU default: Ray, the router, engine servers, the trainer."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from rlpost.runtime.rollout_dump import dump_path, read_rollout

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = (
    "rollout_id",
    "rollout/reward_mean",
    "rollout/num_samples",
    "train/loss",
    "train/entropy",
    "perf/step_time_s",
    "perf/rollout_tokens_per_s",
    "perf/memory_vs_plan",  # each run checks the plan (rlpost.backends.step_perf)
    "perf/train_time_vs_plan",
)

pytestmark = pytest.mark.integration


def start(hydra_dir: Path, *overrides: str) -> subprocess.Popen[str]:
    """A launch whose run directory is left to Hydra (run.dir unset): `hydra_dir`."""
    command = [
        sys.executable, str(ROOT / "launch.py"), f"hydra.run.dir={hydra_dir}",
        "run.progress=false", *overrides,
    ]  # fmt: skip
    return subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(proc: subprocess.Popen[str], timeout_s: float = 300) -> tuple[str, str]:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    return out, err


def read_metrics(run_dir: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_two_launches_at_once_the_default_and_an_async_decoupled_run_both_finish(
    tmp_path: Path,
) -> None:
    """Started in the same moment with the same default run directory: the second takes
    <dir>-2, and each has its own Ray cluster, ports and files. One is the colocated
    default (rollouts, training, eval); the other runs decoupled, one step off (async:
    rollout N+1 is generated while rollout N trains)."""
    shared = tmp_path / "run"
    # the default's KL weighs nothing (kl_loss_coef 0): logged every 2nd rollout on request
    default = start(
        shared,
        "recipe.rollout.num_rollout=3",
        "recipe.eval.interval=2",
        "recipe.algo.kl_metric_interval=2",
    )
    decoupled = start(
        shared,
        "layout.colocate=false",
        "layout.train.num_gpus=1",
        "layout.rollout.num_gpus=1",
        "recipe.loop.mode=async",
        "recipe.rollout.num_rollout=3",
        "recipe.eval.interval=null",
        "recipe.eval.datasets=[]",
        "tracking.tensorboard=false",
        "run.dump_rollouts=true",
    )
    default_out, _ = finish(default)
    decoupled_out, _ = finish(decoupled)
    dirs = {
        out.rsplit("run directory: ", 1)[1].strip(): out for out in (default_out, decoupled_out)
    }
    assert set(dirs) == {str(shared), f"{shared}-2"}, list(dirs)
    default_dir = Path(next(d for d, out in dirs.items() if out is default_out))
    decoupled_dir = Path(next(d for d, out in dirs.items() if out is decoupled_out))

    records = read_metrics(default_dir)
    assert [r["rollout_id"] for r in records] == [0, 1, 2]
    for record in records:
        assert set(REQUIRED) <= set(record), set(REQUIRED) - set(record)
        assert record["rollout/num_samples"] == 64
        assert 0.0 <= record["rollout/reward_mean"] <= 1.0
        assert record["train/optimizer_steps"] == 1
        # fp32 engines and an fp32 trainer on the same weights agree on every token (the
        # figure FP8 rollout is compared with: tests/integration/test_fp8_rollout.py)
        assert record["train/rollout_logprob_abs_diff"] < 1e-4
    assert ["train/kl" in r for r in records] == [True, False, True]
    assert records[2]["train/kl"] > 0.0  # the policy has moved from the reference
    # eval before training (logged with rollout 0), after rollout 2 (interval) and at the end
    assert all("eval/arith/accuracy" in records[i] for i in (0, 1, 2))
    assert "eval accuracy" in default_out
    assert (default_dir / "tensorboard").is_dir() and (default_dir / "config.yaml").is_file()
    # the engines serve the last pushed weights: only the newest version is kept on disk
    assert sorted(p.name for p in (default_dir / "weights").iterdir()) == ["v3"]

    records = read_metrics(decoupled_dir)
    assert [r["rollout_id"] for r in records] == [0, 1, 2]
    for record in records:
        assert record["rollout/num_samples"] == 64 and math.isfinite(record["train/loss"])
        assert "train/kl" not in record  # the reference is neither loaded nor run
        assert record["rollout/staleness_max"] <= 1
    assert records[0]["rollout/staleness_max"] == 0  # nothing was trained before it
    assert any(r["rollout/staleness_max"] == 1 for r in records)  # generated during a step
    # run.dump_rollouts: each rollout's samples as trained, one line each (rollout_dump.py)
    for record in records:
        samples = read_rollout(dump_path(decoupled_dir, int(record["rollout_id"])))
        assert len(samples) == record["rollout/num_samples"]
        assert [s["group_index"] for s in samples] == sorted(s["group_index"] for s in samples)
        for s in samples:
            assert s["reward"] is not None and s["status"] in ("completed", "truncated")
            assert len(s["response_ids"]) == len(s["rollout_logprobs"]) == len(s["loss_mask"])
        tokens = sum(sum(s["loss_mask"]) for s in samples)
        assert tokens == record["rollout/response_tokens"]
    assert not (default_dir / "rollouts").exists()  # off by default
