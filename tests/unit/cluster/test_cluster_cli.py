"""`rlpost cluster`'s hostfile and worker command, and the scheduler files written from the
plan: the sbatch script passes `bash -n`, the RayJob carries the fields of ray.io/v1."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from rlpost.cli.cluster import ClusterState, parse_hostfile, worker_command
from rlpost.cli.main import main
from rlpost.errors import UserError

SEED_002 = ("model=glm4.5-355b-a32b", "recipe=grpo_dapo", "hardware=h100x64")


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(argv)
        status = 0
    except SystemExit as exc:
        status = int(exc.code or 0)
    out, err = capsys.readouterr()
    return status, out, err


def test_hostfile_lines_as_in_seed_002() -> None:
    hosts = parse_hostfile("# nodes\n10.0.0.1 slots=8\n\n10.0.0.2 slot=8  # second\n", "hosts")
    assert [(h.address, h.slots) for h in hosts] == [("10.0.0.1", 8), ("10.0.0.2", 8)]


def test_hostfile_errors_name_the_line() -> None:
    with pytest.raises(UserError) as exc:
        parse_hostfile("10.0.0.1 slots=8\nnode-b slots=8\n10.0.0.3\n10.0.0.1 slots=8\n", "hosts")
    text = exc.value.render()
    assert "hosts:2" in text and "'node-b' is not an IP address" in text
    assert "hosts:3" in text and "slots=N" in text
    assert "hosts:4" in text and "listed twice" in text


def test_the_worker_gets_the_token_on_stdin_never_on_its_command_line() -> None:
    state = ClusterState(
        head="10.0.0.1",
        port=6379,
        workers=["10.0.0.2"],
        ssh="ssh",
        ray="/venv/bin/ray",
        slots={"10.0.0.1": 8, "10.0.0.2": 8},
        kind="gpu",
    )
    command = worker_command(state, "10.0.0.2")
    assert 'cat > "$HOME/.ray/rlpost-token-10.0.0.1-6379"' in command
    assert "umask 077" in command
    assert "RAY_AUTH_MODE=token" in command
    assert "--address=10.0.0.1:6379 --node-ip-address=10.0.0.2 --num-gpus=8" in command


def test_cluster_up_refuses_a_head_that_is_not_this_machine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("203.0.113.7 slots=8\n")
    status, _, err = run_main(
        ["cluster", "up", "--hostfile", str(hostfile), "--state", str(tmp_path / "s.json")],
        capsys,
    )
    assert status == 2
    assert "is this machine's" in err
    assert "Traceback" not in err


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_sbatch_script_for_seed_002_is_valid_bash_and_asks_for_the_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "job.sbatch"
    status, _, err = run_main(
        [
            "slurm",
            *SEED_002,
            "--run-dir",
            str(tmp_path / "run"),
            "--partition",
            "gpu",
            "--time",
            "24:00:00",
            "--out",
            str(out),
        ],
        capsys,
    )
    assert status == 0, err
    text = out.read_text()
    assert subprocess.run(["bash", "-n", str(out)], capture_output=True).returncode == 0
    for line in (
        "#SBATCH --nodes=8",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=24:00:00",
        f"#SBATCH --output={tmp_path / 'run'}/logs/slurm-%j.out",
    ):
        assert line in text.splitlines()
    assert "start --head --block" in text and "--num-gpus=8" in text
    assert "cluster wait" in text and "--nodes 8" in text
    assert "launch.py model=glm4.5-355b-a32b recipe=grpo_dapo hardware=h100x64" in text
    assert 'run.ray_address="$HEAD_IP:$PORT"' in text
    assert (tmp_path / "run" / "logs").is_dir()


def test_a_bad_config_writes_no_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "job.sbatch"
    status, _, err = run_main(
        [
            "slurm",
            "model=glm4.5-355b-a32b",
            "hardware=h100x64",
            "recipe.optim.lr=-1",
            "--run-dir",
            str(tmp_path / "run"),
            "--out",
            str(out),
        ],
        capsys,
    )
    assert status == 2 and "recipe.optim.lr" in err
    assert not out.exists()


def test_the_rayjob_carries_the_v1_fields_sized_from_the_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "job.yaml"
    status, _, err = run_main(
        ["kuberay", *SEED_002, "--image", "registry/rlpost:1", "--pvc", "runs", "--out", str(out)],
        capsys,
    )
    assert status == 0, err
    job = yaml.safe_load(out.read_text())
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    assert job["metadata"]["name"] == "rlpost-glm4-5-355b-a32b-grpo-dapo"
    spec = job["spec"]
    assert (
        "launch.py model=glm4.5-355b-a32b recipe=grpo_dapo hardware=h100x64" in spec["entrypoint"]
    )
    assert "run.ray_address=auto" in spec["entrypoint"]
    cluster = spec["rayClusterSpec"]
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "8"
    (worker,) = cluster["workerGroupSpecs"]
    assert worker["replicas"] == worker["minReplicas"] == worker["maxReplicas"] == 7
    assert worker["groupName"] and worker["rayStartParams"]["num-gpus"] == "8"
    for group in (head, worker):
        (container,) = group["template"]["spec"]["containers"]
        assert container["image"] == "registry/rlpost:1"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
        env = {e["name"]: e for e in container["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token"
        assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "rlpost-ray-token"
        (volume,) = group["template"]["spec"]["volumes"]
        assert volume["persistentVolumeClaim"]["claimName"] == "runs"


def test_a_multi_node_rayjob_needs_a_shared_volume(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run_main(["kuberay", *SEED_002, "--image", "registry/rlpost:1"], capsys)
    assert status == 2 and "--pvc" in err
