"""Weight sync between a real torch trainer (in this process) and a real CPU engine process.

The engine starts from one random tiny model and the trainer holds another, so the logprob
probe tells whether the engine really serves the trainer's weights. Disk sync and
distributed sync (the NCCL path's protocol, over gloo here) both go through update_engines:
pause, flush, push, version check, continue.
"""

from __future__ import annotations

import asyncio
import re
import shutil
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlpost.backends.fp8 import Fp8Format
from rlpost.backends.fp8_convert import convert_folder
from rlpost.backends.sglang import trainer_side
from rlpost.backends.sglang.launch import EngineSpec
from rlpost.backends.sglang.process import EngineProcess, free_port
from rlpost.backends.torch_trainer.trainer import TorchTrainer
from rlpost.runtime.failures import RunFault
from rlpost.runtime.rollout.client import EngineClient
from rlpost.runtime.weight_sync import (
    DiskSync,
    DistributedSync,
    ProbeSettings,
    WeightSyncError,
    probe_weights,
    update_engines,
)
from rlpost.schema import AlgoConfig, OptimConfig, TrainConfig

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def engine_url(tiny_lm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    logs = tmp_path_factory.mktemp("engine_logs")
    spec = EngineSpec(
        index=0, backend="cpu", model_path=str(tiny_lm_dir), host="127.0.0.1",
        port=free_port("127.0.0.1"), seed=0, log_path=str(logs / "engine.log"),
        startup_timeout_s=120, num_threads=1,
    )  # fmt: skip
    process = EngineProcess(spec)
    try:
        yield process.start()
    finally:
        process.stop()


def other_model(tiny_lm_dir: Path, out: Path) -> Path:
    """The same architecture and tokenizer with other random weights."""
    shutil.copytree(tiny_lm_dir, out, dirs_exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    torch.manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(0.1 * torch.randn_like(param))
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def trainer(tiny_lm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TorchTrainer]:
    other = other_model(tiny_lm_dir, tmp_path_factory.mktemp("other_lm"))
    threads = torch.get_num_threads()
    trainer = TorchTrainer(
        other, AlgoConfig(), OptimConfig(lr=1e-3), TrainConfig(global_batch_size=1), num_threads=1
    )
    yield trainer
    trainer.close()  # its process group: ranks forked later by this worker would inherit it
    torch.set_num_threads(threads)


def trainer_call(trainer: TorchTrainer) -> Any:
    async def call(rank: int, fn: Any, *args: Any) -> Any:
        assert rank == 0
        # a thread: joining a group blocks until the engine joins over HTTP
        return await asyncio.to_thread(fn, trainer, *args)

    return call


def probe_settings(trainer: TorchTrainer, tolerance: float = 1e-3) -> ProbeSettings:
    prompt = trainer_side.probe_prompt_ids(trainer, "What is 3+4?")
    return ProbeSettings(prompt_ids=tuple(prompt), temperature=1.0, tolerance=tolerance)


async def probe(
    client: EngineClient, url: str, trainer: TorchTrainer, tolerance: float = 1e-3
) -> dict[str, float]:
    """The engine's mean |logprob difference| from `trainer` on the probe prompt; raises
    WeightSyncError above `tolerance`."""

    async def reference(prompt: list[int], output: list[int]) -> list[float]:
        return trainer_side.probe_logprobs(trainer, prompt, output)

    return await probe_weights(client, [url], reference, probe_settings(trainer, tolerance))


def nudge(trainer: TorchTrainer) -> None:
    """Stands in for an optimizer step: the trainer's weights move."""
    with torch.no_grad():
        for param in trainer.model.parameters():
            param.add_(0.05 * torch.randn_like(param))


def test_distributed_then_disk_sync_make_the_engine_serve_the_trainer_weights(
    engine_url: str, trainer: TorchTrainer, tmp_path: Path
) -> None:
    call = trainer_call(trainer)

    async def scenario() -> list[str]:
        async with EngineClient(engine_url, worker_urls=[engine_url]) as client:
            with pytest.raises(WeightSyncError, match="disagree"):
                await probe(client, engine_url, trainer)  # two different random models
            dist = DistributedSync(
                client, call, num_ranks=1, gpus_per_engine=1, bucket_bytes=64 << 10, backend="gloo"
            )
            await update_engines(client, dist, [engine_url], version=1)
            assert await client.get_weight_version(engine_url) == "1"
            gaps = [(await probe(client, engine_url, trainer))[engine_url]]
            group = dist.group_name
            nudge(trainer)
            await update_engines(client, dist, [engine_url], version=2)
            assert dist.group_name == group  # same engines: the group is kept
            gaps.append((await probe(client, engine_url, trainer))[engine_url])
            await dist.close()

            disk = DiskSync(client, call, 1, tmp_path / "weights")
            nudge(trainer)
            await update_engines(client, disk, [engine_url], version=3)
            nudge(trainer)
            await update_engines(client, disk, [engine_url], version=4)
            assert await client.get_weight_version(engine_url) == "4"
            gaps.append((await probe(client, engine_url, trainer))[engine_url])
            assert all(gap < 1e-4 for gap in gaps), gaps
            return sorted(p.name for p in (tmp_path / "weights").iterdir())

    # only the newest export is kept: it is what a restarted engine reloads
    assert run(scenario()) == ["v4"]


def with_a_stuck_rank(trainer: TorchTrainer, stuck_in: Any, stuck_rank: int = 1) -> Any:
    """Two train ranks: rank 0 the trainer, rank 1 one that answers every call at once; the
    `stuck_rank` until `stuck_in`, which never returns (as a rank stuck in a collective or on
    a dead file system); every call after it waits behind it, as an actor's calls do."""
    real = trainer_call(trainer)
    stuck = asyncio.Event()

    async def call(rank: int, fn: Any, *args: Any) -> Any:
        if rank == stuck_rank and fn == stuck_in:
            stuck.set()
        if rank == stuck_rank and stuck.is_set():
            await asyncio.sleep(3600)
        return await real(0, fn, *args) if rank == 0 else None

    return call


@pytest.mark.parametrize("kind", ["disk", "distributed", "group"])
def test_a_rank_that_does_not_answer_ends_the_update_naming_it(
    kind: str, engine_url: str, trainer: TorchTrainer, tmp_path: Path
) -> None:
    """Every step of an update that calls all train ranks is awaited as one collective: a
    rank that never answers fails the update within trainer.collective_timeout_s (counted
    from the export's last written byte on disk) with a RunFault naming it and the step, and
    the engine keeps its version and serves again. So are rank 0's own calls of the
    distributed sync (`group`: its update group's address, before any engine is asked)."""
    from rlpost.backends.sglang.trainer_calls import trainer_side as by_name
    from rlpost.runtime.weight_sync import _export

    stuck_in, stuck_rank, step = {
        "disk": (_export, 1, "the export of weight version 7"),
        "distributed": (by_name.next_weight_bucket, 1, "gathering weight bucket 0"),
        "group": (by_name.update_group_address, 0, "choosing the weight-update group's address"),
    }[kind]
    call = with_a_stuck_rank(trainer, stuck_in, stuck_rank)

    async def scenario() -> None:
        async with EngineClient(engine_url, worker_urls=[engine_url]) as client:
            before = await client.get_weight_version(engine_url)
            if kind == "disk":
                sync: Any = DiskSync(client, call, 2, tmp_path / "weights", timeout_s=1.0)
            else:
                sync = DistributedSync(
                    client, call, num_ranks=2, gpus_per_engine=1, bucket_bytes=64 << 10,
                    backend="gloo", timeout_s=1.0,
                )  # fmt: skip
            try:
                # the step that failed is named: no clean-up waits on the stuck rank again
                # (its RunFault would take the place of this one)
                missing = rf"rank\(s\) \[{stuck_rank}\] did not arrive: {re.escape(step)}"
                with pytest.raises(RunFault, match=missing):
                    await asyncio.wait_for(
                        update_engines(client, sync, [engine_url], version=7), timeout=60
                    )
            finally:
                await sync.close()
            assert await client.get_weight_version(engine_url) == before != "7"
            await probe(client, engine_url, trainer, tolerance=float("inf"))  # it generates

    run(scenario())


def test_bucket_size_bounds_the_distributed_updates(engine_url: str, trainer: TorchTrainer) -> None:
    buckets = list(trainer.iter_hf_weights(bucket_bytes=1))
    largest = max(t.numel() * t.element_size() for bucket in buckets for _, t in bucket)
    assert all(len(bucket) == 1 for bucket in buckets)  # nothing shares an oversized bucket

    async def scenario() -> None:
        async with EngineClient(engine_url, worker_urls=[engine_url]) as client:
            # one weight per bucket at most: many small broadcasts give the same result
            dist = DistributedSync(
                client,
                trainer_call(trainer),
                num_ranks=1,
                gpus_per_engine=1,
                bucket_bytes=1,
                backend="gloo",
            )
            nudge(trainer)
            await update_engines(client, dist, [engine_url], version=5)
            await probe(client, engine_url, trainer)
            await dist.close()

    assert largest > 1
    run(scenario())


@pytest.fixture(scope="module")
def fp8_engine(tiny_lm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A CPU engine serving an FP8 conversion of the tiny model (blocks of 32 x 32)."""
    folder = convert_folder(tiny_lm_dir, tmp_path_factory.mktemp("fp8_lm") / "lm", FP8_BLOCKS)
    logs = tmp_path_factory.mktemp("fp8_engine_logs")
    spec = EngineSpec(
        index=0, backend="cpu", model_path=str(folder), host="127.0.0.1",
        port=free_port("127.0.0.1"), seed=0, log_path=str(logs / "engine.log"),
        startup_timeout_s=120, num_threads=1,
    )  # fmt: skip
    process = EngineProcess(spec)
    try:
        yield process.start()
    finally:
        process.stop()


FP8_BLOCKS = Fp8Format((32, 32))


def test_updates_to_an_fp8_engine_equal_the_converters_output_on_every_path(
    fp8_engine: str, trainer: TorchTrainer, tmp_path: Path
) -> None:
    """Distributed and disk sync quantise the trainer's weights as tools/convert_hf_to_fp8.py
    does: the engine then serves exactly what a trainer loading the tool's output holds."""
    call = trainer_call(trainer)

    async def scenario() -> None:
        async with EngineClient(fp8_engine, worker_urls=[fp8_engine]) as client:
            syncs = {
                "distributed": DistributedSync(
                    client, call, num_ranks=1, gpus_per_engine=1, bucket_bytes=64 << 10,
                    backend="gloo", fp8=FP8_BLOCKS,
                ),
                "disk": DiskSync(client, call, 1, tmp_path / "weights", FP8_BLOCKS),
            }  # fmt: skip
            for version, (kind, sync) in enumerate(syncs.items(), start=1):
                nudge(trainer)
                await update_engines(client, sync, [fp8_engine], version=version)
                exported = trainer.export_hf(tmp_path / f"{kind}_trained")
                converted = convert_folder(exported, tmp_path / f"{kind}_fp8", FP8_BLOCKS)
                as_converted = TorchTrainer(
                    converted, AlgoConfig(), OptimConfig(), TrainConfig(global_batch_size=1),
                    num_threads=1,
                )  # fmt: skip
                gap = await probe(client, fp8_engine, as_converted)
                assert gap[fp8_engine] < 1e-4, (kind, gap)
                # and not the trainer's own (unquantised) weights: FP8's rounding shows
                own = await probe(client, fp8_engine, trainer, tolerance=float("inf"))
                assert own[fp8_engine] > 10 * max(gap[fp8_engine], 1e-6), (kind, own, gap)
                await sync.close()

    run(scenario())


class OneFp8WeightTrainer:
    """A trainer whose policy is one FP8 weight, sent as it is: its scale never follows."""

    def iter_hf_weights(self, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
        weight = torch.zeros(32, 32).to(torch.float8_e4m3fn)
        yield [("model.layers.0.mlp.up_proj.weight", weight)]


def test_an_fp8_update_missing_a_scale_leaves_the_engine_at_its_version(fp8_engine: str) -> None:
    """The version comes once every bucket is in; an engine still waiting for a weight's
    scale refuses it, and the update fails with the engine still at its old version."""
    trainer = OneFp8WeightTrainer()

    async def scenario() -> str:
        async with EngineClient(fp8_engine, worker_urls=[fp8_engine]) as client:
            before = await client.get_weight_version(fp8_engine)
            sync = DistributedSync(
                client,
                trainer_call(trainer),  # type: ignore[arg-type]
                num_ranks=1,
                gpus_per_engine=1,
                bucket_bytes=1 << 20,
                backend="gloo",
            )
            try:
                with pytest.raises(WeightSyncError, match="unmatched"):
                    await update_engines(client, sync, [fp8_engine], version=99)
            finally:
                await sync.close()
            after = await client.get_weight_version(fp8_engine)
            assert after == before != "99"
            return after

    run(scenario())
