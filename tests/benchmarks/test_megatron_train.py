"""benchmarks/megatron_train.py runs on CPU: each trainer (megatron-core, and the torch trainer
with trainer.backend=torch) and the plain loop beside it (--baseline) on the tiny Qwen3 shape,
one timed rollout each; the rows it prints for the torch trainer on a GPU profile (planning
only); the runs it refuses stop before megatron-core is imported or anything is measured;
benchmarks/gpu_checks.sh parses."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from rlpost.plan import Plan, build_plan
from rlpost.schema import RunConfig

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"


def run_tiny(*extra: str, baseline: bool = True) -> dict[str, str]:
    """The benchmark's printed rows, name -> value."""
    command = [sys.executable, str(BENCHMARKS / "megatron_train.py")]
    command += ["--size", "tiny", "--steps", "1", *(["--baseline"] if baseline else []), *extra]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = dict(line.split("  ", 1) for line in done.stdout.splitlines() if "  " in line.strip())
    return {name.strip(): value.strip() for name, value in rows.items()}


def number(value: str) -> float:
    return float(value.split()[0].replace(",", ""))


def test_tiny_run_with_the_plain_loop_prints_both_and_the_ratio() -> None:
    rows = run_tiny()
    assert rows["layout"] == "tp 1 pp 1 cp 1 dp 1, recompute none, attention varlen or padded"
    assert rows["rollout"].startswith("16 samples x 128 tokens (2,048 in all), ")
    assert float(rows["MFU (of cpu's 0.1 TFLOP/s)"]) > 0
    assert float(rows["plain train tokens/s"].replace(",", "")) > 0
    assert float(rows["rlpost / plain tokens/s"]) > 0
    assert "8 samples per micro-batch" in rows["plain loop"]  # 1024 tokens / 128 per sample


def test_ragged_samples_with_padded_attention_count_their_own_tokens() -> None:
    rows = run_tiny("--ragged", "--attention", "padded", baseline=False)
    assert rows["layout"].endswith("attention padded SDPA (--attention padded)")
    shape, rest = rows["rollout"].split(" (", 1)
    low, high = (int(n) for n in shape.removeprefix("16 samples of ").split()[0].split("-"))
    assert 32 <= low < high <= 128  # a quarter of --seq-len to all of it
    tokens = number(rest)  # "2,0xx in all), ..."
    assert 16 * low < tokens < 16 * high
    assert number(rows["train tokens/s"]) > 0
    command = [sys.executable, str(BENCHMARKS / "megatron_train.py"), "--ragged", "--baseline"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--baseline needs equal samples" in done.stderr


def refused_before_anything_heavy(returncode: int, *args: str) -> str:
    """The benchmark's stderr for a run it refuses: refused before anything heavy, so neither
    megatron-core, transformers nor the trainers' timing module (where the matmul peak is
    measured) was imported (`python -X importtime`), and nothing printed on stdout."""
    command = [sys.executable, "-X", "importtime", str(BENCHMARKS / "megatron_train.py"), *args]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == returncode, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    imported = {s.rsplit("|", 1)[1].strip().split(".")[0] for s in lines if "import time:" in s}
    assert "rlpost" in imported
    heavy = {"megatron", "transformers", "trainer_timing", "plain_loop", "step_profile"}
    assert sorted(imported & heavy) == []
    return "\n".join(line for line in lines if "import time:" not in line)


def test_a_run_the_plan_refuses_stops_with_its_reason_before_any_model_is_built() -> None:
    # qwen3-4b without recompute on the one-H100 profile: ~140 GiB of float32 state and
    # activations on an 80 GB card (gpu_checks.sh's train_4b_megatron_none on an H100)
    stderr = refused_before_anything_heavy(
        2, "--size", "4b", "--hardware", "h100x1", "layout.train.recompute.granularity=none"
    )
    assert "no tensor-parallel size fits qwen3-4b on 1 x 79.6 GiB" in stderr


def test_the_torch_trainer_on_a_gpu_profile_without_cuda_stops_before_any_model_is_built() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("with CUDA the torch trainer runs on the GPU profile")
    stderr = refused_before_anything_heavy(
        1, "--size", "tiny", "--hardware", "h100x1", "trainer.backend=torch"
    )
    assert (
        "--hardware h100x1: the torch trainer would compute on cuda, but this machine has no "
        "CUDA GPU; pass --hardware cpu (or leave it out)"
    ) in stderr


def test_the_default_hardware_is_this_machines(bench: ModuleType) -> None:
    import torch

    if torch.cuda.is_available():
        big = torch.cuda.get_device_properties(0).total_memory > 96 * 1024**3
        assert bench.default_hardware() == ("h200x1" if big else "h100x1")
    else:
        assert bench.default_hardware() == "cpu"


def test_tiny_torch_trainer_run_prints_its_layout_rates_and_the_ratio() -> None:
    rows = run_tiny("trainer.backend=torch")
    layout = rows["layout"]
    assert layout.startswith("torch trainer, FSDP2 over dp 1 (shard group 1, cpu_offload off, ")
    assert "reshard_after_forward false)" in layout  # one unit on CPU
    assert layout.endswith("float32, recompute none")
    assert number(rows["train tokens/s"]) > 0
    assert float(rows["MFU (of cpu's 0.1 TFLOP/s)"]) > 0
    # grpo_dapo: no reference, and one optimizer step a rollout reuses the training logprobs
    assert rows["forwards per token"] == "3 (train) + 0 (none)"
    assert number(rows["reference weights GiB (local shards, not estimated)"]) == 0
    assert number(rows["plan train estimate GiB/GPU"]) > 0
    assert number(rows["measured / (estimate - overhead)"]) > 0
    assert number(rows["step time / plan's training seconds"]) > 0
    assert number(rows["plain train tokens/s"]) > 0
    assert float(rows["rlpost / plain tokens/s"]) > 0


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))  # it imports plain_loop and step_profile beside it
    try:
        spec = importlib.util.spec_from_file_location(
            "megatron_train", BENCHMARKS / "megatron_train.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


def gpu_plan(bench: ModuleType, *overrides: str) -> tuple[RunConfig, Plan]:
    preset = bench.PRESETS["0.6b"]
    args = argparse.Namespace(
        size="0.6b", seq_len=preset.seq_len, samples=preset.samples, global_batch=None,
        max_tokens_per_gpu=preset.max_tokens_per_gpu, hardware="h200x1", overrides=overrides,
    )  # fmt: skip
    run = bench.compose_run(args, Path("/nonexistent/hf"), "bf16")
    return run, build_plan(run)


def test_torch_trainer_rows_on_a_gpu_profile_are_fsdp2s(bench: ModuleType) -> None:
    run, plan = gpu_plan(bench, "trainer.backend=torch", "recipe.algo.kl_loss_coef=0.01")
    layout = bench.layout_row(run, plan)
    assert layout.startswith("torch trainer, FSDP2 over dp 1 (shard group 1, cpu_offload off, ")
    assert "reshard_after_forward true)" in layout and "bf16 over float32 shards" in layout
    mem = plan.memory.train
    memory = bench.plan_memory_row(mem)
    assert memory.startswith(f"{mem.total_gib:.3f} (float32 shards of 1: weights ")
    assert f"gathered {mem.gathered_gib:.3f}, reference {mem.reference_gib:.3f}" in memory
    assert mem.reference_gib > 0  # the KL in the loss loads the reference, estimated
    label, value = bench.reference_row(plan, 1.25)
    assert (label, value) == (
        "reference weights GiB (local shards)",
        f"1.250 (plan {mem.reference_gib:.3f})",
    )

    run, plan = gpu_plan(bench, "trainer.backend=torch", "layout.train.fsdp.cpu_offload=true")
    assert "cpu_offload on" in bench.layout_row(run, plan)
    memory = bench.plan_memory_row(plan.memory.train)
    assert memory.endswith(f"; on the host {plan.memory.train.host_optimizer_gib:.3f})")


def test_megatron_rows_on_a_gpu_profile_keep_their_shape(bench: ModuleType) -> None:
    run, plan = gpu_plan(bench)
    assert plan.trainer_backend == "megatron"
    assert bench.layout_row(run, plan).startswith("tp 1 pp 1 cp 1 dp 1, recompute ")
    assert bench.plan_memory_row(plan.memory.train).count("weights ") == 1
    assert bench.reference_row(plan, 0.5) == ("reference weights GiB (not estimated)", "0.500")


def test_gpu_checks_script_parses() -> None:
    done = subprocess.run(["bash", "-n", str(BENCHMARKS / "gpu_checks.sh")], capture_output=True)
    assert done.returncode == 0, done.stderr
