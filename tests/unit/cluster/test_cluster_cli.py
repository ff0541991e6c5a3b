"""`rlpost cluster`'s hostfile and worker command, and the scheduler files written from the
plan: the sbatch script passes `bash -n`, the RayJob carries the fields of ray.io/v1."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from rlpost.cli.cluster import (
    GPU_SHORT_EXIT,
    ClusterState,
    check_head_gpus,
    parse_env,
    parse_hostfile,
    worker_command,
)
from rlpost.cli.main import main
from rlpost.cli.schedulers import slurm_time_s, stop_lead_s
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


def test_a_host_name_is_refused_with_why_and_the_ip_it_resolves_to() -> None:
    """MPI hostfiles often name hosts; each node's Ray takes an IP (--node-ip-address) and
    is matched to its line by it: the refusal says so and gives the line to write."""
    with pytest.raises(UserError) as exc:
        parse_hostfile("localhost slots=4\nnode-b.invalid slots=8\n", "hosts")
    text = exc.value.render()
    assert "--node-ip-address (an IP)" in text
    assert "fix: write its IP: `127.0.0.1 slots=4` (localhost resolves to it here)" in text
    assert "fix: write its IP: `IP slots=8` (`getent hosts node-b.invalid` prints it" in text


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


def test_the_variables_env_names_reach_each_workers_ray(tmp_path: Path) -> None:
    """A worker's actors inherit its `ray start`'s environment, not the launch's: --env's
    variables are in it (the worker's command run by bash, a stand-in `ray` recording them)."""
    ray = tmp_path / "ray"
    ray.write_text('#!/bin/bash\nprintf "%s|%s|%s" "$NCCL_IB_HCA" "$HF_HOME" "$1"\n')
    ray.chmod(0o755)
    env = parse_env(["NCCL_IB_HCA=mlx5_0,mlx5_1", "HF_HOME"], {"HF_HOME": "/shared/hf cache"})
    state = ClusterState(
        "10.0.0.1", 6379, ["10.0.0.2"], "ssh", str(ray), {"10.0.0.2": 8}, "cpu", env
    )
    done = subprocess.run(
        ["bash", "-c", worker_command(state, "10.0.0.2")],
        input="token",
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout == "mlx5_0,mlx5_1|/shared/hf cache|start"


@pytest.mark.parametrize(("slots", "starts"), [(4, True), (2, True), (8, False)])
def test_a_node_with_fewer_gpus_than_its_slots_is_refused_before_its_ray_starts(
    slots: int, starts: bool, tmp_path: Path
) -> None:
    """`ray start --num-gpus=8` on a node with 4 GPUs advertises 8, and ranks would be placed
    on GPUs that are not there: the worker's command counts them first (a stand-in
    nvidia-smi listing 4), as `up` does for the head."""
    for name, text in (
        ("nvidia-smi", 'for i in 0 1 2 3; do echo "GPU $i: NVIDIA H100 (UUID: GPU-$i)"; done'),
        ("ray", 'echo "ray $*"'),
    ):
        (tmp_path / name).write_text(f"#!/bin/sh\n{text}\n")
        (tmp_path / name).chmod(0o755)
    state = ClusterState(
        "10.0.0.1", 6379, ["10.0.0.2"], "ssh", str(tmp_path / "ray"), {"10.0.0.2": slots}, "gpu"
    )
    done = subprocess.run(
        ["sh", "-c", worker_command(state, "10.0.0.2")],
        input="token",
        env={"HOME": str(tmp_path), "PATH": f"{tmp_path}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    if starts:
        assert done.returncode == 0 and f"--num-gpus={slots}" in done.stdout
    else:
        assert done.returncode == GPU_SHORT_EXIT and "ray start" not in done.stdout
        line = "10.0.0.2: nvidia-smi lists 4 GPU(s) there, and the hostfile gives it slots=8"
        assert done.stdout.strip() == line


def test_a_head_with_fewer_gpus_than_its_slots_is_refused_before_its_ray_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "nvidia-smi").write_text('#!/bin/sh\necho "GPU 0: NVIDIA H100 (UUID: GPU-0)"\n')
    (tmp_path / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    state = ClusterState("10.0.0.1", 6379, [], "ssh", "ray", {"10.0.0.1": 8}, "gpu")
    with pytest.raises(UserError) as exc:
        check_head_gpus(state)
    text = exc.value.render()
    assert "10.0.0.1: nvidia-smi lists 1 GPU(s) there, and the hostfile gives it slots=8" in text
    assert "give each node its GPU count as slots" in text
    check_head_gpus(dataclasses.replace(state, slots={"10.0.0.1": 1}))


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("WANDB_API_KEY=abc", "looks like a secret"),
        ("NOT_SET_HERE", "not set here"),
        ("1BAD=x", "is not NAME=VALUE"),
    ],
)
def test_env_refuses_secrets_unset_names_and_bad_names(given: str, says: str) -> None:
    with pytest.raises(UserError) as exc:
        parse_env([given], {})
    text = exc.value.render()
    assert f"--env = {given!r}" in text and says in text


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
    # SIGTERM ahead of the limit, for the batch script alone, which hands it to the launch:
    # the plan's training time per rollout and 5 minutes for the save, in whole minutes
    lead = [line for line in text.splitlines() if line.startswith("#SBATCH --signal=")]
    assert lead == [f"#SBATCH --signal=B:TERM@{stop_lead_s(seed_002_train_s(), None)}"]


def seed_002_train_s() -> float:
    from rlpost.config.loader import compose_run_config
    from rlpost.plan import build_plan

    cfg, _ = compose_run_config(list(SEED_002))
    return build_plan(cfg).prediction.train_s


def test_the_stop_lead_the_fix_names_writes_a_script(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "job.sbatch"
    argv = ["slurm", *SEED_002, "--run-dir", str(tmp_path / "run"), "--stop-lead", "300"]
    status, _, err = run_main([*argv, "--out", str(out)], capsys)
    assert status == 0, err
    assert "#SBATCH --signal=B:TERM@300" in out.read_text().splitlines()


def test_the_stop_lead_covers_a_rollouts_training_and_a_save() -> None:
    assert stop_lead_s(12.0, None) == 360  # 5 minutes and the training, in whole minutes
    assert stop_lead_s(0.0, None) == 300
    assert stop_lead_s(900.0, None) == 1200
    assert stop_lead_s(900.0, 120) == 120  # --stop-lead as given
    assert [slurm_time_s(t) for t in ("90", "90:30", "24:00:00", "2-00", "1-2:03", "1-0:0:5")] == [
        5400, 5430, 86400, 172800, 93780, 86405
    ]  # fmt: skip
    assert slurm_time_s("tomorrow") is None


@pytest.mark.parametrize(
    ("extra", "key", "says"),
    [
        (["--time", "4:00"], "--stop-lead", "it would stop before it trained anything"),
        (["--time", "noon"], "--time", "is not a Slurm time limit"),
        (["--stop-lead", "-5"], "--stop-lead = -5", "takes 0 to 65535"),
        (["--stop-lead", "0"], "--stop-lead = 0", "too late to save"),
        (["--stop-lead", "70000"], "--stop-lead = 70000", "takes 0 to 65535"),
    ],
)
def test_a_time_limit_the_stop_lead_leaves_nothing_of_is_refused(
    extra: list[str], key: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "job.sbatch"
    argv = ["slurm", *SEED_002, "--run-dir", str(tmp_path / "run"), *extra, "--out", str(out)]
    status, _, err = run_main(argv, capsys)
    assert status == 2 and key in err and says in err, err
    assert not out.exists()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_batch_scripts_sigterm_reaches_the_launch_which_saves_and_ends_the_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The script's last block, run with Slurm's srun stood in for by a function that runs
    its command here (no Slurm on this machine) and a launch that saves on SIGTERM: a SIGTERM
    to the batch shell reaches the launch, the script waits until the launch has saved and
    exits with the launch's own status."""
    import os
    import signal
    import time

    out = tmp_path / "job.sbatch"
    status, _, err = run_main(
        ["slurm", *SEED_002, "--run-dir", str(tmp_path / "run"), "--out", str(out)], capsys
    )
    assert status == 0, err
    block = out.read_text().split('cd "$RLPOST_DIR"\n', 1)[1]
    saved = tmp_path / "saved"
    launch = tmp_path / "launch"
    launch.write_text(
        "#!/bin/bash\n"
        f"trap 'sleep 0.5; echo saved > {saved}; exit 143' TERM\n"
        f"echo started > {tmp_path / 'started'}\n"
        "for _ in $(seq 400); do sleep 0.05; done  # 20 s at most, should the test fail\n"
    )
    launch.chmod(0o755)
    stand_ins = (
        "set -euo pipefail\n"
        'srun() { shift 5; exec "$@"; }  # --overlap --nodes=1 --ntasks=1 -w HOST\n'
        f"PYTHON={launch} RUN_DIR=/r HEAD=h HEAD_IP=10.0.0.1 PORT=6379\n"
    )
    job = subprocess.Popen(["bash", "-c", stand_ins + block])
    deadline = time.monotonic() + 10
    while not (tmp_path / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(job.pid, signal.SIGTERM)  # what --signal=B:TERM sends: the batch shell alone
    assert job.wait(timeout=10) == 143  # the launch's status, once it has saved
    assert saved.read_text() == "saved\n"


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


def test_the_variables_env_names_are_every_ray_pods(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HOME", "/runs/hf")
    out = tmp_path / "job.yaml"
    flags = ["--image", "i", "--pvc", "runs", "--env", "NCCL_IB_HCA=mlx5", "--env", "HF_HOME"]
    status, _, err = run_main(["kuberay", *SEED_002, *flags, "--out", str(out)], capsys)
    assert status == 0, err
    cluster = yaml.safe_load(out.read_text())["spec"]["rayClusterSpec"]
    for group in (cluster["headGroupSpec"], *cluster["workerGroupSpecs"]):
        (container,) = group["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["NCCL_IB_HCA"] == "mlx5" and env["HF_HOME"] == "/runs/hf"
    status, _, err = run_main(["kuberay", *SEED_002, "--env", "HF_TOKEN=x", *flags[:4]], capsys)
    assert status == 2 and "the manifest holds its pods' variables in plain text" in err


def test_a_multi_node_rayjob_needs_a_shared_volume(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run_main(["kuberay", *SEED_002, "--image", "registry/rlpost:1"], capsys)
    assert status == 2 and "--pvc" in err
    scratch = ["kuberay", *SEED_002, "--image", "registry/rlpost:1", "--scratch"]
    status, _, err = run_main(scratch, capsys)
    assert status == 2 and "write checkpoints into one run directory" in err


def test_a_rayjob_keeps_its_checkpoints_on_a_volume_unless_told_they_may_go(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One node without --pvc: the run directory would live in the pod's emptyDir, lost with
    a restarted pod and with the cluster an hour after the job; --scratch says that is meant."""
    one_node = ["kuberay", "model=qwen3-4b", "recipe=grpo_dapo", "hardware=h100x8"]
    status, _, err = run_main([*one_node, "--image", "registry/rlpost:1"], capsys)
    assert status == 2 and "--pvc" in err and "emptyDir" in err and "--scratch" in err
    out = tmp_path / "job.yaml"
    argv = [*one_node, "--image", "registry/rlpost:1", "--scratch", "--out", str(out)]
    status, _, err = run_main(argv, capsys)
    assert status == 0, err
    manifest = yaml.safe_load(out.read_text().split("\n", 2)[2])
    (volume,) = manifest["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["volumes"]
    assert volume == {"name": "runs", "emptyDir": {}}


def test_an_evaluation_without_a_claim_is_refused_for_what_it_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An evaluation writes no checkpoint or export: without --pvc its metrics and logs go
    with the pods, which --scratch may accept on one node or several (no rank of it shares
    a checkpoint)."""
    for target in (["model=qwen3-4b", "recipe=grpo_dapo", "hardware=h100x8"], list(SEED_002)):
        argv = ["kuberay", *target, "mode=eval", "--image", "registry/rlpost:1"]
        status, _, err = run_main(argv, capsys)
        assert status == 2 and "--pvc" in err and "--scratch" in err, err
        assert "metrics (metrics.jsonl) and logs" in err and "no checkpoint or export" in err
        assert "checkpoints, metrics and exports" not in err
        assert "write checkpoints" not in err
        out = tmp_path / "eval.yaml"
        status, _, err = run_main([*argv, "--scratch", "--out", str(out)], capsys)
        assert status == 0, err
        manifest = yaml.safe_load(out.read_text().split("\n", 2)[2])
        head = manifest["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
        assert head["volumes"] == [{"name": "runs", "emptyDir": {}}]


def test_scratch_with_a_claim_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--scratch (the run directory may go) with --pvc (it is kept): one of them is a mistake."""
    out = tmp_path / "job.yaml"
    one_node = ["kuberay", "model=qwen3-4b", "recipe=grpo_dapo", "hardware=h100x8"]
    argv = [*one_node, "--image", "registry/rlpost:1", "--scratch", "--pvc", "runs"]
    status, _, err = run_main([*argv, "--out", str(out)], capsys)
    assert status == 2 and "--scratch" in err and "--pvc runs keeps it" in err, err
    assert not out.exists()
    status, _, err = run_main([*argv[:-3], "--pvc", "runs", "--out", str(out)], capsys)
    assert status == 0 and out.exists(), err  # the fix: without --scratch


def test_each_ray_pod_asks_for_what_a_node_can_give_and_the_run_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pod asking for a whole node of the profile (224 CPUs, 2048 GiB) would never be
    scheduled: a node's allocatable is below its capacity. Pods ask for 90% by default, or
    what --pod-cpus and --pod-memory-gib say, and Ray counts the pod's CPUs; sizes no node
    can give, or that the run's host memory (seed 002 keeps Adam on the host) outgrows, are
    refused."""
    out = tmp_path / "job.yaml"
    argv = ["kuberay", *SEED_002, "--image", "registry/rlpost:1", "--pvc", "runs", "--out"]

    def sizes(*flags: str) -> list[tuple[str, str, str]]:
        status, _, err = run_main([*argv, str(out), *flags], capsys)
        assert status == 0, err
        cluster = yaml.safe_load(out.read_text())["spec"]["rayClusterSpec"]
        groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
        found = []
        for group in groups:
            (container,) = group["template"]["spec"]["containers"]
            limits, requests = container["resources"]["limits"], container["resources"]["requests"]
            assert limits == requests
            found.append((limits["cpu"], limits["memory"], group["rayStartParams"]["num-cpus"]))
        return found

    assert sizes() == [("201", "1843Gi", "201")] * 2
    assert sizes("--pod-cpus", "200", "--pod-memory-gib", "1900") == [("200", "1900Gi", "200")] * 2
    for flags, key, says in (
        (("--pod-cpus", "300"), "--pod-cpus", "more than a node of hardware=h100x64 has (224)"),
        (("--pod-cpus", "4"), "--pod-cpus", "fewer than the node's 8 device slots"),
        (("--pod-memory-gib", "600"), "--pod-memory-gib", "ask for at least 726 GiB"),
    ):
        status, _, err = run_main([*argv, str(tmp_path / "no.yaml"), *flags], capsys)
        assert status == 2 and key in err and says in err, err
        assert not (tmp_path / "no.yaml").exists()


def test_the_cpu_profiles_pod_takes_its_default_size_however_few_its_cpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A CPU profile's Ray starts with one logical CPU per device slot, whatever the pod asks
    for: its default pod (90% of the node's 2 CPUs: 1) is not refused for holding fewer CPUs
    than slots, a refusal of a value the user never gave."""
    out = tmp_path / "job.yaml"
    status, _, err = run_main(["kuberay", "--image", "i:1", "--scratch", "--out", str(out)], capsys)
    assert status == 0, err
    head = yaml.safe_load(out.read_text())["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "2"  # the CPU profile's two slots


def test_a_deleted_rayjobs_pods_stop_the_launch_first_and_wait_for_its_save(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "job.yaml"
    argv = ["kuberay", *SEED_002, "--image", "i", "--pvc", "runs", "--stop-lead", "900"]
    status, _, err = run_main([*argv, "--out", str(out)], capsys)
    assert status == 0, err
    cluster = yaml.safe_load(out.read_text())["spec"]["rayClusterSpec"]
    (worker,) = cluster["workerGroupSpecs"]
    for group, grace in ((cluster["headGroupSpec"], 930), (worker, 960)):
        spec = group["template"]["spec"]
        assert spec["terminationGracePeriodSeconds"] == grace
        (container,) = spec["containers"]
        command = container["lifecycle"]["preStop"]["exec"]["command"]
        assert command[:2] == ["/bin/bash", "-c"]
        subprocess.run(["bash", "-n", "-c", command[2]], check=True)
    head_script = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["lifecycle"]
    assert "/runs/rlpost-glm4-5-355b-a32b-grpo-dapo/.lock" in str(head_script)
    status, _, err = run_main([*argv[:-1], "0"], capsys)
    assert status == 2 and "--stop-lead" in err


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_head_pods_pre_stop_hands_sigterm_to_the_launch_and_waits_for_its_save(
    tmp_path: Path,
) -> None:
    """The hook, run as Kubernetes runs it, against a launch that saves on SIGTERM: it signals
    the pid the run directory's lock names and returns once the launch has saved and ended.
    A lock naming a process that is not the launch (a stale one) is left alone."""
    import sys
    import threading
    import time

    from rlpost.cli.schedulers import pre_stop_script

    saved = tmp_path / "saved"
    launch = tmp_path / "launch.py"
    launch.write_text(
        "import signal, sys, time\n"
        "def save(*_):\n"
        f"    time.sleep(0.5); open({str(saved)!r}, 'w').write('saved'); sys.exit(143)\n"
        "signal.signal(signal.SIGTERM, save)\n"
        "print('started', flush=True)\n"
        "time.sleep(20)\n"
    )
    run = subprocess.Popen([sys.executable, str(launch)], stdout=subprocess.PIPE, text=True)
    assert run.stdout is not None and run.stdout.readline() == "started\n"
    (tmp_path / ".lock").write_text(f"{run.pid}\n")
    reaper = threading.Thread(target=run.wait)  # as its parent would, or it stays a zombie
    reaper.start()
    start = time.monotonic()
    subprocess.run(["bash", "-c", pre_stop_script("ray-head", 10, str(tmp_path))], check=True)
    reaper.join(timeout=1)
    assert saved.read_text() == "saved" and run.returncode == 143
    assert time.monotonic() - start < 8

    other = subprocess.Popen(["sleep", "20"])
    (tmp_path / ".lock").write_text(f"{other.pid}\n")
    subprocess.run(["bash", "-c", pre_stop_script("ray-head", 10, str(tmp_path))], check=True)
    assert other.poll() is None  # not the launch: not signalled
    other.kill()
    other.wait()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_worker_pods_pre_stop_waits_while_the_heads_ray_answers(tmp_path: Path) -> None:
    import os
    import socket
    import time

    from rlpost.cli.schedulers import pre_stop_script

    head = socket.create_server(("127.0.0.1", 0))
    port = head.getsockname()[1]
    env = {**os.environ, "FQ_RAY_IP": "127.0.0.1", "RAY_PORT": str(port)}
    hook = subprocess.Popen(["bash", "-c", pre_stop_script("ray-worker", 30, "/r")], env=env)
    time.sleep(1.5)
    assert hook.poll() is None  # the head still answers: the worker stays
    head.close()
    assert hook.wait(timeout=10) == 0
    env.pop("FQ_RAY_IP")  # outside KubeRay: nothing to wait for
    done = subprocess.run(["bash", "-c", pre_stop_script("ray-worker", 30, "/r")], env=env)
    assert done.returncode == 0


def test_an_evaluations_job_evaluates_in_a_run_directory_of_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """mode=eval reaches the job's launch, which would otherwise train; a RayJob's run
    directory is named for its job, so an evaluation's is not its training run's (which
    mode=eval refuses)."""
    script = tmp_path / "job.sbatch"
    status, _, err = run_main(
        ["slurm", *SEED_002, "mode=eval", "--run-dir", str(tmp_path / "run"), "--out", str(script)],
        capsys,
    )
    assert status == 0, err
    assert "hardware=h100x64 mode=eval" in script.read_text()
    manifests = {}
    for mode in ("train", "eval"):
        out = tmp_path / f"{mode}.yaml"
        argv = ["kuberay", *SEED_002, f"mode={mode}", "--image", "i:1", "--pvc", "runs"]
        status, _, err = run_main([*argv, "--out", str(out)], capsys)
        assert status == 0, err
        manifests[mode] = yaml.safe_load(out.read_text())
    entrypoints = {mode: job["spec"]["entrypoint"] for mode, job in manifests.items()}
    assert "mode=eval" in entrypoints["eval"] and "mode=eval" not in entrypoints["train"]
    names = {mode: job["metadata"]["name"] for mode, job in manifests.items()}
    assert names == {
        "train": "rlpost-glm4-5-355b-a32b-grpo-dapo",
        "eval": "rlpost-glm4-5-355b-a32b-grpo-dapo-eval",
    }
    assert f"/{names['eval']} " in entrypoints["eval"]


def test_an_evaluations_job_is_told_to_stop_a_minute_ahead_not_a_saves_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An evaluation stops at once on SIGTERM and saves nothing: its lead is the minute to
    stop, where a training run's covers a rollout's training and a save (420 s for seed 002,
    and the 5 minutes of a save for its evaluation before); the script says what the launch
    does with the signal."""
    script = tmp_path / "eval.sbatch"
    argv = ["slurm", *SEED_002, "mode=eval", "--run-dir", str(tmp_path / "run")]
    status, _, err = run_main([*argv, "--out", str(script)], capsys)
    assert status == 0, err
    text = script.read_text()
    assert "#SBATCH --signal=B:TERM@60" in text.splitlines()
    assert "stops the evaluation at once (it saves nothing)" in text
    assert "saves every finished rollout" not in text
    training = tmp_path / "train.sbatch"
    status, _, err = run_main(["slurm", *SEED_002, "--run-dir", str(tmp_path / "t"),
                               "--out", str(training)], capsys)  # fmt: skip
    assert status == 0 and "saves every finished rollout and stops" in training.read_text()
    status, _, err = run_main([*argv, "--time", "1", "--out", str(script)], capsys)
    assert status == 2 and "stop before it evaluated anything" in err, err
    rayjob = tmp_path / "eval.yaml"
    argv = ["kuberay", *SEED_002, "mode=eval", "--image", "i", "--pvc", "runs"]
    status, _, err = run_main([*argv, "--out", str(rayjob)], capsys)
    assert status == 0, err
    cluster = yaml.safe_load(rayjob.read_text())["spec"]["rayClusterSpec"]
    head = cluster["headGroupSpec"]["template"]["spec"]
    assert head["terminationGracePeriodSeconds"] == 60 + 30


def job_flags(verb: str, run_dir: Path) -> list[str]:
    """What `verb` needs beside the config to write a job of the CPU default."""
    return ["--run-dir", str(run_dir)] if verb == "slurm" else ["--image", "i", "--scratch"]


def launch_line(
    verb: str, overrides: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> str:
    """The launch a generated job runs, for the CPU default and these overrides."""
    out = tmp_path / f"job.{verb}"
    where = job_flags(verb, tmp_path / "run")
    status, _, err = run_main([verb, *overrides, *where, "--out", str(out)], capsys)
    assert status == 0, err
    if verb == "kuberay":
        return str(yaml.safe_load(out.read_text())["spec"]["entrypoint"])
    (line,) = [line for line in out.read_text().splitlines() if "launch.py" in line]
    return line


@pytest.mark.parametrize("verb", ["slurm", "kuberay"])
def test_a_scheduled_training_run_continues_its_run_directory_when_submitted_again(
    verb: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a job stopped at its time limit saves; the same job submitted again must continue, and a
    # fresh start in a run directory that holds checkpoints is refused
    assert "launch.py run.resume=auto " in launch_line(verb, [], tmp_path, capsys)
    fork = launch_line(verb, ["run.resume=/runs/a/ckpt/rollout_4"], tmp_path, capsys)
    assert "run.resume=/runs/a/ckpt/rollout_4" in fork and "run.resume=auto" not in fork


@pytest.mark.parametrize("verb", ["slurm", "kuberay"])
def test_a_scheduled_evaluation_evaluates(
    verb: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = launch_line(verb, ["mode=eval"], tmp_path, capsys)
    assert "mode=eval" in line and "run.resume" not in line


@pytest.mark.parametrize("verb", ["slurm", "kuberay"])
def test_a_mode_that_runs_nothing_is_not_scheduled(
    verb: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [verb, "mode=plan", *job_flags(verb, tmp_path), "--out", str(tmp_path / "job")]
    status, _, err = run_main(argv, capsys)
    assert status == 2 and "mode = 'plan'" in err and "python launch.py mode=plan" in err
    assert "Traceback" not in err and not (tmp_path / "job").exists()


@pytest.mark.parametrize("verb", ["slurm", "kuberay"])
def test_a_run_that_saves_nothing_on_sigterm_is_told_to_stop_a_minute_ahead(
    verb: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """run.on_sigterm: stop ends the launch at once on SIGTERM and saves nothing (the plan's
    runtime.on_sigterm): its job gives it the minute to stop, where one that saves gives it a
    rollout's training and a save; the job file says which."""
    out = tmp_path / f"job.{verb}"
    where = ["--run-dir", str(tmp_path / "run")] if verb == "slurm" else ["--image", "i"]
    where += [] if verb == "slurm" else ["--pvc", "runs"]
    argv = [verb, *SEED_002, "run.on_sigterm=stop", *where, "--out", str(out)]
    status, _, err = run_main(argv, capsys)
    assert status == 0, err
    text = out.read_text()
    assert "saves every finished rollout" not in text
    assert "stops at once (run.on_sigterm: stop: it saves nothing" in text
    if verb == "slurm":
        assert "#SBATCH --signal=B:TERM@60" in text.splitlines()
    else:
        cluster = yaml.safe_load(text)["spec"]["rayClusterSpec"]
        head = cluster["headGroupSpec"]["template"]["spec"]
        assert head["terminationGracePeriodSeconds"] == 60 + 30
        assert "gives the launch 60 s" in text


@pytest.mark.parametrize("verb", ["slurm", "kuberay"])
def test_a_job_its_launch_would_refuse_is_not_written(
    verb: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The launch's checks that do not depend on this machine run before the job is written:
    qwen3-8b does not fit the CPU default's memory, which its launch refuses (exit 2)."""
    out = tmp_path / f"job.{verb}"
    argv = [verb, "model=qwen3-8b", *job_flags(verb, tmp_path / "run"), "--out", str(out)]
    status, _, err = run_main(argv, capsys)
    assert status == 2 and "memory problem" in err and "Traceback" not in err, err
    assert not out.exists()
    status, _, err = run_main([*argv, "plan.memory_check=warn"], capsys)
    assert status == 0 and out.exists(), err


@pytest.mark.parametrize("verb", ["slurm", "kuberay"])
def test_a_job_file_takes_no_local_checks_as_rlpost_validate_does(
    verb: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job written on one machine for a cluster: `--no-local-checks` from the validate line
    is taken (a job's command checks nothing of this machine), and the file is the same."""
    files = []
    for extra in ([], ["--no-local-checks"]):
        out = tmp_path / f"job{len(extra)}.{verb}"
        argv = [verb, *extra, *job_flags(verb, tmp_path / "run"), "--out", str(out)]
        status, _, err = run_main(argv, capsys)
        assert status == 0, err
        files.append(out.read_text())
    assert files[0] == files[1]


def test_the_sbatch_script_names_a_config_dir_given_relative_by_its_full_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script runs launch.py in --rlpost-dir: an experiment file named from its own folder
    (`rlpost slurm my_eval.yaml`, config dir `.`) would be looked for in rlpost's checkout."""
    exp = tmp_path / "exps"
    exp.mkdir()
    (exp / "my_eval.yaml").write_text("defaults:\n  - config\n  - _self_\nmode: eval\n")
    monkeypatch.chdir(exp)
    out = tmp_path / "job.sbatch"
    argv = ["slurm", "my_eval.yaml", "--run-dir", str(tmp_path / "run"), "--out", str(out)]
    status, _, err = run_main(argv, capsys)
    assert status == 0, err
    (line,) = [line for line in out.read_text().splitlines() if "launch.py" in line]
    assert f"launch.py --config-dir {exp} --config-name my_eval mode=eval" in line


@pytest.mark.parametrize("verb", ["slurm", "kuberay"])
def test_a_sweep_is_refused_with_a_job_per_value_as_the_fix(
    verb: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job runs one launch: a sweep is told to be written as a job per value, where the fix
    was `python launch.py -m ...`, a launch on this machine."""
    out = tmp_path / f"job.{verb}"
    sweep = "recipe.optim.lr=1e-6,2e-6"
    argv = [verb, sweep, *job_flags(verb, tmp_path / "run"), "--out", str(out)]
    status, _, err = run_main(argv, capsys)
    assert status == 2 and "Traceback" not in err and not out.exists()
    assert "is a sweep, one run per value, and a scheduler's job runs one launch" in err
    assert f"write a job per value (rlpost {verb} ... recipe.optim.lr=1e-06 for the first)" in err
    assert "launch.py -m" not in err


@pytest.mark.parametrize("verb", ["slurm", "kuberay"])
@pytest.mark.parametrize(
    ("override", "fix"),
    [
        ("run.dir=/shared/runs/x", {"slurm": "give it as --run-dir /shared/runs/x"}),
        ("run.ray_address=auto", {}),
        ("+run.node_address=10.0.0.9", {}),
    ],
)
def test_an_override_of_what_the_job_sets_is_refused_not_dropped(
    verb: str,
    override: str,
    fix: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The job's script gives its launch the run directory and the head of the cluster it
    starts after the overrides: the user's value would be dropped without a word."""
    out = tmp_path / f"job.{verb}"
    argv = [verb, override, *job_flags(verb, tmp_path / "run"), "--out", str(out)]
    status, _, err = run_main(argv, capsys)
    assert status == 2 and "Traceback" not in err and not out.exists()
    key, value = override.lstrip("+").split("=")
    assert f"{key} = {value!r}" in err and "would be dropped without a word" in err
    assert fix.get(verb, "fix: ") in err


@pytest.mark.parametrize("verb", ["slurm", "kuberay"])
def test_out_dash_prints_the_job_as_rlpost_new_does(
    verb: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = [verb, *job_flags(verb, tmp_path / "run"), "--out", "-"]
    status, out, err = run_main(argv, capsys)
    assert status == 0, err
    assert ("#!/bin/bash" if verb == "slurm" else "kind: RayJob") in out
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("verb", ["slurm", "kuberay"])
def test_mode_train_over_an_evaluations_file_reaches_the_launch(
    verb: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """mode=train on the command line over an experiment file's `mode: eval` makes a training
    job; its launch must get mode=train too, or it composes the file's mode and evaluates."""
    exp = tmp_path / "my_eval.yaml"
    exp.write_text("defaults:\n  - config\n  - _self_\nmode: eval\n")
    line = launch_line(verb, [str(exp), "mode=train"], tmp_path, capsys)
    assert "--config-name my_eval mode=train run.resume=auto" in line
    assert "mode=eval" not in launch_line(verb, [str(exp), "mode=train"], tmp_path, capsys)
    assert "--config-name my_eval mode=eval" in launch_line(verb, [str(exp)], tmp_path, capsys)


def test_a_rayjob_says_where_its_pods_read_the_config_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The RayJob's launch reads --config-dir in the pod, from --workdir: an experiment file
    named from its own folder is read from the image's rlpost folder, which the header says;
    a job of rlpost's own configs says nothing of it."""
    (tmp_path / "my_eval.yaml").write_text("defaults:\n  - config\n  - _self_\nmode: eval\n")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "job.yaml"
    argv = ["kuberay", "--image", "i", "--scratch", "--workdir", "/app", "--out", str(out)]
    status, _, err = run_main([*argv[:1], "my_eval.yaml", *argv[1:]], capsys)
    assert status == 0, err
    assert "# The launch reads --config-dir . in the pod (/app): the image" in out.read_text()
    status, _, err = run_main(argv, capsys)
    assert status == 0 and "--config-dir" not in out.read_text(), err
