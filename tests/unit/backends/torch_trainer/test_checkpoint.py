"""Sharded checkpoints of the torch trainer: exact resume, resharding across data-parallel
sizes and CPU offload, the legacy rank_0.pt format, HF export, and a refused write.

Ranks are forked processes on gloo holding a tiny Qwen3 sharded with FSDP2 (`fully_shard`
per decoder layer and at the root), as the trainer shards it."""

from __future__ import annotations

import errno
import resource
import signal
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
from transformers import AutoModelForCausalLM

from rlpost.backends.torch_trainer.checkpoint import (
    LEGACY_FILE,
    RECORD_FILE,
    load_sharded,
    read_extra,
    read_full_model_state,
    save_sharded,
)
from rlpost.backends.torch_trainer.model_io import load_causal_lm
from rlpost.backends.torch_trainer.optim import build_optimizer
from rlpost.runtime import checkpoint
from rlpost.runtime.run_state import (
    TRAINER_DIR,
    LoopState,
    SavedGroups,
    export_checkpoint_hf,
    write_driver_state,
)
from rlpost.schema import OptimConfig

from .conftest import join_ranks

FULL = StateDictOptions(full_state_dict=True)
OPTIM = OptimConfig(lr=1e-2, weight_decay=0.1)
Trained = tuple[nn.Module, torch.optim.Optimizer]


# ---- building and stepping a model -------------------------------------------------------


def build(model_dir: Path, shard: bool = False, offload: bool = False) -> Trained:
    """The tiny model and the trainer's AdamW; sharded over every rank of the process group."""
    model = load_causal_lm(model_dir, "sdpa")
    if shard:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        policy = {"offload_policy": CPUOffloadPolicy(pin_memory=False)} if offload else {}
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh, **policy)
        fully_shard(model, mesh=mesh, **policy)
    return model, build_optimizer(model, OPTIM)


def step(trained: Trained, seed: int) -> None:
    """One AdamW step on random tokens (each rank its own: `seed` and the rank)."""
    model, optimizer = trained
    rank = dist.get_rank() if dist.is_initialized() else 0
    generator = torch.Generator().manual_seed(1000 * seed + rank)
    ids = torch.randint(2, 64, (2, 12), generator=generator)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def full_state(trained: Trained) -> dict[str, Any]:
    """Unsharded model and optimizer state (a collective when the model is sharded)."""
    model, optimizer = trained
    return {
        "model": get_model_state_dict(model, options=FULL),
        "optimizer": get_optimizer_state_dict(model, optimizer, options=FULL),
    }


def assert_same(got: Any, want: Any, where: str = "") -> None:
    """Equal bitwise: tensors by torch.equal, containers item by item (a tuple and a
    list alike: a torch.load'ed optimizer state holds its betas as a list)."""
    if isinstance(want, Tensor):
        assert isinstance(got, Tensor) and torch.equal(got, want), where
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), where
        for key in want:
            assert_same(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list | tuple):
        assert isinstance(got, list | tuple) and len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert_same(a, b, f"{where}[{i}]")
    else:
        assert got == want, where


# ---- running ranks ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(rank: int, port: int, body: Callable[..., Any], args: tuple[Any, ...]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        body(rank, *args)
    finally:
        dist.destroy_process_group()


def run_two_ranks(body: Callable[..., Any], *args: Any) -> None:
    """`body(rank, *args)` in two forked gloo ranks (fork: no re-import of torch and
    transformers); a deadline turns a hang into a failure."""
    ranks = mp.start_processes(
        _rank_main, args=(free_port(), body, args), nprocs=2, join=False, start_method="fork"
    )
    join_ranks(ranks, "the 2-rank run")


def _save_dp2(rank: int, model_dir: Path, ckpt: Path, out: Path) -> None:
    trained = build(model_dir, shard=True)
    step(trained, 0)
    save_sharded(ckpt, *trained, {"step": 1})
    state = full_state(trained)
    if rank == 0:
        torch.save(state, out)


@pytest.fixture(scope="module")
def dp2_checkpoint(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, Any]]:
    """A checkpoint two FSDP2 ranks saved after one step, and their full state then."""
    root = tmp_path_factory.mktemp("dp2")
    run_two_ranks(_save_dp2, tiny_model_dir, root / "ckpt", root / "full.pt")
    return root / "ckpt", torch.load(root / "full.pt")


# ---- the tests ----------------------------------------------------------------------------


def _resume_same_layout(rank: int, model_dir: Path, ckpt: Path, out: Path) -> None:
    uninterrupted = build(model_dir, shard=True)
    step(uninterrupted, 0)
    save_sharded(ckpt, *uninterrupted, {"step": 1})
    step(uninterrupted, 1)
    resumed = build(model_dir, shard=True)
    extra = load_sharded(ckpt, *resumed)
    step(resumed, 1)
    states = full_state(uninterrupted), full_state(resumed)
    if rank == 0:
        files = {f.name: f.stat().st_size for f in ckpt.iterdir()}
        torch.save({"extra": extra, "states": states, "files": files}, out)


def test_resume_on_the_same_layout_continues_bitwise(tiny_model_dir: Path, tmp_path: Path) -> None:
    run_two_ranks(_resume_same_layout, tiny_model_dir, tmp_path / "ckpt", tmp_path / "out.pt")
    result = torch.load(tmp_path / "out.pt")
    assert result["extra"] == {"step": 1}
    files = result["files"]
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", RECORD_FILE} <= files.keys()
    shards = files["__0_0.distcp"], files["__1_0.distcp"]
    assert max(shards) < 0.6 * sum(shards)  # each rank wrote its half, nothing gathered
    uninterrupted, resumed = result["states"]
    assert_same(resumed, uninterrupted)


def test_a_two_rank_checkpoint_loads_into_one_plain_process(
    dp2_checkpoint: tuple[Path, dict[str, Any]], tiny_model_dir: Path
) -> None:
    ckpt, saved = dp2_checkpoint
    trained = build(tiny_model_dir)
    assert load_sharded(ckpt, *trained) == {"step": 1}
    assert_same(full_state(trained), saved)
    assert_same(read_full_model_state(ckpt), saved["model"])


def _load_and_dump(rank: int, model_dir: Path, ckpt: Path, out: Path, offload: bool) -> None:
    trained = build(model_dir, shard=True, offload=offload)
    extra = load_sharded(ckpt, *trained)
    state = full_state(trained)
    if rank == 0:
        torch.save({"extra": extra, "state": state}, out)


def test_a_one_process_checkpoint_loads_into_two_ranks(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    trained = build(tiny_model_dir)
    step(trained, 0)
    step(trained, 1)
    save_sharded(tmp_path / "ckpt", *trained, {"step": 2})
    run_two_ranks(_load_and_dump, tiny_model_dir, tmp_path / "ckpt", tmp_path / "out.pt", False)
    result = torch.load(tmp_path / "out.pt")
    assert result["extra"] == {"step": 2}
    assert_same(result["state"], full_state(trained))


def _across_offload(rank: int, model_dir: Path, ckpt: Path, root: Path) -> None:
    offloaded = build(model_dir, shard=True, offload=True)
    load_sharded(ckpt, *offloaded)
    step(offloaded, 1)
    save_sharded(root / "offloaded", *offloaded, {"step": 2})
    plain = build(model_dir, shard=True)
    load_sharded(root / "offloaded", *plain)
    states = full_state(offloaded), full_state(plain)
    if rank == 0:
        torch.save(states, root / "out.pt")


def test_resume_across_cpu_offload_on_and_off(
    dp2_checkpoint: tuple[Path, dict[str, Any]], tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Saved without offload, loaded with it; saved with it, loaded without."""
    ckpt, saved = dp2_checkpoint
    run_two_ranks(_across_offload, tiny_model_dir, ckpt, tmp_path)
    offloaded, plain = torch.load(tmp_path / "out.pt")
    assert_same(plain, offloaded)
    assert offloaded["optimizer"]["state"]  # AdamW state travelled both ways
    changed = [k for k, v in offloaded["model"].items() if not torch.equal(v, saved["model"][k])]
    assert changed  # and the step between took part


def test_legacy_rank0_checkpoint_loads_into_a_sharded_model(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The format before sharding: rank 0's torch.save of a plain model and its AdamW."""
    model, optimizer = trained = build(tiny_model_dir)
    step(trained, 0)
    legacy = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": {"step": 3},
    }
    (tmp_path / "ckpt").mkdir()
    torch.save(legacy, tmp_path / "ckpt" / LEGACY_FILE)
    run_two_ranks(_load_and_dump, tiny_model_dir, tmp_path / "ckpt", tmp_path / "out.pt", False)
    result = torch.load(tmp_path / "out.pt")
    assert result["extra"] == {"step": 3} == read_extra(tmp_path / "ckpt")
    assert_same(result["state"], full_state(trained))
    assert_same(read_full_model_state(tmp_path / "ckpt"), legacy["model"])


@pytest.mark.parametrize("legacy", [False, True], ids=["sharded", "legacy"])
def test_a_checkpoint_without_optimizer_leaves_adam_fresh(
    tiny_model_dir: Path, tmp_path: Path, legacy: bool
) -> None:
    model, _ = trained = build(tiny_model_dir)
    step(trained, 0)
    if legacy:
        state = {"model": model.state_dict(), "scheduler": {"step": 1}}
        torch.save(state, tmp_path / LEGACY_FILE)
    else:
        save_sharded(tmp_path, model, None, {"step": 1})
    other = build(tiny_model_dir)
    step(other, 5)  # an optimizer with state, which the load must drop
    assert load_sharded(tmp_path, *other) == {"step": 1}
    assert not other[1].state
    assert_same(get_model_state_dict(other[0]), get_model_state_dict(model))


def test_exported_hf_folder_holds_the_sharded_checkpoints_weights(
    dp2_checkpoint: tuple[Path, dict[str, Any]], tiny_model_dir: Path, tmp_path: Path
) -> None:
    ckpt, saved = dp2_checkpoint
    run_dir = tmp_path / "run"
    staging = checkpoint.start_save(run_dir, 1)
    (staging / TRAINER_DIR).mkdir()
    for item in ckpt.iterdir():
        (staging / TRAINER_DIR / item.name).write_bytes(item.read_bytes())
    config = f"model:\n  hf_checkpoint: {tiny_model_dir}\n  load: null\n"
    state = LoopState(1, {"epoch": 0, "offset": 4, "seed": 1})
    write_driver_state(staging, state, SavedGroups(), config, "{}\n")
    path = checkpoint.commit_save(staging, keep_last=2)
    out = export_checkpoint_hf(path, tmp_path / "hf")
    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    assert exported.keys() == saved["model"].keys()
    assert_same({k: exported[k] for k in saved["model"]}, saved["model"])


@contextmanager
def file_size_limit(max_bytes: int) -> Iterator[None]:
    """Writes past `max_bytes` fail with EFBIG (SIGXFSZ ignored), as on a full disk."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def test_a_refused_write_is_an_os_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    trained = build(tiny_model_dir)
    step(trained, 0)
    with file_size_limit(4096), pytest.raises(OSError) as refused:
        save_sharded(tmp_path, *trained, {"step": 1})
    assert refused.value.errno == errno.EFBIG
    assert not (tmp_path / RECORD_FILE).exists()  # no checkpoint that looks complete


def _one_rank_refused(rank: int, model_dir: Path, out: Path) -> None:
    trained = build(model_dir, shard=True)
    step(trained, 0)
    raised = None
    with file_size_limit(4096) if rank == 1 else nullcontext():
        try:
            save_sharded(out / "ckpt", *trained, {"step": 1})
        except OSError as exc:
            raised = exc.errno
    step(trained, 1)  # the ranks are still in step: the next collectives line up
    (out / f"rank{rank}.txt").write_text(str(raised))


def test_a_write_refused_on_one_rank_is_an_os_error_on_every_rank(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    run_two_ranks(_one_rank_refused, tiny_model_dir, tmp_path)
    raised = [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)]
    assert raised == [str(errno.EFBIG)] * 2


def test_a_folder_without_a_checkpoint_is_refused_naming_both_formats(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=f"neither {RECORD_FILE}.* nor {LEGACY_FILE}"):
        load_sharded(tmp_path, nn.Linear(2, 2), None)
    with pytest.raises(FileNotFoundError, match="trainer/ folder"):
        read_full_model_state(tmp_path)


def test_an_evaluation_trainer_loads_the_weights_alone_and_sends_them(
    dp2_checkpoint: tuple[Path, dict[str, Any]], tiny_model_dir: Path
) -> None:
    """mode=eval's train rank (trains=False) builds no optimizer: a resumed checkpoint loads
    its model part, and the weights it sends to the engines are the checkpoint's."""
    from rlpost.backends.torch_trainer import TorchTrainer

    from .conftest import configs

    ckpt, saved = dp2_checkpoint
    trainer = TorchTrainer(tiny_model_dir, *configs(2), num_threads=1, trains=False)
    assert trainer.optimizer is None and trainer.ref_model is None
    trainer.load_checkpoint(ckpt)
    sent = {name: t for bucket in trainer.iter_hf_weights() for name, t in bucket}
    assert trainer.step == 1 and sent.keys() <= saved["model"].keys()
    for name, tensor in sent.items():
        torch.testing.assert_close(tensor, saved["model"][name], rtol=0, atol=0)
    assert trainer.offload() == 0  # on CPU: nothing moves, and no optimizer to move
    with pytest.raises(RuntimeError, match="without an optimizer"):
        trainer.state_dict()
    trainer.close()
