"""Ray actors: one per train rank, one per rollout engine, placed in the run's bundles."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from rlpost.schema import AlgoConfig, OptimConfig, TrainConfig
from rlpost.types import TrainSample


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


@dataclass(frozen=True)
class EngineSpec:
    """How to start one engine server process."""

    index: int
    model_path: str
    host: str
    port: int
    num_threads: int
    seed: int
    max_batch_size: int
    log_path: str
    startup_timeout_s: float


@ray.remote
class EngineActor:
    """Owns one engine server process in its bundle (so it inherits the bundle's devices)."""

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.spec.host}:{self.spec.port}"

    def start(self) -> str:
        spec = self.spec
        command = [
            sys.executable, "-m", "rlpost.backends.cpu_engine",
            "--model-path", spec.model_path,
            "--host", spec.host,
            "--port", str(spec.port),
            "--num-threads", str(spec.num_threads),
            "--seed", str(spec.seed + spec.index),
            "--max-batch-size", str(spec.max_batch_size),
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": str(spec.num_threads), "OMP_WAIT_POLICY": "PASSIVE"}
        Path(spec.log_path).parent.mkdir(parents=True, exist_ok=True)
        log = open(spec.log_path, "ab")  # noqa: SIM115  (owned by the child process)
        self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        self._wait_healthy()
        return self.url

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.spec.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"engine {self.spec.index} exited with {self.proc.returncode} while "
                    f"starting; see {self.spec.log_path}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        raise TimeoutError(
            f"engine {self.spec.index} not healthy after {self.spec.startup_timeout_s} s; "
            f"see {self.spec.log_path}"
        )

    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def is_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
