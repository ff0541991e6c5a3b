"""FP8 rollout on CPU, end to end: the shipped tiny model converted by
tools/convert_hf_to_fp8.py, engines serving it, an fp32 trainer started from the original
weights with truncated importance sampling, every update quantised on the way over the
broadcast group; the reward rises and the rollout/trainer mismatch is logged each step."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from rlpost.cli.planning import plan_run
from rlpost.config.loader import compose_run_config
from rlpost.plan import render_plan

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "rlpost" / "assets" / "qwen3-tiny"
NUM_ROLLOUT = 16


def run(*args: str, timeout_s: float = 420) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s
    )


def test_fp8_rollout_trains_with_tis_and_logs_the_mismatch(tmp_path: Path) -> None:
    fp8 = tmp_path / "qwen3-tiny-fp8"
    converted = run(
        "tools/convert_hf_to_fp8.py", "--model-dir", str(TINY), "--save-dir", str(fp8),
        "--strategy", "block", "--block-size", "64", "64", "--max-workers", "2",
    )  # fmt: skip
    assert converted.returncode == 0, converted.stderr
    run_dir = tmp_path / "run"
    overrides = [
        f"model.hf_checkpoint={fp8}",  # what the engines serve
        f"model.load={TINY}",  # what the trainer starts from (the bf16/fp32 original)
        "recipe.algo.off_policy_correction=tis",
        "engine.weight_sync=distributed",
        f"recipe.rollout.num_rollout={NUM_ROLLOUT}",
        f"recipe.eval.interval={NUM_ROLLOUT}",
        "run.progress=false",
        f"run.dir={run_dir}",
        f"hydra.run.dir={tmp_path / 'hydra'}",
    ]
    # the plan a launch makes (and mode=plan prints), in this process: an interpreter of its
    # own would only start Hydra and the planner again
    cfg, sources = compose_run_config([o for o in overrides if not o.startswith("hydra.")])
    plan = render_plan(plan_run(cfg, sources)[1], cfg.plan.format)
    assert "FP8 e4m3 (blocks 64x64): each update quantised on the trainer" in plan
    done = run("launch.py", *overrides)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == NUM_ROLLOUT
    rewards = [r["rollout/reward_mean"] for r in records]
    assert statistics.fmean(rewards[-5:]) > statistics.fmean(rewards[:5]) + 0.1, rewards
    evals = [r["eval/arith/accuracy"] for r in records if "eval/arith/accuracy" in r]
    assert len(evals) == 2 and evals[1] > evals[0], evals
    # FP8 engines and an fp32 trainer disagree a little on every step, weights just updated
    # included (an fp32 rollout: under 1e-4, tests/integration/test_cpu_loop.py)
    mismatch = [r["train/rollout_logprob_abs_diff"] for r in records]
    assert all(1e-3 < m < 0.1 for m in mismatch), mismatch
    assert all("train/is_weight" in r for r in records)
