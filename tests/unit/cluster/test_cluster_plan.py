"""Matching a Ray cluster to a hardware profile before anything is reserved, and the
settings and preflight that decide which cluster a run uses."""

from __future__ import annotations

import time

import pytest

from rlpost.config.loader import compose_run_config
from rlpost.errors import UserError
from rlpost.plan import build_plan
from rlpost.plan.cluster import (
    NodeInfo,
    check_capacity,
    check_cluster_source,
    choose_nodes,
    nodes_from_ray,
    paths_for_the_cluster,
)
from rlpost.preflight.cluster import check_cluster
from rlpost.runtime.netif import interface_for
from rlpost.schema import HardwareConfig

H100X64 = HardwareConfig(
    name="h100x64",
    num_nodes=8,
    gpus_per_node=8,
    gpu_memory_gib=80,
    peak_bf16_tflops=989,
    host_memory_gib=2048,
)
CPU2X2 = HardwareConfig(
    name="cpu2x2",
    kind="cpu",
    num_nodes=2,
    gpus_per_node=2,
    gpu_memory_gib=8,
    peak_bf16_tflops=0.1,
    host_memory_gib=16,
)


def gpu_nodes(*sizes: int) -> list[NodeInfo]:
    return [NodeInfo(f"10.0.0.{i + 1}", gpus, 64) for i, gpus in enumerate(sizes)]


def message(exc: pytest.ExceptionInfo[UserError]) -> str:
    return exc.value.render()


def test_one_node_cluster_for_an_eight_node_profile_says_what_is_missing() -> None:
    with pytest.raises(UserError) as exc:
        choose_nodes(H100X64, gpu_nodes(8), "10.0.0.1", 64)
    text = message(exc)
    assert "the cluster has 1 node with 8 GPUs; hardware=h100x64 needs 8 nodes x 8 GPUs" in text
    assert "add 7 node(s) with 8 GPUs" in text


def test_mixed_nodes_are_described_and_small_ones_do_not_count() -> None:
    with pytest.raises(UserError) as exc:
        choose_nodes(H100X64, gpu_nodes(8, 8, 4, 8, 8, 8, 8, 8), "10.0.0.1", 64)
    assert "8 nodes (7 with 8 GPUs, 1 with 4 GPUs)" in message(exc)


def test_the_launch_node_is_plan_node_zero_and_the_others_follow_by_address() -> None:
    nodes = [NodeInfo(a, 8, 64) for a in ("10.0.0.10", "10.0.0.9", "10.0.0.2", "10.0.0.3")]
    chosen = choose_nodes(H100X64.model_copy(update={"num_nodes": 3}), nodes, "10.0.0.3", 24)
    assert [n.address for n in chosen] == ["10.0.0.3", "10.0.0.2", "10.0.0.9"]


def test_a_run_on_fewer_slots_than_the_profile_needs_only_the_nodes_it_uses() -> None:
    chosen = choose_nodes(H100X64, gpu_nodes(8, 8), "10.0.0.1", 12)
    assert [n.address for n in chosen] == ["10.0.0.1", "10.0.0.2"]


def test_gpu_nodes_with_fewer_ray_cpus_than_gpus_are_refused_not_waited_for() -> None:
    """Each GPU's bundle reserves a CPU: a node started with --num-cpus below its GPU count
    could never hold its bundles, and would leave the reservation waiting."""
    short = [
        NodeInfo(n.address, 8, 4) if n.address == "10.0.0.3" else n for n in gpu_nodes(*[8] * 8)
    ]
    with pytest.raises(UserError) as exc:
        choose_nodes(H100X64, short, "10.0.0.1", 64)
    text = message(exc)
    assert "node(s) 10.0.0.3 (4) have the GPUs but fewer CPUs in Ray than 8" in text
    assert "--num-cpus of at least 8" in text
    with pytest.raises(UserError) as exc:
        choose_nodes(H100X64, short, "10.0.0.3", 8)
    assert "plan node 0" in message(exc) and "10.0.0.3 (4)" in message(exc)
    assert len(choose_nodes(H100X64, short, "10.0.0.1", 56)) == 7  # seven nodes suffice
    with pytest.raises(UserError) as exc:  # the preflight's check, before joining the cluster
        check_capacity(H100X64, short, 64)
    assert "10.0.0.3 (4) have the GPUs but fewer CPUs" in message(exc)


def test_a_launch_node_without_gpus_is_refused_with_the_reason() -> None:
    with pytest.raises(UserError) as exc:
        choose_nodes(H100X64, [NodeInfo("10.0.0.1", 0, 8), *gpu_nodes(8)[1:]], "10.0.0.1", 8)
    assert "plan node 0 (router, driver, train rank 0) is that node" in message(exc)


def test_a_launch_from_outside_the_cluster_names_run_node_address() -> None:
    with pytest.raises(UserError) as exc:
        choose_nodes(H100X64, gpu_nodes(8), "192.168.1.5", 8)
    assert "run.node_address" in message(exc)


def test_cpu_profiles_count_cpus_as_slots() -> None:
    nodes = [NodeInfo("127.0.0.2", 0, 2), NodeInfo("127.0.0.3", 0, 2)]
    assert [n.address for n in choose_nodes(CPU2X2, nodes, "127.0.0.2", 4)] == [
        "127.0.0.2",
        "127.0.0.3",
    ]
    with pytest.raises(UserError) as exc:
        choose_nodes(CPU2X2, nodes[:1], "127.0.0.2", 4)
    assert "needs 2 nodes x 2 CPUs" in message(exc)


def test_nodes_from_ray_keeps_the_live_ones() -> None:
    entries = [
        {"Alive": True, "NodeManagerAddress": "10.0.0.1", "Resources": {"GPU": 8.0, "CPU": 64}},
        {"Alive": False, "NodeManagerAddress": "10.0.0.2", "Resources": {"GPU": 8.0}},
        {"Alive": True, "NodeManagerAddress": "10.0.0.3", "Resources": {"CPU": 4.0}},
    ]
    assert nodes_from_ray(entries) == [NodeInfo("10.0.0.1", 8, 64), NodeInfo("10.0.0.3", 0, 4)]


def compose(*overrides: str):  # type: ignore[no-untyped-def]
    cfg, _ = compose_run_config(list(overrides))
    return cfg


def test_a_multi_node_profile_with_no_cluster_to_join_is_refused_before_ray() -> None:
    cfg = compose("model=glm4.5-355b-a32b", "hardware=h100x64")
    issues = check_cluster_source(cfg, environ={})
    assert [i.key for i in issues] == ["run.ray_address"]
    assert "rlpost cluster up --hostfile FILE" in issues[0].fix
    assert check_cluster_source(cfg, environ={"RAY_ADDRESS": "10.0.0.1:6379"}) == []
    joined = compose("model=glm4.5-355b-a32b", "hardware=h100x64", "run.ray_address=auto")
    assert check_cluster_source(joined, environ={}) == []


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("ray://10.0.0.1:10001", "Ray Client (ray://) runs the launch's driver outside"),
        ("http://127.0.0.1:8265", "that is the Ray dashboard's address"),
        ("HTTPS://head:443", "that is the Ray dashboard's address"),
    ],
)
def test_a_ray_address_from_the_environment_that_no_launch_can_join_is_refused(
    address: str, why: str
) -> None:
    """RAY_ADDRESS as Ray Client or `ray job submit` users set it: the launch would not join
    the cluster with it (the config's run.ray_address is checked as it validates)."""
    cfg = compose("model=glm4.5-355b-a32b", "hardware=h100x64")
    (issue,) = check_cluster_source(cfg, environ={"RAY_ADDRESS": address})
    assert (issue.key, issue.value, str(issue.location)) == (
        "RAY_ADDRESS",
        address,
        "the environment",
    )
    assert why in issue.message
    assert "set it to the head's GCS host:port (e.g. 10.0.0.1:6379)" in issue.fix
    # the config's address wins over the environment's
    joined = compose("model=glm4.5-355b-a32b", "hardware=h100x64", "run.ray_address=auto")
    assert check_cluster_source(joined, environ={"RAY_ADDRESS": address}) == []


def test_relative_paths_reach_a_joined_clusters_workers_from_the_launchs_folder() -> None:
    """A Ray worker runs in the folder its node's `ray start` ran in, not the launch's: a
    relative path the preflight found here is made absolute before any actor gets it."""
    paths = (
        "model.hf_checkpoint=models/qwen3-4b",
        "model.ref_load=/data/ref",
        "recipe.data.prompt_data=data/train.jsonl",
        "run.dir=runs/../runs/exp1",
        "run.resume=auto",
    )
    joined = paths_for_the_cluster(compose(*paths, "run.ray_address=auto"), "/home/me/work")
    assert joined.model.hf_checkpoint == "/home/me/work/models/qwen3-4b"
    assert joined.model.ref_load == "/data/ref"
    assert joined.recipe.data.prompt_data == "/home/me/work/data/train.jsonl"
    assert (joined.run.dir, joined.run.resume) == ("/home/me/work/runs/exp1", "auto")
    assert joined.model.load is None
    by_env = paths_for_the_cluster(compose(*paths), "/w", environ={"RAY_ADDRESS": "h:6379"})
    assert by_env.model.hf_checkpoint == "/w/models/qwen3-4b"
    alone = compose(*paths)  # a Ray the launch starts runs its workers in the launch's folder
    assert paths_for_the_cluster(alone, "/w", environ={}) is alone


def test_a_ray_address_from_the_environment_is_located_there_and_may_be_unset(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A RAY_ADDRESS left exported from a cluster's shell: the refusal says it came from the
    environment (not '(default)'), and on a one-node profile that unsetting it starts Ray
    here."""
    from rlpost.cli.main import main

    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:9")
    with pytest.raises(SystemExit) as exit_:
        main(["validate", "hardware=cpu"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "RAY_ADDRESS = '127.0.0.1:9'   (the environment)" in err
    assert "or unset RAY_ADDRESS: hardware=cpu is one node" in err
    cfg = compose("model=glm4.5-355b-a32b", "hardware=h100x64")  # several nodes: it must join
    (issue,) = check_cluster(cfg, build_plan(cfg))
    assert issue.key == "RAY_ADDRESS" and "unset" not in issue.fix


def test_a_head_that_does_not_answer_is_refused_in_seconds() -> None:
    cfg = compose("run.ray_address=127.0.0.1:9")  # the discard port: nothing listens
    started = time.monotonic()
    issues = check_cluster(cfg, build_plan(cfg))
    assert time.monotonic() - started < 5
    assert [i.key for i in issues] == ["run.ray_address"]
    assert "no Ray head answers at 127.0.0.1:9" in issues[0].message


def test_the_preflight_compares_the_clusters_nodes_before_joining_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The GCS's node list (read without joining) against the profile: the refusal comes
    from the preflight, before torch or a Ray driver."""
    from rlpost.runtime import gcs

    cfg = compose("model=glm4.5-355b-a32b", "hardware=h100x64", "run.ray_address=auto")
    plan = build_plan(cfg)
    one_node = [gcs.GcsNode("10.0.0.1", True, 8, 224), gcs.GcsNode("10.0.0.2", False, 8, 224)]
    monkeypatch.setattr(gcs, "gcs_address", lambda address: "10.0.0.1:6379")  # auto finds it
    monkeypatch.setattr(gcs, "read_gcs_nodes", lambda address: one_node)
    issues = check_cluster(cfg, plan)
    assert [i.key for i in issues] == ["hardware"]
    assert "the cluster has 1 node with 8 GPUs; hardware=h100x64 needs 8 nodes x 8 GPUs" in (
        issues[0].message
    )
    eight = [gcs.GcsNode(f"10.0.0.{i}", True, 8, 224) for i in range(1, 9)]
    monkeypatch.setattr(gcs, "read_gcs_nodes", lambda address: eight)
    assert check_cluster(cfg, plan) == []

    def unreachable(address: str) -> list[gcs.GcsNode]:
        raise ConnectionError("no GCS")

    monkeypatch.setattr(gcs, "read_gcs_nodes", unreachable)
    assert check_cluster(cfg, plan) == []  # joining reports it, in Ray's words


@pytest.mark.parametrize(
    "ray_says",
    [
        "Could not find any running Ray instance. Please specify the one to connect to",
        "Found multiple active Ray instances: {'a:1', 'b:2'}. Please specify the one",
    ],
)
def test_auto_with_no_single_cluster_on_this_machine_is_refused_before_joining(
    monkeypatch: pytest.MonkeyPatch, ray_says: str
) -> None:
    """`auto` finds the cluster from this machine (ray start's address file, a running GCS):
    with none, or several, the join would fail once torch and Ray are loaded."""
    from rlpost.runtime import gcs

    def no_single_cluster(address: str) -> str:
        raise ConnectionError(ray_says)

    monkeypatch.setattr(gcs, "gcs_address", no_single_cluster)
    cfg = compose("run.ray_address=auto")
    issues = check_cluster(cfg, build_plan(cfg))
    assert [(i.key, i.value) for i in issues] == [("run.ray_address", "auto")]
    assert f"Ray finds no single one here ({ray_says.split('. ')[0]})" in issues[0].message
    assert "rlpost cluster up --hostfile FILE" in issues[0].fix


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("run.ray_address=10.0.0.1", "is not host:port"),
        ("run.ray_address=head:99999", "is not host:port"),
        ("run.node_address=node-1", "is not an IP address"),
        ("run.ray_address=ray://10.0.0.1:10001", "Ray Client (ray://) runs the launch's driver"),
        ("run.ray_address=http://10.0.0.1:8265", "that is the Ray dashboard's address"),
    ],
)
def test_bad_addresses_are_refused_by_validation(override: str, expected: str) -> None:
    with pytest.raises(UserError) as exc:
        compose(override)
    assert expected in exc.value.render()
    assert override.split("=")[0] in exc.value.render()


def test_the_plan_says_which_cluster_it_joins() -> None:
    from rlpost.plan import render_plan

    text = render_plan(build_plan(compose("run.ray_address=10.0.0.1:6379")), "table")
    assert "joins the one at 10.0.0.1:6379" in text


def test_the_interface_of_a_loopback_node_address_is_lo() -> None:
    assert interface_for("127.0.0.3") == "lo"
    assert interface_for("not-an-ip") is None


def test_seed_002_bundles_are_pinned_eight_per_node_in_plan_order() -> None:
    """The glm4.5 seed on 8 x 8 GPUs: plan node n's eight bundles ask for node n's address,
    the launch node first; nothing is reserved or built here."""
    from rlpost.runtime.cluster import Cluster

    cfg = compose("model=glm4.5-355b-a32b", "hardware=h100x64", "run.ray_address=auto")
    plan = build_plan(cfg)
    used = plan.placement.train_gpus + (
        0 if plan.placement.colocate else plan.placement.rollout_gpus
    )
    cluster = Cluster(cfg.hardware, used, cfg)
    nodes = [NodeInfo(f"10.0.0.{i}", 8, 224) for i in (5, 1, 2, 3, 4, 6, 7, 8)]
    cluster.nodes = choose_nodes(cfg.hardware, nodes, "10.0.0.5", used)
    bundles = cluster._bundles()
    assert len(bundles) == used == 64
    order = ["10.0.0.5", "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.6"]
    order += ["10.0.0.7", "10.0.0.8"]
    for index, bundle in enumerate(bundles):
        assert bundle["GPU"] == 1.0
        assert f"node:{order[index // 8]}" in bundle, (index, bundle)


def test_settings_with_nothing_to_act_on_are_refused() -> None:
    (issue,) = check_cluster_source(compose("run.node_address=10.0.0.2"), environ={})
    assert issue.key == "run.node_address" and "run.ray_address" in issue.fix
    with pytest.raises(UserError) as exc:
        compose("hardware.socket_ifname=eth0")
    assert "hardware.socket_ifname" in exc.value.render()
    assert "stays on loopback" in exc.value.render()
    compose("hardware=h100x16", "model=qwen3-4b", "hardware.socket_ifname=eth0")
