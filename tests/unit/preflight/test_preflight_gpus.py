"""The preflight's look at this machine's GPUs (nvidia-smi): a hardware profile that promises
more memory per GPU than the node's GPUs have, or bf16 on GPUs without it, is refused before
anything starts."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from rlpost.config.loader import compose_run_config
from rlpost.plan import build_plan
from rlpost.preflight import environment as preflight
from rlpost.preflight.machine import (
    LocalGpu,
    cpu_memory_issues,
    host_memory_gib,
    host_memory_issues,
    installed_torch_version,
    local_gpu_issues,
    local_gpus,
    nvidia_smi,
    parse_gpus,
    shared_memory_bytes,
    shared_memory_issues,
    torch_build_issues,
    visible_gpu_issues,
)
from rlpost.schema import RunConfig

# nvidia-smi's lines (name, MiB, compute capability): an H200 (its name and memory as the
# H200 lease printed them), an H100 SXM, an A100 40GB, a V100
H200 = "NVIDIA H200, 143771, 9.0"
H100 = "NVIDIA H100 80GB HBM3, 81559, 9.0"
A100_40 = "NVIDIA A100-SXM4-40GB, 40960, 8.0"
V100 = "Tesla V100-SXM2-32GB, 32768, 7.0"


def run(hardware: str, *overrides: str) -> RunConfig:
    models = ["model=qwen3-0.6b", "recipe=grpo_dapo", f"hardware={hardware}"]
    return compose_run_config([*models, *overrides])[0]


def node(cfg: RunConfig, line: str) -> list[LocalGpu]:
    return parse_gpus(f"{line}\n" * cfg.hardware.gpus_per_node)


def test_nvidia_smis_lines_read_as_names_memory_and_compute_capability() -> None:
    text = "\n".join([H200, "", "garbled line", "Some, GPU, with commas, 1024, 8.6", V100])
    assert parse_gpus(text) == [
        LocalGpu("NVIDIA H200", 143771 / 1024, (9, 0)),
        LocalGpu("Some, GPU, with commas", 1.0, (8, 6)),
        LocalGpu("Tesla V100-SXM2-32GB", 32.0, (7, 0)),
    ]
    # a driver without the compute_cap field is asked for name and memory alone
    assert parse_gpus("NVIDIA H100 80GB HBM3, 81559", with_compute_capability=False) == [
        LocalGpu("NVIDIA H100 80GB HBM3", 81559 / 1024, None)
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
    cfg = run(hardware)
    gpus = node(cfg, line)
    issues = local_gpu_issues(cfg, gpus)
    assert bool(issues) is refused
    if refused:
        (issue,) = issues
        gpu = gpus[0]
        assert issue.key == "hardware.gpu_memory_gib" and issue.value == cfg.hardware.gpu_memory_gib
        assert f"this machine's {gpu.name} has {gpu.memory_gib:.1f} GiB" in issue.message
        assert f"each GPU as {cfg.hardware.gpu_name} with" in issue.message  # H200-SXM-141GB
        assert f"hardware.gpu_memory_gib={int(gpu.memory_gib * 10) / 10:g}" in issue.fix


def test_the_smallest_gpu_decides_and_no_gpus_listed_judges_nothing() -> None:
    cfg = run("h100x8")
    gpus = parse_gpus("\n".join([H100] * 7 + [A100_40]))
    (issue,) = local_gpu_issues(cfg, gpus)
    assert "NVIDIA A100-SXM4-40GB has 40.0 GiB" in issue.message
    assert local_gpu_issues(cfg, []) == []  # no nvidia-smi: the GPU count check speaks


def test_bf16_on_gpus_without_it_is_refused_with_fp16_or_fp32_as_the_fix() -> None:
    # a V100 profile: 32 GB cards, so that only the dtype is wrong
    v100 = ("hardware.gpu_memory_gib=31.5", "hardware.gpus_per_node=1", "hardware.num_nodes=1")
    cfg = run("h100x1", *v100)
    (issue,) = local_gpu_issues(cfg, node(cfg, V100))
    assert (issue.key, issue.value) == ("model.params_dtype", "bf16")
    assert "Tesla V100-SXM2-32GB (compute capability 7.0) has no bf16" in issue.message
    assert "model.params_dtype: fp16 with trainer.backend=megatron" in issue.fix
    for dtype in ("fp16", "fp32"):
        fixed = run("h100x1", *v100, f"model.params_dtype={dtype}")
        assert local_gpu_issues(fixed, node(fixed, V100)) == []
    unknown = [LocalGpu("Tesla V100-SXM2-32GB", 32.0, None)]  # an old driver: not judged
    assert local_gpu_issues(cfg, unknown) == []


FAKE_NVIDIA_SMI = """#!/bin/sh
echo "$*" >> "$CALLS"
case "$*" in *compute_cap*) [ -n "$OLD_DRIVER" ] && exit 6 ;; esac
while read -r line; do
  [ -n "$OLD_DRIVER" ] && line="${line%,*}"
  echo "580.159.04, $line"
done < "$GPUS"
"""


@pytest.mark.parametrize("old_driver", [False, True])
def test_one_nvidia_smi_call_gives_the_gpus_and_the_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old_driver: bool
) -> None:
    """The GPUs (names with commas too) and the driver's version come from one call; a driver
    without the compute_cap field is asked once more, without it. The environment check, on
    a GPU profile, calls nvidia-smi once."""
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(FAKE_NVIDIA_SMI)
    fake.chmod(0o755)
    (tmp_path / "gpus").write_text(f"{H200}\nNVIDIA A100-SXM4-80GB, PCIe, 81920, 8.0\n")
    calls = tmp_path / "calls"
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("GPUS", str(tmp_path / "gpus"))
    monkeypatch.setenv("CALLS", str(calls))
    if old_driver:
        monkeypatch.setenv("OLD_DRIVER", "1")
    gpus, driver = nvidia_smi()
    capability = [None, None] if old_driver else [(9, 0), (8, 0)]
    assert gpus == [
        LocalGpu("NVIDIA H200", 143771 / 1024, capability[0]),
        LocalGpu("NVIDIA A100-SXM4-80GB, PCIe", 80.0, capability[1]),
    ]
    assert driver == "580.159.04"
    assert len(calls.read_text().splitlines()) == (2 if old_driver else 1)

    calls.unlink()
    monkeypatch.setattr(preflight, "_local_gpus", lambda: 8)
    cfg = run("h100x8", "engine.backend=cpu")
    preflight.check_environment(cfg, build_plan(cfg))
    assert len(calls.read_text().splitlines()) == (2 if old_driver else 1)


@pytest.mark.gpu
def test_nvidia_smi_reports_the_gpus_torch_sees() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    gpus = local_gpus()
    assert len(gpus) >= torch.cuda.device_count()
    properties = torch.cuda.get_device_properties(0)
    total_gib = properties.total_memory / 1024**3
    ours = min(gpus, key=lambda gpu: abs(gpu.memory_gib - total_gib))
    assert abs(ours.memory_gib - total_gib) < 0.02 * total_gib
    assert ours.compute_capability == (properties.major, properties.minor)
    # this machine's torch runs on its driver: the build check must not refuse it
    driver = nvidia_smi()[1]
    assert driver is not None
    assert torch_build_issues(run("h100x1"), installed_torch_version(), driver) == []


@pytest.mark.parametrize(
    ("visible", "shown"),
    [("0,1,2,3", 4), ("", 0), ("0,1,-1,3", 2)],
)
def test_cuda_visible_devices_hiding_the_profiles_gpus_is_refused(visible: str, shown: int) -> None:
    cfg = run("h100x8")
    (issue,) = visible_gpu_issues(cfg, visible)
    assert (issue.key, issue.value) == ("CUDA_VISIBLE_DEVICES", visible)
    assert f"it shows {shown} GPU(s) to this launch" in issue.message
    assert f"hardware.gpus_per_node={shown}" in issue.fix
    assert visible_gpu_issues(cfg, "0,1,2,3,4,5,6,7") == []
    assert visible_gpu_issues(cfg, None) == []


def test_gpus_named_by_uuid_in_cuda_visible_devices_are_refused() -> None:
    cfg = run("h100x8")
    visible = ",".join(f"GPU-{i}a2f" for i in range(8))
    (issue,) = visible_gpu_issues(cfg, visible)
    assert issue.key == "CUDA_VISIBLE_DEVICES" and "by UUID or MIG id (GPU-0a2f)" in issue.message
    assert "nvidia-smi -L" in issue.fix


@pytest.mark.parametrize(
    ("torch_version", "driver", "says"),
    [
        ("2.13.0+cpu", "580.159.04", "is the CPU build: no rank would see a GPU"),
        ("2.11.0+cu130", "570.86.15", "built for CUDA 13, which needs an NVIDIA driver of 580"),
        ("2.6.0+cu126", "515.65.01", "built for CUDA 12, which needs an NVIDIA driver of 525"),
        ("2.11.0+cu130", "580.159.04", None),  # the GPU machines' pair
        ("2.6.0+cu126", "580.159.04", None),  # newer drivers run older CUDA builds
        ("2.11.0", "470.1", None),  # no build tag: not judged without importing torch
        ("2.11.0+cu130", None, None),  # no nvidia-smi: the GPU count check speaks
    ],
)
def test_a_torch_build_the_gpus_cannot_run_is_refused(
    torch_version: str, driver: str | None, says: str | None
) -> None:
    cfg = run("h100x8")
    issues = torch_build_issues(cfg, torch_version, driver)
    if says is None:
        assert issues == []
    else:
        (issue,) = issues
        assert issue.key == "hardware" and says in issue.message
        assert "download.pytorch.org/whl/cu" in issue.fix


def test_a_container_sized_dev_shm_on_a_node_of_several_gpus_is_refused() -> None:
    eight = run("h100x8")
    docker_default = 64 * 2**20
    (issue,) = shared_memory_issues(eight, docker_default, {})
    assert issue.key == "hardware" and "/dev/shm on this node holds 64 MiB" in issue.message
    assert "--shm-size" in issue.fix and "NCCL_SHM_DISABLE=1" in issue.fix
    assert shared_memory_issues(eight, docker_default, {"NCCL_SHM_DISABLE": "1"}) == []
    assert shared_memory_issues(eight, 16 * 2**30, {}) == []
    assert shared_memory_issues(run("h100x1"), docker_default, {}) == []  # no NCCL peers
    assert shared_memory_issues(eight, None, {}) == []  # no /dev/shm: not Linux
    shm = Path("/dev/shm")
    if shm.is_dir():  # this machine's, against the same figure from another call
        assert shared_memory_bytes() == shutil.disk_usage(shm).total


def test_a_cpu_run_whose_train_ranks_outgrow_this_machines_memory_is_refused() -> None:
    """A CPU profile's train ranks are processes in this machine's memory, at the plan's
    training peak each (a bf16 model counted in float32, as it runs there)."""
    cfg, _ = compose_run_config(["model=qwen3-1.7b", "plan.memory_check=warn"])
    plan = build_plan(cfg)
    per_rank = plan.memory.train.total_gib
    assert per_rank > 20  # float32 weights, gradients and Adam of 1.7B parameters
    (issue,) = cpu_memory_issues(cfg, plan, 32.0)
    assert (issue.key, issue.value) == ("hardware", "cpu")
    assert f"{per_rank:,.1f} GiB in each of 2 train rank(s)" in issue.message
    assert "this machine has 32.0 GiB" in issue.message
    assert cpu_memory_issues(cfg, plan, 2 * per_rank + 1) == []
    assert cpu_memory_issues(cfg, plan, None) == []
    default, _ = compose_run_config([])
    assert cpu_memory_issues(default, build_plan(default), 2.0) == []  # the default: 0.4 GiB


def test_a_node_with_less_memory_than_the_plans_host_need_is_refused() -> None:
    cfg = run("h100x8", "model=qwen3-8b", "recipe.optim.cpu_offload=true")
    plan = build_plan(cfg)
    need = plan.memory.host.total_gib
    assert need > 64  # CPU Adam: every rank's optimizer state on the host
    (issue,) = host_memory_issues(cfg, plan, 64.0)
    assert (issue.key, issue.value) == ("hardware.host_memory_gib", 2048)
    assert f"the run needs {need:,.1f} GiB of host memory" in issue.message
    assert "this machine has 64.0 GiB" in issue.message
    assert "hardware.host_memory_gib=64" in issue.fix
    assert host_memory_issues(cfg, plan, need) == []
    assert host_memory_issues(cfg, plan, None) == []
    # this machine's MemTotal, against the kernel's page count (a little above it)
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 1024**3
    assert host_memory_gib() == pytest.approx(pages, rel=0.01)
