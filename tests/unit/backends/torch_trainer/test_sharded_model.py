"""Rank 0 alone reads the checkpoint: the other ranks build the model on the meta device and
receive their shards, and end up with rank 0's model bit for bit (forked gloo ranks)."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor

from rlpost.backends.torch_trainer import TorchTrainer
from rlpost.backends.torch_trainer.distributed import full_tensor
from rlpost.backends.torch_trainer.forward import TokenForward
from rlpost.backends.torch_trainer.model_io import build_causal_lm, load_causal_lm
from rlpost.schema import AlgoConfig, OptimConfig, TrainConfig
from rlpost.schema.layout import FsdpLayout

from .conftest import join_ranks, save_tiny_qwen3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def describe(forward: TokenForward) -> dict[str, Any]:
    """What a rank's model is: whole weights (gathered), buffers, ties, modes, configs."""
    lm = forward.lm
    return {
        "weights": {n: full_tensor(p.detach()).clone() for n, p in lm.named_parameters()},
        "buffers": {n: b.clone() for n, b in lm.named_buffers()},
        "tied": lm.get_output_embeddings().weight is lm.get_input_embeddings().weight,
        "training": any(m.training for m in lm.modules()),
        "requires_grad": [p.requires_grad for p in lm.parameters()],
        "config": lm.config.to_dict(),
        "attn": lm.config._attn_implementation,
        "generation": lm.generation_config.to_json_string(use_diff=False),
    }


def build_rank(
    rank: int,
    world_size: int,
    port: int,
    model_dirs: list[Path],
    reference_dir: Path,
    fsdp: FsdpLayout,
    out_dir: Path,
) -> None:
    """Construct the trainer (rank r reads `model_dirs[r]`) and save what its models are."""
    if dist.is_initialized():  # a group the test process made before the fork is not ours
        dist.destroy_process_group()
    trainer = TorchTrainer(
        model_dirs[rank],
        AlgoConfig(),
        OptimConfig(),
        TrainConfig(global_batch_size=2),
        rank=rank,
        world_size=world_size,
        master_port=port,
        num_threads=1,
        load_reference=True,
        reference_dir=reference_dir,
        fsdp=fsdp,
    )
    assert trainer.ref_model is not None
    result = {"policy": describe(trainer.policy), "ref": describe(trainer.ref_model)}
    torch.save(result, out_dir / f"rank{rank}.pt")
    trainer.close()


def build_ranks(
    model_dirs: list[Path], reference_dir: Path, out_dir: Path, fsdp: FsdpLayout | None = None
) -> list[dict[str, Any]]:
    out_dir.mkdir()
    world_size = len(model_dirs)
    ranks = mp.start_processes(
        build_rank,
        args=(world_size, free_port(), model_dirs, reference_dir, fsdp or FsdpLayout(), out_dir),
        nprocs=world_size,
        join=False,
        start_method="fork",  # no re-import of torch and transformers
    )
    join_ranks(ranks, f"{world_size}-rank construction")
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(world_size)]


def assert_equal_tensors(got: dict[str, Tensor], want: dict[str, Tensor], where: str) -> None:
    assert got.keys() == want.keys(), where
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), (where, name)


def assert_is_eager_load(
    got: dict[str, Any], folder: Path, frozen: bool, same_path: bool = True
) -> None:
    """`got` (a rank's model) is the folder loaded whole in one process, bit for bit;
    `same_path`: the rank was given the folder's path (its config records it)."""
    eager = load_causal_lm(folder)
    assert_equal_tensors(
        got["weights"], {n: p.detach() for n, p in eager.named_parameters()}, "weights"
    )
    # the rotary embedding's buffers are in no state dict: they came by broadcast
    assert "model.rotary_emb.inv_freq" in got["buffers"].keys() - eager.state_dict().keys()
    assert_equal_tensors(got["buffers"], dict(eager.named_buffers()), "buffers")
    assert got["tied"] == eager.config.tie_word_embeddings
    assert got["tied"] == (eager.lm_head.weight is eager.model.embed_tokens.weight)
    assert not got["training"]
    assert got["requires_grad"] == [not frozen] * len(got["requires_grad"])
    config = eager.config.to_dict()
    if not same_path:
        del got["config"]["_name_or_path"], config["_name_or_path"]
    assert got["config"] == config
    assert got["attn"] == eager.config._attn_implementation
    assert got["generation"] == eager.generation_config.to_json_string(use_diff=False)


@pytest.fixture(scope="module")
def reference_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A reference with other weights than the policy's, so that neither stands in for the
    other unnoticed."""
    return save_tiny_qwen3(tmp_path_factory.mktemp("reference"), seed=1)


@pytest.mark.parametrize("tied", [True, False], ids=["tied-embeddings", "untied"])
def test_every_rank_holds_rank0s_model(tied: bool, reference_dir: Path, tmp_path: Path) -> None:
    """On 2 ranks, the policy and the reference on each rank are what one process loading
    the folders gets: the same whole weights and buffers, tied embeddings still one tensor,
    eval mode, the reference without gradients, the same config and generation config."""
    model_dir = save_tiny_qwen3(tmp_path / "policy", seed=2, tied=tied)
    ranks = build_ranks([model_dir, model_dir], reference_dir, tmp_path / "out")
    for result in ranks:
        assert_is_eager_load(result["policy"], model_dir, frozen=False)
        assert_is_eager_load(result["ref"], reference_dir, frozen=True)


def test_only_rank0_reads_the_weights(
    tiny_model_dir: Path, reference_dir: Path, tmp_path: Path
) -> None:
    """Rank 1 is handed a copy of the folder without its *.safetensors files (and FSDP2's CPU
    offload on, whose shards live on the host): it could read nothing but the config, and
    still holds the model rank 0 read."""
    weightless = tmp_path / "config_only"
    weightless.mkdir()
    for name in ("config.json", "generation_config.json"):
        shutil.copy(tiny_model_dir / name, weightless / name)
    assert not list(weightless.glob("*.safetensors"))
    with pytest.raises(OSError):  # the folder is not loadable on its own
        load_causal_lm(weightless)
    fsdp = FsdpLayout(cpu_offload=True)
    ranks = build_ranks([tiny_model_dir, weightless], reference_dir, tmp_path / "out", fsdp)
    for rank, result in enumerate(ranks):
        assert_is_eager_load(result["policy"], tiny_model_dir, frozen=False, same_path=rank == 0)
        assert_is_eager_load(result["ref"], reference_dir, frozen=True)


def test_built_model_matches_the_loaded_one_without_storage(tiny_model_dir: Path) -> None:
    """`build_causal_lm` gives the loaded model's architecture and configs, every tensor on
    the meta device."""
    built = build_causal_lm(tiny_model_dir)
    loaded = load_causal_lm(tiny_model_dir)
    assert [n for n, _ in built.named_parameters()] == [n for n, _ in loaded.named_parameters()]
    assert all(t.is_meta for t in [*built.parameters(), *built.buffers()])
    assert built.config.to_json_string(use_diff=False) == loaded.config.to_json_string(
        use_diff=False
    )
    assert built.lm_head.weight is built.model.embed_tokens.weight
    assert not built.training
