import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from rlpost.backends.torch_trainer import TorchTrainer
from rlpost.schema import AlgoConfig, OptimConfig, TrainConfig
from rlpost.types import TrainSample

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
) -> None:
    trainer = TorchTrainer(
        model_dir, *configs, rank=rank, world_size=world_size, master_port=port, num_threads=1
    )
    metrics = trainer.train_step(samples)
    grads = [p.grad for p in trainer.model.parameters()]
    weights = [p.detach() for p in trainer.model.parameters()]
    torch.save({"metrics": metrics, "grads": grads, "weights": weights}, out_dir / f"rank{rank}.pt")
    trainer.close()


@pytest.mark.parametrize("kind", ["samples", "groups"])
def test_two_ranks_match_one_rank(
    tiny_model_dir: Path,
    make_samples: Samples,
    make_groups: Samples,
    make_configs: Configs,
    tmp_path: Path,
    kind: str,
) -> None:
    """Same rollout, same step: gloo DP over 2 ranks gives 1 rank's gradients and weights;
    with groups of one prompt, each rank takes whole groups and packs each prompt once."""
    configs = make_configs(
        8,
        algo={"loss_reduction": "token_mean", "normalize_advantages": True},
        optim={"lr": 1e-3, "adam_eps": 1e-4, "clip_grad": 1.0},
        train={"use_dynamic_batch_size": True, "max_tokens_per_gpu": 48, "balance_data": True},
    )
    if kind == "samples":
        samples = make_samples(8, seed=11, with_rollout=True)
    else:
        samples = make_groups(4, 2, seed=11, with_rollout=True)
    single_dir, dual_dir = tmp_path / "single", tmp_path / "dual"
    single_dir.mkdir()
    dual_dir.mkdir()
    run_rank(0, 1, free_port(), tiny_model_dir, configs, samples, single_dir)
    # fork, not spawn: spawned ranks re-import torch and transformers (10-40 s on 2 busy
    # cores); forked ones start in milliseconds. A deadline turns a hang into a failure.
    ranks_ctx = mp.start_processes(
        run_rank,
        args=(2, free_port(), tiny_model_dir, configs, samples, dual_dir),
        nprocs=2,
        join=False,
        start_method="fork",
    )
    deadline = time.monotonic() + 120
    while not ranks_ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for process in ranks_ctx.processes:
                process.kill()
            pytest.fail("2-rank data-parallel run did not finish in 120 s")
    single = torch.load(single_dir / "rank0.pt")
    ranks = [torch.load(dual_dir / f"rank{r}.pt") for r in range(2)]
    for key in ("train/loss", "train/pg_loss", "train/entropy", "train/grad_norm"):
        for result in ranks:
            assert abs(result["metrics"][key] - single["metrics"][key]) < 1e-5, key
    assert single["metrics"]["train/grad_norm"] > 1.0  # clipping took part
    for result in ranks:
        for a, b in zip(result["grads"], single["grads"], strict=True):
            assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)
        for a, b in zip(result["weights"], single["weights"], strict=True):
            assert torch.allclose(a, b, atol=1e-6)
