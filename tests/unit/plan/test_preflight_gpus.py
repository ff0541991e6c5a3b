"""The preflight's look at this machine's GPUs: a hardware profile that promises more memory per
GPU than the node's GPUs have is refused before anything starts."""

from __future__ import annotations

import pytest

from rlpost.config.loader import compose_run_config
from rlpost.plan.preflight import gpu_memory_issues, local_gpu_memory, parse_gpu_memory

# what nvidia-smi printed on the GPU machines this project ran on, and an A100 40GB's line
H200 = "NVIDIA H200, 143771"
H100 = "NVIDIA H100 80GB HBM3, 81559"
A100_40 = "NVIDIA A100-SXM4-40GB, 40960"


def test_nvidia_smis_lines_read_as_names_and_gib() -> None:
    text = "\n".join([H200, H100, "", "garbled line", A100_40])
    assert parse_gpu_memory(text) == [
        ("NVIDIA H200", pytest.approx(140.4, abs=0.05)),
        ("NVIDIA H100 80GB HBM3", pytest.approx(79.65, abs=0.05)),
        ("NVIDIA A100-SXM4-40GB", 40.0),
    ]


@pytest.mark.parametrize(
    ("hardware", "line", "refused"),
    [
        ("h100x8", H100, False),
        ("h200x1", H200, False),  # the profile's usable 139.8 GiB of the driver's 140.4
        ("h100x1", H200, False),  # a larger card than planned: the plan is conservative
        ("h200x1", H100, True),
        ("h100x8", A100_40, True),
    ],
)
def test_a_profile_promising_more_memory_than_the_gpus_have_is_refused(
    hardware: str, line: str, refused: bool
) -> None:
    cfg = compose_run_config(["model=qwen3-0.6b", "recipe=grpo_dapo", f"hardware={hardware}"])[0]
    gpus = parse_gpu_memory(f"{line}\n" * cfg.hardware.gpus_per_node)
    issues = gpu_memory_issues(cfg, gpus)
    assert bool(issues) is refused
    if refused:
        (issue,) = issues
        name, gib = gpus[0]
        assert issue.key == "hardware.gpu_memory_gib" and issue.value == cfg.hardware.gpu_memory_gib
        assert f"this machine's {name} has {gib:.1f} GiB" in issue.message
        assert f"hardware.gpu_memory_gib={int(gib * 10) / 10:g}" in issue.fix


def test_the_smallest_gpu_decides() -> None:
    cfg = compose_run_config(["model=qwen3-0.6b", "recipe=grpo_dapo", "hardware=h100x8"])[0]
    gpus = parse_gpu_memory("\n".join([H100] * 7 + [A100_40]))
    (issue,) = gpu_memory_issues(cfg, gpus)
    assert "NVIDIA A100-SXM4-40GB has 40.0 GiB" in issue.message
    assert gpu_memory_issues(cfg, []) == []  # no nvidia-smi: the GPU count check speaks


@pytest.mark.gpu
def test_nvidia_smi_reports_the_gpus_torch_sees() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    gpus = local_gpu_memory()
    assert len(gpus) >= torch.cuda.device_count()
    total_gib = torch.cuda.get_device_properties(0).total_memory / 1024**3
    assert min(abs(gib - total_gib) for _, gib in gpus) < 0.02 * total_gib
