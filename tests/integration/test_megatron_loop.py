"""The real loop with trainer.backend=megatron on CPU: the same rollout trains to the same
first step as the torch trainer's under tensor parallelism, and the weights reach the
engines by broadcast (gathered from the TP shards)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHORT = (
    "recipe.eval.interval=null",
    "recipe.eval.datasets=[]",
    "tracking.tensorboard=false",
    "run.deterministic=true",  # engine sampling seeded per sample: both runs see one rollout
    "run.progress=false",
    "recipe.algo.kl_metric_interval=1",  # the KL weighs nothing: measure it each rollout
)
# the first optimizer step, computed by each backend from the same rollout
FIRST_STEP = ("train/loss", "train/pg_loss", "train/kl", "train/entropy", "train/grad_norm")

pytestmark = pytest.mark.integration


def start(run_dir: Path, *overrides: str) -> subprocess.Popen[str]:
    command = [sys.executable, str(ROOT / "launch.py"), f"run.dir={run_dir}", *SHORT, *overrides]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    return subprocess.Popen(command, cwd=ROOT, text=True, **pipes)


def finish(process: subprocess.Popen[str], run_dir: Path) -> list[dict[str, Any]]:
    try:
        _, err = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate()
    assert process.returncode == 0, err[-3000:]
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


# three rollouts under TP2, a checkpoint after each, the policy as HF after the last
MEGATRON = (
    "trainer.backend=megatron",
    "engine.weight_sync=distributed",
    "recipe.rollout.num_rollout=3",
    "recipe.save.interval=1",
    "recipe.save.keep_last=3",
    "recipe.save.save_hf_interval=3",
)

Records = list[dict[str, Any]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Records, tuple[Path, Records]]:
    """The torch reference (only its first step is compared, so one rollout) and the run
    under TP2, launched at once: each spends much of its start waiting on Ray, engines and
    ranks, so side by side they take little longer than one."""
    torch_dir = tmp_path_factory.mktemp("torch") / "run"
    tp2_dir = tmp_path_factory.mktemp("tp2") / "run"
    torch_launch = start(torch_dir, "trainer.backend=torch", "recipe.rollout.num_rollout=1")
    tp2_launch = start(tp2_dir, *MEGATRON, "layout.train.tp=2")
    try:
        return finish(torch_launch, torch_dir), (tp2_dir, finish(tp2_launch, tp2_dir))
    finally:  # the other launch, when one failed: stopped as a user would (its Ray with it)
        for process in (torch_launch, tp2_launch):
            if process.poll() is None:
                process.terminate()
                process.communicate(timeout=60)


@pytest.fixture(scope="module")
def torch_run(runs: tuple[Records, tuple[Path, Records]]) -> Records:
    return runs[0]


@pytest.fixture(scope="module")
def tp2_run(runs: tuple[Records, tuple[Path, Records]]) -> tuple[Path, Records]:
    return runs[1]


def test_megatron_takes_the_torch_trainers_first_step(
    torch_run: list[dict[str, Any]], tp2_run: tuple[Path, list[dict[str, Any]]]
) -> None:
    """TP2 with the weights broadcast to the engines (gathered from the TP shards). DP2 and
    disk sync with megatron-core run in tests/unit/backends/megatron and in the fully
    asynchronous fault run (tests/integration/test_resume.py)."""
    run_dir, run = tp2_run
    assert [r["rollout_id"] for r in run] == [0, 1, 2]
    first, reference = run[0], torch_run[0]
    assert first["rollout/reward_mean"] == reference["rollout/reward_mean"]  # same samples
    for key in FIRST_STEP:
        assert first[key] == pytest.approx(reference[key], rel=1e-4, abs=1e-6), key
    # the second rollout came from engines serving the megatron trainer's updated weights
    assert run[1]["train/kl"] > 0.0
    # both backends log each step against the plan's prediction (no MFU on CPU)
    for record in (first, reference):
        assert record["perf/memory_vs_plan"] > 0 and record["perf/train_time_vs_plan"] > 0
        assert "perf/mfu" not in record
    assert (run_dir / "ckpt" / "rollout_2" / "trainer" / "metadata.json").is_file()


def hf_weights(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    tensors: dict[str, Any] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(shard))
    return tensors


def test_a_run_moves_to_another_layout_and_takes_the_same_step(
    tp2_run: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """Two rollouts under TP2, then the third resumed under TP1 x DP2 (the weights and
    Adam's state resharded by megatron-core) equals the third of the run that stayed on TP2:
    the same samples (data position and RNG carried over), loss, grad norm and weights."""
    kept_dir, kept = tp2_run
    moved_dir = tmp_path / "moved"
    command = [sys.executable, str(ROOT / "launch.py"), f"run.dir={moved_dir}", *SHORT, *MEGATRON]
    command += [f"run.resume={kept_dir / 'ckpt' / 'rollout_2'}", "layout.train.tp=1"]
    command += ["layout.train.dp=2"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "layout.train.tp: 2 -> 1" in done.stdout  # the change is listed, and allowed
    moved = [json.loads(line) for line in (moved_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout_id"] for r in moved] == [2]
    after, stayed = moved[0], kept[2]
    assert after["rollout/reward_mean"] == stayed["rollout/reward_mean"]  # the same samples
    assert after["rollout/response_tokens"] == stayed["rollout/response_tokens"]
    for key in ("train/loss", "train/pg_loss", "train/grad_norm"):
        assert after[key] == pytest.approx(stayed[key], rel=1e-4, abs=1e-7), key
    kept_w = hf_weights(kept_dir / "hf" / "rollout_3")
    moved_w = hf_weights(moved_dir / "hf" / "rollout_3")
    assert kept_w.keys() == moved_w.keys()
    for name, weight in kept_w.items():
        diff = (moved_w[name].float() - weight.float()).abs().max().item()
        assert diff <= 1e-4 * weight.float().abs().max().item() + 1e-7, name
