"""Ray actors: one per train rank, one per rollout engine, placed in the run's bundles."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from typing import Any

import ray

from rlpost.backends.ports import hold_port
from rlpost.backends.sglang.launch import EngineSpec
from rlpost.backends.sglang.process import EngineProcess
from rlpost.rewards.scored import Scored
from rlpost.runtime.actor_log import log_to, note
from rlpost.runtime.progress import trainer_notes_to_stderr
from rlpost.runtime.rank_io import ReadMeter
from rlpost.runtime.trainers import TrainerSpec, build_trainer
from rlpost.types import TrainSample

__all__ = ["EngineActor", "EngineSpec", "RewardModelActor", "TrainActor", "TrainerSpec"]


def _seed_everything(seed: int) -> None:
    import random

    import torch

    random.seed(seed)
    torch.manual_seed(seed)


def _where() -> dict[str, object]:
    """The node this actor runs on (its cluster address) and its process."""
    address: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    return {"address": address, "pid": os.getpid()}


@ray.remote
class TrainActor:
    """One train rank; the backend (rlpost.runtime.trainers) does the work, the actor only
    hosts it. The run calls every method on all ranks at once, after `start`."""

    def __init__(
        self,
        spec: TrainerSpec,
        rank: int,
        env: dict[str, str],
        reads: tuple[str, list[str]] | None = None,
        log: str | None = None,
    ) -> None:
        """`reads`: (a folder, the folders this rank loads from as it starts): its reads of
        them are metered to the folder (`rank_io`). `log`: the file under the run's logs that
        this rank's output goes to as well (`actor_log`). The trainer is built by `start`, so
        that rank 0 can hold the ranks' meeting port first (`hold_rendezvous`)."""
        if log is not None:
            log_to(Path(log), f"train rank {rank}")
        os.environ.update(env)  # before torch loads here: its thread pool reads it
        trainer_notes_to_stderr()
        self.spec, self.rank, self.reads = spec, rank, reads
        self.backend = spec.backend
        self.trainer: Any = None

    def hold_rendezvous(self) -> int:
        """Rank 0 of ranks that meet over TCP: a port on its address that this process binds
        and listens on from now on, until its store serves it (`hold_port`); a port picked
        free and let go could be another process's by the time the trainer binds it."""
        port = hold_port(self.spec.master_addr)
        self.spec = dataclasses.replace(self.spec, master_port=port)
        return port

    def start(self, master_port: int | None = None) -> bool:
        """Builds this rank's trainer, meeting the others at `master_port` on rank 0's
        address when given (rank 0's held port), else at the spec's rendezvous."""
        if master_port is not None:
            self.spec = dataclasses.replace(self.spec, master_port=master_port)
        reads = self.reads
        meter = ReadMeter(reads[0], self.rank, reads[1]) if reads else contextlib.nullcontext()
        note(f"building the {self.backend} trainer (world size {self.spec.world_size})")
        with meter:
            _seed_everything(self.spec.seed + self.rank)
            self.trainer = build_trainer(self.spec, self.rank)
        note("trainer built")
        return True

    def where(self) -> dict[str, object]:
        return _where()

    def train(self, batch: list[TrainSample], with_reference: bool) -> dict[str, float]:
        note(f"a train step on {len(batch)} samples")
        metrics: dict[str, float] = self.trainer.train_step(batch, with_reference)
        return metrics

    def export_hf(self, out_dir: str) -> str:
        return str(self.trainer.export_hf(out_dir))

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

    def where(self) -> dict[str, object]:
        return {**_where(), "server_pid": self.process.pid(), "url": self.process.url}

    def pid(self) -> int | None:
        return self.process.pid()

    def is_alive(self) -> bool:
        return self.process.is_alive()

    def stop(self) -> None:
        self.process.stop()


@ray.remote
class RewardModelActor:
    """The run's reward model on a device slot of its own (reward.model_placement: actor):
    built once, scoring the batches the driver sends (async: batches may overlap)."""

    def __init__(
        self,
        path: str,
        settings: dict[str, object],
        on_gpu: bool,
        env: dict[str, str],
        log: str | None = None,
    ) -> None:
        """`log`: the file under the run's logs that its output goes to as well."""
        if log is not None:
            log_to(Path(log), f"the reward model actor ({path})")
        os.environ.update(env)  # before torch loads here: its thread pool reads it
        from rlpost.rewards.errors import RewardError
        from rlpost.rewards.model import build_reward_model

        self.path = path
        # A class that cannot be built is the user's to fix, which `ready` says: an actor
        # whose constructor raised would die, a fault that restarts the run to no avail.
        self.failure: str | None = None
        try:
            self.model = build_reward_model(path, settings, "cuda" if on_gpu else "cpu")
        except RewardError as exc:
            self.failure = str(exc)

    def ready(self) -> str | None:
        """None once the model is built; else why it could not be."""
        return self.failure

    def where(self) -> dict[str, object]:
        return _where()

    async def score(self, samples: list[object]) -> list[Scored]:
        from rlpost.rewards.model import score

        return await score(self.model, samples, self.path)  # type: ignore[arg-type]
