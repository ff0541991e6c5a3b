"""How each engine's server process starts: one EngineSpec per (engine, node), its command.

Two backends speak SGLang's HTTP API and are started the same way: SGLang itself
(`python -m sglang.launch_server`, GPU only) and rlpost's CPU engine. `engine_specs` turns a
plan into specs; `ENGINE_BACKENDS` turns a spec into the command line. Nothing here imports
sglang, torch or ray, so commands can be built and checked anywhere.

An engine larger than a node runs one SGLang process per node: every process gets the same
--tp-size and --dist-init-addr (the head node's address), its own --node-rank, and only the
head (node rank 0) serves HTTP.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlpost.config.sglang_options import OptionSpec, cli_names, load_sglang_options

if TYPE_CHECKING:  # the engines' and train ranks' processes import this module: not the plan
    from rlpost.plan import Plan
    from rlpost.schema import RunConfig

LOCALHOST = "127.0.0.1"
MEMORY_SAVER_OPTION = "enable_memory_saver"


@dataclass(frozen=True)
class EngineSpec:
    """One server process of one engine: what it loads, where it binds, which GPUs it uses.

    `port` is the plan's port; the process takes another free one when it is taken.
    `options` are SGLang server options by their ServerArgs names (layout.rollout.sglang).
    """

    index: int
    backend: str
    model_path: str
    host: str
    port: int
    seed: int
    log_path: str
    startup_timeout_s: float
    gpus_per_engine: int = 1
    base_gpu_id: int = 0
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None
    nccl_port: int | None = None
    num_threads: int | None = None
    max_batch_size: int = 64
    nice: int = 0  # the CPU engine's scheduling priority (RuntimePlan.engine_nice)
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def is_head(self) -> bool:
        """Node rank 0 serves HTTP; the other nodes of a multi-node engine only compute."""
        return self.node_rank == 0

    def url(self, port: int | None = None) -> str:
        return f"http://{self.host}:{self.port if port is None else port}"


# ---- option rendering -------------------------------------------------------------------


class OptionRenderError(ValueError):
    """An SGLang option that has no command-line spelling for the value given."""


def _render_value(value: Any) -> str:
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def render_option(name: str, value: Any, spec: OptionSpec | None, cli: str | None) -> list[str]:
    """`name: value` as SGLang's command line spells it: a bool is a bare flag (absent when
    false), a list repeats its values after one flag, a mapping is JSON, null is left out."""
    if cli is None:
        raise OptionRenderError(
            f"layout.rollout.sglang.{name} has no command-line flag in SGLang; remove it"
        )
    if value is None:
        return []
    if isinstance(value, bool):
        if value:
            return [cli]
        if spec is not None and spec.default is True:
            raise OptionRenderError(
                f"layout.rollout.sglang.{name}: false cannot be passed on SGLang's command line "
                f"(the flag only switches it on); remove it"
            )
        return []
    whole_json = spec is not None and bool({"dict", "list[dict]"} & set(spec.kinds))
    if isinstance(value, list | tuple) and not whole_json:
        return [cli, *(_render_value(v) for v in value)]
    return [cli, _render_value(value)]


def render_options(options: Sequence[tuple[str, Any]]) -> list[str]:
    """Every pass-through option, in the order given."""
    table = load_sglang_options().options
    cli = cli_names()
    args: list[str] = []
    for name, value in options:
        default_cli = "--" + name.replace("_", "-")
        args += render_option(name, value, table.get(name), cli.get(name, default_cli))
    return args


# ---- commands ---------------------------------------------------------------------------


def sglang_command(spec: EngineSpec, port: int) -> list[str]:
    """`python -m sglang.launch_server ...` for one node of an engine."""
    command = [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", spec.model_path,
        "--host", spec.host,
        "--port", str(port),
        "--tp-size", str(spec.gpus_per_engine),
        "--base-gpu-id", str(spec.base_gpu_id),
        "--random-seed", str(spec.seed),
    ]  # fmt: skip
    if spec.nnodes > 1:
        command += [
            "--nnodes", str(spec.nnodes),
            "--node-rank", str(spec.node_rank),
            "--dist-init-addr", str(spec.dist_init_addr),
        ]  # fmt: skip
    elif spec.nccl_port is not None and "nccl_port" not in dict(spec.options):
        command += ["--nccl-port", str(spec.nccl_port)]
    return command + render_options(spec.options)


def cpu_engine_command(spec: EngineSpec, port: int) -> list[str]:
    """rlpost's CPU engine; SGLang-only options do not apply to it and are not passed."""
    command = [
        sys.executable, "-m", "rlpost.backends.cpu_engine",
        "--model-path", spec.model_path,
        "--host", spec.host,
        "--port", str(port),
        "--seed", str(spec.seed),
        "--max-batch-size", str(spec.max_batch_size),
    ]  # fmt: skip
    if spec.num_threads is not None:
        command += ["--num-threads", str(spec.num_threads)]
    if spec.nice:
        command += ["--nice", str(spec.nice)]
    return command


def sglang_key_args(key: str) -> list[str]:
    """SGLang takes its API key only as `--api-key` (ServerArgs.api_key; no environment
    variable), so a local user can read it from `ps` while the server runs. It is added at
    launch and kept out of the logged command, but SGLang logs its whole ServerArgs at
    startup, api_key included, into the engine's log. SGLang leaves /health* open without
    the key. Untested here: it needs a GPU and SGLang."""
    return ["--api-key", key]


def cpu_key_args(key: str) -> list[str]:
    """The CPU engine reads its key from $RLPOST_ENGINE_KEY: nothing on the command line."""
    return []


def _cpu_env(spec: EngineSpec) -> dict[str, str]:
    threads = str(spec.num_threads or 1)
    return {"OMP_NUM_THREADS": threads, "OMP_WAIT_POLICY": "PASSIVE"}


def _no_env(spec: EngineSpec) -> dict[str, str]:
    return {}


@dataclass(frozen=True)
class EngineBackend:
    """How a backend's server starts and how its liveness is asked.

    `health_path` is what startup and the health monitor poll: SGLang's /health_generate
    runs a one-token generation (a hung scheduler fails it); the CPU engine decodes whole
    batches between admissions, so there /health (the HTTP loop and the loaded model) is
    the signal that does not stall behind a long batch.
    """

    name: str
    command: Callable[[EngineSpec, int], list[str]]
    env: Callable[[EngineSpec], dict[str, str]]
    health_path: str
    needs_gpu: bool
    # Arguments that give the server the launch's engine key (rlpost.backends.engine_key),
    # beyond its environment, which always carries it.
    key_args: Callable[[str], list[str]]


ENGINE_BACKENDS: dict[str, EngineBackend] = {
    "sglang": EngineBackend(
        "sglang", sglang_command, _no_env, "/health_generate", True, sglang_key_args
    ),
    "cpu": EngineBackend("cpu", cpu_engine_command, _cpu_env, "/health", False, cpu_key_args),
}


def engine_backend(name: str) -> EngineBackend:
    try:
        return ENGINE_BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"engine.backend={name!r} is unknown; use one of {sorted(ENGINE_BACKENDS)}"
        ) from None


# ---- a plan's engines -------------------------------------------------------------------


def pass_through_options(plan: Plan, memory_saver: bool) -> tuple[tuple[str, Any], ...]:
    """The plan's SGLang options, as the engines receive them.

    A derived memory fraction is left to SGLang when decoupled: it derives the same value
    itself, and passing it would only restate it. Memory release needs SGLang's memory
    saver, so colocated runs that release memory switch it on.
    """
    derived_fraction = plan.is_derived("layout.rollout.sglang.mem_fraction_static")
    options = [
        (name, value)
        for name, value in plan.engine.sglang
        if not (name == "mem_fraction_static" and derived_fraction and not plan.placement.colocate)
    ]
    if memory_saver and not dict(options).get(MEMORY_SAVER_OPTION):
        options.append((MEMORY_SAVER_OPTION, True))
    return tuple(options)


def engine_batch_size(cfg: RunConfig, backend: str) -> int:
    """`engine.max_batch_size`, except one sequence per forward for the CPU engine under
    `run.deterministic`: the last bits of a batched forward's logits depend on what a row is
    batched with, which depends on when requests arrive, and a seeded draw that lands that
    close to a token's edge samples another token (two unfaulted runs of the default then
    part ways at some rollout). A row computed alone is the same in every run."""
    if cfg.run.deterministic and backend == "cpu":
        return 1
    return cfg.engine.max_batch_size


def engine_specs(
    cfg: RunConfig,
    plan: Plan,
    *,
    backend: str,
    node_addresses: Sequence[str],
    log_dir: str,
    threads_per_engine: int | None = None,
    memory_saver: bool = False,
    gpu_ids: Mapping[tuple[int, int], int] | None = None,
) -> list[list[EngineSpec]]:
    """Per engine, one spec per node it spans (head first).

    `node_addresses[n]` is plan node n's address; servers bind it only when the hardware has
    several nodes, and 127.0.0.1 otherwise. `gpu_ids` maps a plan slot (node, gpu) to the
    physical GPU index on its node when the two differ.
    """
    multi_node = cfg.hardware.num_nodes > 1
    options = pass_through_options(plan, memory_saver)
    specs = []
    for engine in plan.placement.engines:
        firsts = engine.node_slots
        nodes = [slot.node for slot in firsts]
        dist_init = None
        if len(nodes) > 1:
            dist_init = f"{node_addresses[engine.head_node]}:{engine.dist_init_port}"
        per_node = []
        for rank, first in enumerate(firsts):
            node = first.node
            physical = (gpu_ids or {}).get((node, first.gpu), first.gpu)
            per_node.append(
                EngineSpec(
                    index=engine.index,
                    backend=backend,
                    model_path=cfg.model.hf_checkpoint,
                    host=node_addresses[node] if multi_node else LOCALHOST,
                    port=engine.http_port,
                    seed=cfg.run.seed + engine.index,
                    log_path=f"{log_dir}/engine_{engine.index}"
                    + (f"_node{rank}" if len(nodes) > 1 else "")
                    + ".log",
                    startup_timeout_s=cfg.engine.startup_timeout_s,
                    gpus_per_engine=len(engine.slots),
                    base_gpu_id=physical,
                    nnodes=len(nodes),
                    node_rank=rank,
                    dist_init_addr=dist_init,
                    nccl_port=engine.nccl_port,
                    num_threads=threads_per_engine,
                    max_batch_size=engine_batch_size(cfg, backend),
                    nice=plan.runtime.engine_nice,
                    options=options,
                )
            )
        specs.append(per_node)
    return specs


def engine_commands(specs: Sequence[Sequence[EngineSpec]]) -> list[list[list[str]]]:
    """The command of every process, at the plan's ports (what a launch would run)."""
    return [
        [engine_backend(spec.backend).command(spec, spec.port) for spec in nodes] for nodes in specs
    ]
