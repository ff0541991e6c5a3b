"""`rlpost new hardware NAME`: a profile of the machine it runs on, from nvidia-smi's lines, the
host's facts and the GPU's data sheet; the shipped H100 node is what it writes for one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from rlpost.cli.new_hardware import Host, profile_fields, render_hardware_yaml, sheet_for
from rlpost.errors import UserError
from rlpost.preflight.machine import LocalGpu, local_gpus, parse_gpus
from rlpost.schema import HardwareConfig

REPO = Path(__file__).resolve().parents[2]
Rlpost = Callable[[list[str]], tuple[int, str, str]]  # the `rlpost` fixture (conftest.py)
H100 = "NVIDIA H100 80GB HBM3, 81559, 9.0"  # nvidia-smi on an H100 SXM node
A100_PCIE = "NVIDIA A100 80GB PCIe, 81920, 8.0"
DGX_H100 = Host(memory_gib=2048.3, cpus=224, nvlink=True)


def gpus(line: str, count: int) -> list[LocalGpu]:
    return parse_gpus("\n".join([line] * count))


def test_an_h100_node_gives_the_shipped_h100_profile() -> None:
    fields = profile_fields("h100x8", gpus(H100, 8), DGX_H100)
    ours = HardwareConfig.model_validate(yaml.safe_load(render_hardware_yaml(fields)))
    shipped = HardwareConfig.model_validate(
        yaml.safe_load((REPO / "conf" / "hardware" / "h100x8.yaml").read_text())
    )
    labels = {"description", "gpu_name"}
    assert ours.model_dump(exclude=labels) == shipped.model_dump(exclude=labels)
    assert ours.gpu_name == "NVIDIA H100 80GB HBM3"


def test_pcie_cards_without_nvlink_talk_over_pcie() -> None:
    fields = profile_fields("a100x4", gpus(A100_PCIE, 4), Host(512.0, 64, nvlink=False))
    assert fields["nvlink_within_node"] is False
    assert (fields["intra_node_gbps"], fields["pcie_gbps"]) == (25.0, 25.0)  # PCIe 4
    assert (fields["peak_bf16_tflops"], fields["memory_bandwidth_gbps"]) == (312.0, 1935.0)
    assert fields["gpu_memory_gib"] == 80.0 and "inter_node_gbps" not in fields
    two = profile_fields("a100x8", gpus(A100_PCIE, 4), Host(512.0, 64, False), nodes=2)
    assert (two["num_nodes"], two["inter_node_gbps"]) == (2, 50.0)
    # given for one node, the bandwidth is kept, not dropped
    one = profile_fields("a100x4", gpus(A100_PCIE, 4), Host(512.0, 64, False), inter_node_gbps=25)
    assert one["inter_node_gbps"] == 25.0


@pytest.mark.parametrize(
    ("name", "peak", "bandwidth"),
    [
        ("NVIDIA H200", 989, 4800),
        ("NVIDIA H20", 148, 4000),  # not the H200's figures
        ("NVIDIA H100 PCIe", 756, 2000),
        ("NVIDIA H100 NVL", 835, 3900),
        ("NVIDIA A100-SXM4-40GB", 312, 1555),
        ("NVIDIA A100-SXM4-80GB", 312, 2039),
        ("NVIDIA L40S", 362, 864),
    ],
)
def test_data_sheets_match_nvidia_smis_names(name: str, peak: float, bandwidth: float) -> None:
    sheet = sheet_for(name)
    assert sheet is not None
    assert (sheet.peak_bf16_tflops, sheet.memory_bandwidth_gbps) == (peak, bandwidth)


def test_what_cannot_make_a_profile_is_refused_with_the_way_out() -> None:
    unknown = gpus("NVIDIA RTX PRO 6000 Blackwell, 97887, 12.0", 2)
    with pytest.raises(UserError) as caught:
        profile_fields("pro6000x2", unknown, DGX_H100)
    (issue,) = caught.value.issues
    assert issue.key == "--peak-bf16-tflops" and "--memory-bandwidth-gbps" in issue.fix
    given = profile_fields(
        "pro6000x2", unknown, DGX_H100, peak_bf16_tflops=500, memory_bandwidth_gbps=1792
    )
    assert (given["peak_bf16_tflops"], given["nvlink_within_node"]) == (500, False)
    with pytest.raises(UserError, match="GPUs of 2 kinds"):
        profile_fields("mixed", gpus(H100, 4) + gpus(A100_PCIE, 4), DGX_H100)


def test_a_written_profile_plans_a_run(tmp_path: Path, rlpost: Rlpost) -> None:
    fields = profile_fields("a100pcie", gpus(A100_PCIE, 1), Host(512.0, 64, False))
    (tmp_path / "hardware").mkdir()
    (tmp_path / "hardware" / "a100pcie.yaml").write_text(render_hardware_yaml(fields))
    argv = ["plan", "--config-dir", str(tmp_path), "model=qwen3-0.6b", "recipe=grpo_dapo"]
    status, out, err = rlpost([*argv, "hardware=a100pcie"])
    assert status == 0, err
    assert "Memory (GPU 80.0 GiB" in out


def test_a_machine_without_gpus_is_refused(rlpost: Rlpost) -> None:
    if local_gpus():
        pytest.skip("this machine has GPUs")
    status, _, err = rlpost(["new", "hardware", "x", "--out", "-"])
    assert status == 2 and "no NVIDIA GPU that nvidia-smi lists" in err
    assert "Traceback" not in err


@pytest.mark.gpu
def test_this_gpu_machines_profile_holds_its_gpus(rlpost: Rlpost) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    status, out, err = rlpost(["new", "hardware", "here", "--out", "-"])
    if status == 2 and "--peak-bf16-tflops" in err:
        pytest.skip("a GPU without data-sheet figures here")
    assert status == 0, err
    profile = HardwareConfig.model_validate(yaml.safe_load(out))
    assert profile.gpus_per_node >= torch.cuda.device_count()
    total_gib = torch.cuda.get_device_properties(0).total_memory / 1024**3
    assert total_gib - 0.1 <= profile.gpu_memory_gib <= total_gib


def test_a_host_whose_memory_cannot_be_read_is_given_it_on_the_command_line(
    rlpost: Rlpost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No /proc/meminfo (the figure reads 0): the schema refuses the profile before it is
    written, naming the flag that gives it. nvidia-smi's lines stand in for this machine's."""
    from rlpost.cli import new_hardware

    monkeypatch.setattr(new_hardware, "local_gpus", lambda: gpus(H100, 8))
    monkeypatch.setattr(new_hardware, "this_host", lambda: Host(0.0, 64, nvlink=True))
    status, out, err = rlpost(["new", "hardware", "h100box", "--out", "-"])
    assert status == 2 and "host_memory_gib" in err and "pass --host-memory-gib" in err
    assert out == "" and "Traceback" not in err
    argv = ["new", "hardware", "h100box", "--out", "-", "--host-memory-gib", "1024"]
    status, out, err = rlpost(argv)
    assert status == 0, err
    profile = HardwareConfig.model_validate(yaml.safe_load(out))
    assert (profile.host_memory_gib, profile.gpus_per_node) == (1024, 8)
