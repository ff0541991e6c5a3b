"""Ray actors: one per train rank, one per rollout engine, placed in the run's bundles."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray

from rlpost.backends.sglang.launch import EngineSpec
from rlpost.backends.sglang.process import EngineProcess
from rlpost.schema import AlgoConfig, OptimConfig, TrainConfig
from rlpost.types import TrainSample

__all__ = ["EngineActor", "EngineSpec", "TrainActor", "TrainerSpec"]


@dataclass(frozen=True)
class TrainerSpec:
    """What every train rank needs to build its trainer backend."""

    backend: str
    model_dir: str
    algo: AlgoConfig
    optim: OptimConfig
    train: TrainConfig
    rollout_temperature: float
    world_size: int
    master_addr: str
    master_port: int
    num_threads: int
    seed: int


def _seed_everything(seed: int) -> None:
    import random

    import torch

    random.seed(seed)
    torch.manual_seed(seed)


@ray.remote
class TrainActor:
    """One data-parallel train rank; the backend does the work, the actor only hosts it."""

    def __init__(self, spec: TrainerSpec, rank: int) -> None:
        _seed_everything(spec.seed + rank)
        from rlpost.backends.torch_trainer.trainer import TorchTrainer

        self.trainer = TorchTrainer(
            spec.model_dir,
            spec.algo,
            spec.optim,
            spec.train,
            rollout_temperature=spec.rollout_temperature,
            rank=rank,
            world_size=spec.world_size,
            master_addr=spec.master_addr,
            master_port=spec.master_port,
            num_threads=spec.num_threads,
        )

    def ready(self) -> bool:
        return True

    def train(self, batch: list[TrainSample]) -> dict[str, float]:
        return self.trainer.train_step(batch)

    def export_hf(self, out_dir: str) -> str:
        return str(self.trainer.export_hf(out_dir))

    def state_dict(self) -> dict[str, Any]:
        return self.trainer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.trainer.load_state_dict(state)

    def close(self) -> None:
        self.trainer.close()


@ray.remote
class EngineActor:
    """Owns one engine server process in its bundle (so it runs on the engine's node and
    inherits the bundle's devices). Restarting is stop() then start() on the same actor."""

    def __init__(self, spec: EngineSpec, extra_env: dict[str, str] | None = None) -> None:
        self.process = EngineProcess(spec, extra_env)

    def start(self) -> str:
        return self.process.start()

    def url(self) -> str:
        return self.process.url

    def pid(self) -> int | None:
        return self.process.pid()

    def is_alive(self) -> bool:
        return self.process.is_alive()

    def stop(self) -> None:
        self.process.stop()
