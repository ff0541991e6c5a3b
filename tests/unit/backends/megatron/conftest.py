"""Shared pieces of the Megatron backend tests: the tiny checkpoints of tiny_checkpoints.py,
rollouts and configs, a launcher that runs a function on N forked ranks (gloo on CPU), and a
`Setup` that runs a function on each rank's MegatronTrainer.

Every megatron-core process group lives in a forked child, never in the pytest process, so
tests can use any layout in any order. fork, not spawn: children reuse the parent's imports
(megatron-core costs seconds per process to import on two cores).
"""

from __future__ import annotations

import os
import random
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from rlpost.backends.megatron.hf_files import HFCheckpoint
from rlpost.backends.megatron.trainer import MegatronTrainer
from rlpost.plan.layout import ParallelLayout
from rlpost.schema import AlgoConfig, ModelConfig, OptimConfig, TrainConfig
from rlpost.types import TrainSample

from .tiny_checkpoints import ARCHITECTURES, VOCAB

RANK_TIMEOUT_S = 180.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(
    rank: int, fn: Callable[..., Any], world: int, port: int, out: str, args: tuple[Any, ...]
) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    if torch.distributed.is_initialized():
        raise RuntimeError(
            "the pytest process holds a torch.distributed group, which forked ranks inherit; "
            "a test that initialises one must do so in a child process"
        )
    torch.save(fn(rank, world, port, *args), Path(out) / f"rank{rank}.pt")


def start_method() -> str:
    """fork (fast), unless this process already initialised CUDA, which a forked child cannot
    use: then spawn, which pickles `fn` and its arguments (module-level functions only)."""
    return "spawn" if torch.cuda.is_initialized() else "fork"


def run_world(
    fn: Callable[..., Any], world: int, *args: Any, method: str | None = None
) -> list[Any]:
    """fn(rank, world_size, master_port, *args) on `world` ranks started by `method`
    (start_method() unless given); their return values."""
    with tempfile.TemporaryDirectory() as out:
        ranks = mp.start_processes(
            _rank_main,
            args=(fn, world, free_port(), out, args),
            nprocs=world,
            join=False,
            start_method=method or start_method(),
        )
        deadline = time.monotonic() + RANK_TIMEOUT_S
        while not ranks.join(timeout=1):
            if time.monotonic() > deadline:
                for process in ranks.processes:
                    process.kill()
                pytest.fail(f"{world} ranks did not finish in {RANK_TIMEOUT_S:.0f} s")
        return [torch.load(Path(out) / f"rank{r}.pt", weights_only=False) for r in range(world)]


def layout(**sizes: Any) -> ParallelLayout:
    """A ParallelLayout of all ones unless given; world = tp x pp x cp x dp."""
    return ParallelLayout.single_process(**({"distributed_optimizer": True} | sizes))


def rollout(count: int, *, seed: int = 0, min_len: int = 5, max_len: int = 24) -> list[TrainSample]:
    """Random token rollouts with masks, rewards and engine logprobs."""
    rng = random.Random(seed)
    samples = []
    for _ in range(count):
        length = rng.randint(min_len, max_len)
        response = rng.randint(1, length - 1)
        tokens = [rng.randrange(2, VOCAB) for _ in range(length)]
        mask = [int(rng.random() > 0.2) for _ in range(response)]
        mask[-1] = 1
        logprobs = [-rng.uniform(3.0, 5.0) for _ in range(response)]
        reward = rng.choice([-1.0, -0.5, 0.5, 1.0])
        samples.append(TrainSample(tokens, response, reward, logprobs, mask))
    return samples


Configs = tuple[AlgoConfig, OptimConfig, TrainConfig]


def configs(
    gbs: int = 8, *, algo: dict | None = None, optim: dict | None = None, train: dict | None = None
) -> Configs:
    return (
        AlgoConfig(**({"loss_reduction": "token_mean"} | (algo or {}))),
        OptimConfig(**({"lr": 1e-3, "adam_eps": 1e-4, "clip_grad": 1.0} | (optim or {}))),
        TrainConfig(
            **(
                {"global_batch_size": gbs, "use_dynamic_batch_size": True, "max_tokens_per_gpu": 48}
                | (train or {})
            )
        ),
    )


# ---- trainers on forked ranks -------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    """What every rank builds its MegatronTrainer from; there are layout.world ranks."""

    model: ModelConfig
    configs: Configs
    layout: ParallelLayout
    trains: bool = True  # False: mode=eval's trainer, which only loads and sends weights

    def with_model(self, **fields: Any) -> Setup:
        return replace(self, model=self.model.model_copy(update=fields))

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(trainer, *args) on every rank, each with its own trainer; rank 0's return value."""
        return run_world(_on_trainer, self.layout.world, fn, self, args)[0]


@contextmanager
def rank_trainer(rank: int, world: int, port: int, setup: Setup) -> Iterator[MegatronTrainer]:
    """This rank's trainer, closed (its process groups with it) however the block ends."""
    model, (algo, optim, train), par = setup.model, setup.configs, setup.layout
    trainer = MegatronTrainer(
        model,
        algo,
        optim,
        train,
        par,
        rank=rank,
        world_size=world,
        master_port=port,
        trains=setup.trains,
    )
    try:
        yield trainer
    finally:
        trainer.close()


def _on_trainer(
    rank: int, world: int, port: int, fn: Callable[..., Any], setup: Setup, args: tuple[Any, ...]
) -> Any:
    with rank_trainer(rank, world, port, setup) as trainer:
        result = fn(trainer, *args)
    return result if rank == 0 else None  # the tests read rank 0's; the others need not be saved


def step_after(
    trainer: MegatronTrainer,
    samples: list[TrainSample],
    ckpt: Path,
    resume: bool,
    with_optimizer: bool = True,
) -> dict[str, Any]:
    """Keep going: step, save, step. Resume: load, step. The weights and step count at the
    checkpoint, and the last step's results."""
    if resume:
        trainer.load_checkpoint(ckpt)
    else:
        trainer.train_step(samples)
        trainer.save_checkpoint(ckpt, with_optimizer=with_optimizer)
    # copies: a replicated weight comes back as the live parameter, which the next step moves
    saved = {n: w.clone() for b in trainer.iter_hf_weights() for n, w in b}
    saved_step = trainer.step
    metrics = trainer.train_step(samples)
    weights = dict(kv for b in trainer.iter_hf_weights() for kv in b)
    return {
        "saved_weights": saved,
        "saved_step": saved_step,
        "metrics": metrics,
        "weights": weights,
        "step": trainer.step,
    }


def read_hf(folder: Path | str) -> dict[str, torch.Tensor]:
    """Every tensor of an HF checkpoint folder, by name."""
    ckpt = HFCheckpoint(folder)
    try:
        return {name: ckpt.get(name) for name in ckpt.names()}
    finally:
        ckpt.close()


def assert_same_hf(expected: Path | str, actual: Path | str) -> None:
    """The two HF checkpoints hold the same names and bit-identical tensors."""
    before, after = read_hf(expected), read_hf(actual)
    assert before.keys() == after.keys()
    for name, tensor in before.items():
        assert torch.equal(after[name], tensor), name


# ---- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], ModelConfig]:
    """Architecture name -> the ModelConfig of a tiny random HF checkpoint (built once)."""
    root = tmp_path_factory.mktemp("megatron_tiny")
    built: dict[str, ModelConfig] = {}

    def get(arch: str) -> ModelConfig:
        if arch not in built:
            built[arch] = ARCHITECTURES[arch](root / arch)
        return built[arch]

    return get


@pytest.fixture
def make_setup(tiny_models: Callable[[str], ModelConfig]) -> Callable[..., Setup]:
    """make_setup(model or architecture, gbs, algo=, optim=, train=, **layout sizes): the
    configs' dicts update those of configs(), the sizes those of layout()."""

    def make(
        model: ModelConfig | str,
        gbs: int = 8,
        *,
        algo: dict | None = None,
        optim: dict | None = None,
        train: dict | None = None,
        **sizes: Any,
    ) -> Setup:
        model = tiny_models(model) if isinstance(model, str) else model
        return Setup(model, configs(gbs, algo=algo, optim=optim, train=train), layout(**sizes))

    return make


@pytest.fixture(scope="session")
def kept_and_resumed(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[..., tuple[dict[str, Any], dict[str, Any]]]:
    """(setup, samples, with_optimizer=True, resumed_layout=None) -> step_after's results for
    the run that kept going, then for the run resumed from its checkpoint, under
    `resumed_layout` when given. The run that kept going, and its checkpoint, are made once
    for each setup, samples and with_optimizer: several tests resume the same checkpoint
    (under other layouts), and a resume only reads it."""
    kept_runs: dict[str, tuple[dict[str, Any], Path]] = {}

    def both(
        setup: Setup,
        samples: list[TrainSample],
        with_optimizer: bool = True,
        resumed_layout: ParallelLayout | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        key = repr((setup, samples, with_optimizer))
        if key not in kept_runs:
            ckpt = tmp_path_factory.mktemp("kept") / "checkpoint"
            kept_runs[key] = (setup.run(step_after, samples, ckpt, False, with_optimizer), ckpt)
        kept, ckpt = kept_runs[key]
        resumed = setup if resumed_layout is None else replace(setup, layout=resumed_layout)
        return kept, resumed.run(step_after, samples, ckpt, True, with_optimizer)

    return both


@pytest.fixture(scope="session")
def reference_and_run() -> Callable[..., tuple[Any, Any]]:
    """(setup, fn, *args) -> fn's results on one rank without parallelism (the reference, run
    once for each model, configs, fn and args), then under the setup's layout."""
    references: dict[str, Any] = {}

    def both(setup: Setup, fn: Callable[..., Any], *args: Any) -> tuple[Any, Any]:
        one_rank = replace(setup, layout=layout())
        key = repr((fn.__module__, fn.__qualname__, one_rank, args))
        if key not in references:
            references[key] = one_rank.run(fn, *args)
        return references[key], setup.run(fn, *args)

    return both


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture
def world() -> Callable[..., list[Any]]:
    return run_world


@pytest.fixture
def make_layout() -> Callable[..., ParallelLayout]:
    return layout


@pytest.fixture
def make_rollout() -> Callable[..., list[TrainSample]]:
    return rollout


@pytest.fixture
def hf_tensors() -> Callable[[Path | str], dict[str, torch.Tensor]]:
    return read_hf


@pytest.fixture
def same_hf() -> Callable[[Path | str, Path | str], None]:
    return assert_same_hf
