"""The SGLang server commands built for the four seed runs match the seeds' SGLANG_ARGS.

Each seed's SGLANG_ARGS are written out below as the seed gives them (slime spells SGLang
options `--sglang-<name>` and the engine size `--rollout-num-gpus-per-engine`). Every one of
them must reach each engine's command with the same values, and nothing else may be there
beyond what rlpost derives per engine from the placement.
"""

from __future__ import annotations

import functools
from collections import Counter, defaultdict

import pytest

from rlpost.backends.sglang.launch import (
    ENGINE_BACKENDS,
    EngineSpec,
    OptionRenderError,
    engine_commands,
    engine_specs,
    render_option,
    render_options,
)
from rlpost.config.loader import compose_run_config
from rlpost.config.sglang_options import load_sglang_options
from rlpost.errors import UserError
from rlpost.plan import build_plan
from rlpost.plan.slime_args import SLIME_SGLANG_NAMES

CUDA_GRAPH_BS = "1 2 4 8 " + " ".join(str(n) for n in range(16, 129, 8))  # $(seq 16 8 128)

SEED_SGLANG_ARGS = {
    "glm4-9b": "--rollout-num-gpus-per-engine 2",
    "qwen3-4b": "--rollout-num-gpus-per-engine 2 --sglang-mem-fraction-static 0.7",
    "glm4.5-355b-a32b": (
        "--rollout-num-gpus-per-engine 32 --sglang-mem-fraction-static 0.7 "
        "--sglang-enable-dp-attention --sglang-dp-size 4"
    ),
    "glm4.7-flash": (
        "--rollout-num-gpus-per-engine 8 --sglang-mem-fraction-static 0.7 "
        "--sglang-enable-dp-attention --sglang-dp-size 8 --sglang-enable-dp-lm-head "
        "--sglang-moe-dense-tp-size 1 --sglang-cuda-graph-max-bs 16 "
        "--sglang-max-running-requests 64"
    ),
}
SEED_HARDWARE = {
    "glm4-9b": "h100x8",
    "qwen3-4b": "h100x8",
    "glm4.5-355b-a32b": "h100x64",
    "glm4.7-flash": "h100x8",
}
# The seeds' variants, as layout overrides plus the SGLANG_ARGS they add or change.
GLM45_FP8 = (
    [
        "layout.rollout.sglang.dp_size=32",
        "+layout.rollout.sglang.ep_size=32",
        "+layout.rollout.sglang.moe_dense_tp_size=1",
        "+layout.rollout.sglang.enable_dp_lm_head=true",
        f"+layout.rollout.sglang.cuda_graph_bs_decode=[{CUDA_GRAPH_BS.replace(' ', ',')}]",
        "+layout.rollout.sglang.disable_radix_cache=true",
        "+layout.rollout.sglang.moe_a2a_backend=deepep",
        "+layout.rollout.sglang.deepep_mode=auto",
    ],
    "--rollout-num-gpus-per-engine 32 --sglang-mem-fraction-static 0.7 "
    "--sglang-enable-dp-attention --sglang-dp-size 32 --sglang-ep-size 32 "
    "--sglang-moe-dense-tp-size 1 --sglang-enable-dp-lm-head "
    f"--sglang-cuda-graph-bs {CUDA_GRAPH_BS} "
    "--sglang-disable-radix-cache --sglang-moe-a2a-backend deepep --sglang-deepep-mode auto",
)
GLM47_MTP = (
    [
        "+layout.rollout.sglang.speculative_algorithm=EAGLE",
        "+layout.rollout.sglang.speculative_num_steps=2",
        "+layout.rollout.sglang.speculative_eagle_topk=1",
        "+layout.rollout.sglang.speculative_num_draft_tokens=3",
    ],
    SEED_SGLANG_ARGS["glm4.7-flash"] + " --sglang-speculative-algorithm EAGLE "
    "--sglang-speculative-num-steps 2 --sglang-speculative-eagle-topk 1 "
    "--sglang-speculative-num-draft-tokens 3",
)
# What rlpost adds to each engine's command from the placement and the run.
PLACEMENT_FLAGS = {
    "--model-path", "--host", "--port", "--base-gpu-id", "--random-seed", "--nccl-port",
    "--nnodes", "--node-rank", "--dist-init-addr", "--enable-memory-saver",
}  # fmt: skip

Flags = dict[str, tuple[str, ...]]


def parse_flags(args: list[str]) -> Flags:
    """['--a', '1', '--b', '--c', 'x', 'y'] -> {'--a': ('1',), '--b': (), '--c': ('x', 'y')}."""
    flags: dict[str, list[str]] = {}
    current = None
    for token in args:
        if token.startswith("--"):
            assert token not in flags, f"{token} given twice"
            current = flags.setdefault(token, [])
        else:
            assert current is not None, f"value {token!r} before any flag"
            current.append(token)
    return {name: tuple(values) for name, values in flags.items()}


def seed_flags_as_sglang(seed_args: str) -> Flags:
    """slime's spelling -> SGLang's: --sglang-x -> --x (0.5.2x names), engine size -> tp."""
    renamed = {
        old.replace("_", "-"): new.replace("_", "-") for new, old in SLIME_SGLANG_NAMES.items()
    }
    flags = {}
    for name, values in parse_flags(seed_args.split()).items():
        if name == "--rollout-num-gpus-per-engine":
            flags["--tp-size"] = values
        else:
            option = name.removeprefix("--sglang-")
            flags["--" + renamed.get(option, option)] = values
    return flags


@functools.cache
def commands_for(model: str, *overrides: str) -> tuple[bool, list[list[list[str]]]]:
    """(colocated, commands per engine per node) for a seed, nodes addressed 10.0.0.<n>."""
    cfg = compose_run_config(
        [f"model={model}", "recipe=grpo_dapo", f"hardware={SEED_HARDWARE[model]}", *overrides]
    )[0]
    plan = build_plan(cfg)
    specs = engine_specs(
        cfg,
        plan,
        backend="sglang",
        node_addresses=[f"10.0.0.{n}" for n in range(cfg.hardware.num_nodes)],
        log_dir="/tmp/logs",
        memory_saver=plan.placement.colocate,
    )
    return plan.placement.colocate, engine_commands(specs)


def check_against_seed(commands: list[list[list[str]]], seed_args: str) -> list[Flags]:
    expected = seed_flags_as_sglang(seed_args)
    parsed = []
    for per_node in commands:
        for command in per_node:
            assert command[1:3] == ["-m", "sglang.launch_server"]
            flags = parse_flags(command[3:])
            for name, values in expected.items():
                assert flags.get(name) == values, (
                    f"{name}: seed {values}, command {flags.get(name)}"
                )
            extra = set(flags) - set(expected)
            assert extra <= PLACEMENT_FLAGS, (
                f"flags the seed does not set: {extra - PLACEMENT_FLAGS}"
            )
            parsed.append(flags)
    return parsed


@pytest.mark.parametrize("model", sorted(SEED_SGLANG_ARGS))
def test_seed_commands_carry_the_seed_sglang_args(model: str) -> None:
    colocate, commands = commands_for(model)
    for flags in check_against_seed(commands, SEED_SGLANG_ARGS[model]):
        # colocated engines release memory around training: SGLang's memory saver is on
        assert ("--enable-memory-saver" in flags) == colocate


def test_seed_variants_fp8_glm45_and_mtp_glm47() -> None:
    _, fp8 = commands_for("glm4.5-355b-a32b", *GLM45_FP8[0])
    check_against_seed(fp8, GLM45_FP8[1])
    _, mtp = commands_for("glm4.7-flash", *GLM47_MTP[0])
    check_against_seed(mtp, GLM47_MTP[1])


def test_single_node_engines_bind_localhost_on_distinct_ports_and_gpus() -> None:
    _, glm9 = commands_for("glm4-9b")  # decoupled: 4 train GPUs, then 2 engines of 2
    flags = [parse_flags(per_node[0][3:]) for per_node in glm9]
    assert [f["--base-gpu-id"] for f in flags] == [("4",), ("6",)]
    assert {f["--host"] for f in flags} == {("127.0.0.1",)}
    assert "--nnodes" not in flags[0] and "--dist-init-addr" not in flags[0]
    _, qwen = commands_for("qwen3-4b")  # colocated: 4 engines of 2 from GPU 0
    flags = [parse_flags(per_node[0][3:]) for per_node in qwen]
    assert [f["--base-gpu-id"][0] for f in flags] == ["0", "2", "4", "6"]
    ports = [f["--port"][0] for f in flags] + [f["--nccl-port"][0] for f in flags]
    assert len(set(ports)) == len(ports)


def test_glm45_engines_of_32_span_4_nodes_with_dist_init_and_node_ranks() -> None:
    _, commands = commands_for("glm4.5-355b-a32b")
    assert [len(per_node) for per_node in commands] == [4, 4]
    used: dict[str, Counter[str]] = defaultdict(Counter)
    for engine, per_node in enumerate(commands):
        head = 4 * engine
        for rank, command in enumerate(per_node):
            flags = parse_flags(command[3:])
            node = head + rank
            assert flags["--nnodes"] == ("4",) and flags["--node-rank"] == (str(rank),)
            assert flags["--dist-init-addr"] == (f"10.0.0.{head}:20002",)
            # multi-node hardware: each process binds its own node's address
            assert flags["--host"] == (f"10.0.0.{node}",)
            assert flags["--tp-size"] == ("32",) and flags["--base-gpu-id"] == ("0",)
            used[flags["--host"][0]].update([flags["--port"][0]])
    assert all(count == 1 for ports in used.values() for count in ports.values())


def test_option_rendering_follows_sglang_types() -> None:
    table = load_sglang_options().options
    assert render_option("enable_dp_attention", True, table["enable_dp_attention"], "--x") == [
        "--x"
    ]
    assert render_option("enable_dp_attention", False, table["enable_dp_attention"], "--x") == []
    assert render_option("gc_threshold", [1, 2], table["gc_threshold"], "--g") == ["--g", "1", "2"]
    assert render_options([("json_model_override_args", '{"a": 1}')]) == [
        "--json-model-override-args",
        '{"a": 1}',
    ]
    assert render_options([("default_chat_template_kwargs", {"t": True})]) == [
        "--default-chat-template-kwargs",
        '{"t": true}',
    ]
    assert render_options([("max_running_requests", None)]) == []
    with pytest.raises(OptionRenderError, match="custom_sigquit_handler"):
        render_options([("custom_sigquit_handler", "x")])


def test_backend_registry_starts_the_cpu_engine_or_sglang() -> None:
    spec = EngineSpec(
        index=1, backend="cpu", model_path="/m", host="127.0.0.1", port=20004, seed=7,
        log_path="/tmp/e.log", startup_timeout_s=60, num_threads=2, max_batch_size=32,
        options=(("mem_fraction_static", 0.7),),
    )  # fmt: skip
    command = ENGINE_BACKENDS["cpu"].command(spec, 20005)
    assert command[1:3] == ["-m", "rlpost.backends.cpu_engine"]
    flags = parse_flags(command[3:])
    assert flags["--port"] == ("20005",) and flags["--num-threads"] == ("2",)
    assert "--mem-fraction-static" not in flags  # SGLang-only options stay with SGLang
    assert ENGINE_BACKENDS["cpu"].env(spec)["OMP_NUM_THREADS"] == "2"
    assert ENGINE_BACKENDS["sglang"].health_path == "/health_generate"


@pytest.mark.parametrize(
    ("overrides", "nice"),
    [
        ((), 0),  # colocated: engines and trainers take turns
        (("recipe.loop.mode=fully_async",), 10),
        (("recipe.loop.mode=async",), 10),
        (("recipe.loop.mode=sync",), 0),  # decoupled, but generation waits for training
        # an evaluation trains nothing: its engines are the critical path
        (("recipe.loop.mode=async", "mode=eval"), 0),
    ],
)
def test_cpu_engines_yield_to_the_trainers_when_generation_runs_ahead(
    overrides: tuple[str, ...], nice: int
) -> None:
    decoupled = ("layout.colocate=false", "layout.train.num_gpus=1", "layout.rollout.num_gpus=1")
    cfg, _ = compose_run_config([*(decoupled if overrides else ()), *overrides])
    plan = build_plan(cfg)
    assert plan.runtime.engine_nice == nice
    specs = engine_specs(cfg, plan, backend="cpu", node_addresses=["127.0.0.1"], log_dir="/logs")
    flags = parse_flags(engine_commands(specs)[0][0][3:])
    assert flags.get("--nice") == ((str(nice),) if nice else None)


def test_the_cpu_engine_applies_its_niceness_before_it_loads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rlpost.backends.cpu_engine import server

    applied: list[int] = []
    monkeypatch.setattr(server.os, "nice", applied.append)
    monkeypatch.setattr(server.logging, "basicConfig", lambda **kwargs: None)
    server.parse_args(["--model-path", "/m", "--nice", "10"])
    server.parse_args(["--model-path", "/m"])
    assert applied == [10]


def test_sglang_gets_the_engine_key_as_its_api_key_and_the_cpu_engine_from_its_environment() -> (
    None
):
    assert ENGINE_BACKENDS["sglang"].key_args("k") == ["--api-key", "k"]
    assert ENGINE_BACKENDS["cpu"].key_args("k") == []


@pytest.mark.parametrize("deterministic", [False, True])
def test_a_deterministic_run_gives_the_cpu_engine_one_sequence_per_forward(
    deterministic: bool,
) -> None:
    """Batched logits differ in their last bits with what a row is batched with; under
    run.deterministic each row is computed alone. SGLang keeps its batch size (its own
    deterministic inference is an engine option)."""
    cfg, _ = compose_run_config([f"run.deterministic={str(deterministic).lower()}"])
    plan = build_plan(cfg)
    specs = engine_specs(cfg, plan, backend="cpu", node_addresses=["127.0.0.1"], log_dir="/logs")
    flags = parse_flags(engine_commands(specs)[0][0][3:])
    expected = 1 if deterministic else cfg.engine.max_batch_size
    assert flags["--max-batch-size"] == (str(expected),)
    sglang = engine_specs(
        cfg, plan, backend="sglang", node_addresses=["127.0.0.1"], log_dir="/logs"
    )
    assert sglang[0][0].max_batch_size == cfg.engine.max_batch_size


def test_a_deterministic_cpu_run_refuses_an_engine_batch_size_it_would_not_use() -> None:
    cfg, _ = compose_run_config(["run.deterministic=true", "engine.max_batch_size=32"])
    with pytest.raises(UserError) as refused:
        build_plan(cfg)
    (issue,) = refused.value.issues
    assert (issue.key, issue.value) == ("engine.max_batch_size", 32)
    assert "one sequence per forward" in issue.message
    deterministic, _ = compose_run_config(["run.deterministic=true"])
    assert any("one sequence per forward" in n for n in build_plan(deterministic).notes)
    batched, _ = compose_run_config(["engine.max_batch_size=32"])
    build_plan(batched)
