"""The sharded trainer over gloo: DP2 and DP4 (FSDP2, HSDP) against DP1, in forked ranks."""

import socket
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM

from rlpost.algo.steps import plan_steps
from rlpost.backends.torch_trainer import TorchTrainer
from rlpost.backends.torch_trainer.distributed import full_tensor
from rlpost.schema import AlgoConfig, OptimConfig, TrainConfig
from rlpost.schema.layout import FsdpLayout
from rlpost.types import TrainSample

from .conftest import join_ranks

Samples = Callable[..., list[TrainSample]]
Configs = Callable[..., tuple[AlgoConfig, OptimConfig, TrainConfig]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_rank(
    rank: int,
    world_size: int,
    port: int,
    model_dir: Path,
    configs: tuple[AlgoConfig, OptimConfig, TrainConfig],
    samples: list[TrainSample],
    out_dir: Path,
    kwargs: dict[str, Any],
) -> None:
    if dist.is_initialized():  # a group the test process made before the fork is not ours
        dist.destroy_process_group()
    trainer = TorchTrainer(
        model_dir,
        *configs,
        rank=rank,
        world_size=world_size,
        master_port=port,
        num_threads=1,
        **kwargs,
    )
    shards = [p.to_local().numel() for p in trainer.model.parameters()]  # type: ignore[attr-defined]
    metrics = trainer.train_step(samples)
    grads = [full_tensor(p.grad) for p in trainer.model.parameters()]
    weights = [full_tensor(p.detach()) for p in trainer.model.parameters()]
    result = {"metrics": metrics, "grads": grads, "weights": weights, "shards": shards}
    torch.save(result, out_dir / f"rank{rank}.pt")
    trainer.close()


def run_ranks(
    world_size: int,
    model_dir: Path,
    configs: tuple[AlgoConfig, OptimConfig, TrainConfig],
    samples: list[TrainSample],
    out_dir: Path,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """Each rank's metrics, whole gradients and weights after one train_step."""
    out_dir.mkdir()
    # fork, not spawn: spawned ranks re-import torch and transformers (10-40 s on 2 busy
    # cores); forked ones start in milliseconds. A deadline turns a hang into a failure.
    ranks_ctx = mp.start_processes(
        run_rank,
        args=(world_size, free_port(), model_dir, configs, samples, out_dir, kwargs),
        nprocs=world_size,
        join=False,
        start_method="fork",
    )
    join_ranks(ranks_ctx, f"{world_size}-rank run")
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(world_size)]


TRAIN = {"use_dynamic_batch_size": True, "max_tokens_per_gpu": 48, "balance_data": True}


def uneven_samples(make_samples: Samples) -> list[TrainSample]:
    """Four long samples, then four short ones: unbalanced, rank 0 packs the long ones into
    several micro-batches and rank 1 the short ones into one."""
    long = make_samples(4, seed=21, min_len=30, max_len=40, with_rollout=True)
    return long + make_samples(4, seed=22, min_len=5, max_len=8, with_rollout=True)


@pytest.mark.parametrize(
    ("world_size", "kind", "fsdp", "per_layer"),
    [
        (2, "samples", FsdpLayout(), None),
        (2, "groups", FsdpLayout(), None),
        (2, "uneven", FsdpLayout(), None),
        (2, "uneven", FsdpLayout(), True),
        (2, "uneven", FsdpLayout(reshard_after_forward=True), None),
        (2, "samples", FsdpLayout(shard_group_size=1, cpu_offload=True), None),
        (4, "samples", FsdpLayout(), None),
        (4, "samples", FsdpLayout(shard_group_size=2), True),
    ],
    ids=[
        "samples",
        "groups",
        "uneven-micro-batches",
        "uneven-micro-batches-per-layer-units",
        "uneven-micro-batches-reshard-after-forward",
        "hsdp-replicated-cpu-offload",
        "dp4",
        "hsdp-2x2-per-layer-units",
    ],
)
def test_ranks_match_one_rank(
    tiny_model_dir: Path,
    make_samples: Samples,
    make_groups: Samples,
    make_configs: Configs,
    tmp_path: Path,
    world_size: int,
    kind: str,
    fsdp: FsdpLayout,
    per_layer: bool | None,
) -> None:
    """Same rollout, same step: FSDP2 over 2 (or 4) gloo ranks gives 1 rank's gradients
    (summed, not averaged), gradient norm and weights; with groups of one prompt each rank
    takes whole groups and packs each prompt once; ranks with unequal micro-batch counts
    even them out with empty ones; HSDP with shard groups of one rank replicates instead of
    sharding (here with FSDP2's CPU offload on, which on CPU leaves everything where it is),
    and with groups of two shards and replicates. The model is one FSDP2 unit on CPU, or one
    per decoder layer as on CUDA (`per_layer`), or one per layer that frees its gathered
    parameters after its forward and gathers them again for its backward
    (`reshard_after_forward`, as on CUDA by default). Ranks other than 0 receive the model from
    rank 0 rather than reading it (sharded_model.py)."""
    train = TRAIN | ({"balance_data": False} if kind == "uneven" else {})
    configs = make_configs(
        8,
        algo={"loss_reduction": "token_mean", "normalize_advantages": True},
        optim={"lr": 1e-3, "adam_eps": 1e-4, "clip_grad": 1.0},
        train=train,
    )
    if kind == "groups":
        samples = make_groups(4, 2, seed=11, with_rollout=True)
    elif kind == "uneven":
        samples = uneven_samples(make_samples)
        counts = [
            len(plan_steps(samples, configs[2], configs[0], r, world_size)[0].micro_batches)
            for r in range(world_size)
        ]
        assert counts[0] > counts[1], counts
    else:
        samples = make_samples(8, seed=11, with_rollout=True)
    (single,) = run_ranks(1, tiny_model_dir, configs, samples, tmp_path / "single")
    ranks = run_ranks(
        world_size,
        tiny_model_dir,
        configs,
        samples,
        tmp_path / "dp",
        fsdp=fsdp,
        per_layer_units=per_layer,
    )
    for key in ("train/loss", "train/pg_loss", "train/entropy", "train/grad_norm"):
        for result in ranks:
            assert abs(result["metrics"][key] - single["metrics"][key]) < 1e-5, key
    assert single["metrics"]["train/grad_norm"] > 1.0  # clipping took part
    for result in ranks:
        for a, b in zip(result["grads"], single["grads"], strict=True):
            assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)
        for a, b in zip(result["weights"], single["weights"], strict=True):
            assert torch.allclose(a, b, atol=1e-6)
    # each rank holds its part of every tensor sharded over the ranks, all of it replicated
    share = fsdp.shard_group_size or world_size
    for whole, part in zip(single["shards"], ranks[0]["shards"], strict=True):
        assert part == -(-whole // share)


def gather_weights_rank(
    rank: int, world_size: int, port: int, model_dir: Path, bucket_bytes: int, out_dir: Path
) -> None:
    """Walk the policy's weights bucket by bucket, tracking the gathered bytes still alive
    (each tensor's bytes until it is freed) when each bucket arrives."""
    if dist.is_initialized():
        dist.destroy_process_group()
    configs = (AlgoConfig(), OptimConfig(), TrainConfig(global_batch_size=2))
    trainer = TorchTrainer(
        model_dir, *configs, rank=rank, world_size=world_size, master_port=port, num_threads=1
    )
    alive = [0]

    def freed(nbytes: int) -> None:
        alive[0] -= nbytes

    peaks, weights = [], {}
    # a deprecated collective warns in every run's log (torch 2.13: all_gather_into_tensor)
    warnings.simplefilter("error", FutureWarning)
    for bucket in trainer.iter_hf_weights(bucket_bytes):
        for name, tensor in bucket:
            nbytes = tensor.numel() * tensor.element_size()
            alive[0] += nbytes
            weakref.finalize(tensor, freed, nbytes)
            weights[name] = tensor.clone()
        peaks.append((alive[0], max(t.numel() * t.element_size() for _, t in bucket)))
        del bucket, tensor
    torch.save({"peaks": peaks, "weights": weights}, out_dir / f"rank{rank}.pt")
    trainer.close()


def test_weights_are_gathered_whole_one_bucket_at_a_time(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Every rank gets every tensor whole, and never holds more gathered bytes than one
    bucket (or one tensor, where a tensor is larger than a bucket)."""
    bucket_bytes = 40 << 10
    ranks_ctx = mp.start_processes(
        gather_weights_rank,
        args=(2, free_port(), tiny_model_dir, bucket_bytes, tmp_path),
        nprocs=2,
        join=False,
        start_method="fork",
    )
    join_ranks(ranks_ctx, "2-rank weight gathering")
    loaded = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    expected = dict(loaded.named_parameters())
    for rank in range(2):
        result = torch.load(tmp_path / f"rank{rank}.pt")
        assert result["weights"].keys() == expected.keys()
        for name, tensor in result["weights"].items():
            assert torch.equal(tensor, expected[name].detach()), name
        assert len(result["peaks"]) > 2
        assert all(peak <= max(bucket_bytes, largest) for peak, largest in result["peaks"])
