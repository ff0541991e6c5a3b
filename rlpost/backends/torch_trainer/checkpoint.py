"""The torch trainer's checkpoints: torch.distributed.checkpoint (DCP), one shard file per rank.

    <ckpt_dir>/
      .metadata            DCP's index: each tensor's global shape and where its pieces lie
      __<r>_0.distcp       rank r's pieces of the model and optimizer state, as it holds them
      trainer_state.json   format, whether the optimizer was saved, the trainer's `extra`
                           (its step); rank 0 writes it last, so its presence means complete

Each rank writes the shards it holds (FSDP2's DTensors) and reads back whatever shards it
holds at load time, so a checkpoint loads under another data-parallel size, with FSDP2's CPU
offload on or off, or into a plain module in a process with no process group. Checkpoints
from before hold one `rank_0.pt` (every rank held a replica; rank 0 wrote
`{"model", "optimizer", "scheduler": {"step"}}`); they still load, into any sharding.

A disk that refuses a write (ENOSPC, EDQUOT, EFBIG) raises OSError on every rank, so the run
skips that save on all ranks alike and trains on.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

LEGACY_FILE = "rank_0.pt"  # the format before sharding: rank 0's replica, torch.save
RECORD_FILE = "trainer_state.json"
FORMAT = "torch_dcp"
FORMAT_VERSION = 1
MODEL_KEY, OPTIMIZER_KEY = "model", "optimizer"
FULL = StateDictOptions(full_state_dict=True)


def save_sharded(
    ckpt_dir: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    extra: dict[str, Any],
) -> None:
    """Every rank writes its shards of `model` (and `optimizer`'s state) into `ckpt_dir`;
    rank 0 then writes `extra` (small, JSON-able) beside them. Collective when a process
    group is initialised. OSError on every rank when any rank's disk refuses a write."""
    path = Path(ckpt_dir)
    # An optimizer that has not stepped holds no state; a fresh one is the same on resume,
    # and asking DCP for its state dict would take a zero step on the live optimizer.
    with_optimizer = optimizer is not None and bool(optimizer.state)
    record = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "optimizer_saved": with_optimizer,
        "extra": extra,
    }
    text = json.dumps(record, indent=1) + "\n"  # a non-JSON `extra` fails before any write
    state: dict[str, Any] = {MODEL_KEY: get_model_state_dict(model)}
    if with_optimizer:
        assert optimizer is not None
        state[OPTIMIZER_KEY] = get_optimizer_state_dict(model, optimizer)
    path.mkdir(parents=True, exist_ok=True)
    if _rank() == 0:  # a save over an older one is incomplete until the record is back
        (path / RECORD_FILE).unlink(missing_ok=True)
    try:
        with _quiet_single_process():
            dcp_save(state, storage_writer=_Writer(path), no_dist=not _distributed())
    except CheckpointException as exc:  # a BaseException: make it one the run handles
        raise _plain_error(exc) from exc
    error: OSError | None = None
    if _rank() == 0:
        try:
            _write_synced(path / RECORD_FILE, text.encode())
        except OSError as exc:
            error = exc
    error = _from_rank0(error)  # every rank raises, or none: the next collective lines up
    if error is not None:
        raise error


def load_sharded(
    ckpt_dir: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None
) -> dict[str, Any]:
    """Load a checkpoint of either format into `model` and `optimizer` as they are sharded
    now (any data-parallel size, CPU offload or not, or a plain module); returns the saved
    `extra` (the legacy format's `scheduler` dict). Without saved optimizer state the
    optimizer is left fresh: Adam starts over. Collective when a process group is
    initialised."""
    path = Path(ckpt_dir)
    if (path / RECORD_FILE).is_file():
        return _load_dcp(path, model, optimizer)
    if (path / LEGACY_FILE).is_file():
        return _load_legacy(path, model, optimizer)
    raise _not_a_checkpoint(path)


def read_full_model_state(ckpt_dir: str | Path) -> dict[str, Tensor]:
    """The model's full (unsharded) tensors by state-dict name, on the CPU, from either
    format; needs no process group (export to HF, inspection)."""
    path = Path(ckpt_dir)
    if not (path / RECORD_FILE).is_file():
        if (path / LEGACY_FILE).is_file():
            state: dict[str, Tensor] = _load_legacy_file(path)[MODEL_KEY]
            return state
        raise _not_a_checkpoint(path)
    _read_record(path)
    reader = FileSystemReader(path)
    prefix = MODEL_KEY + "."
    full = {
        key.removeprefix(prefix): torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in reader.read_metadata().state_dict_metadata.items()
        if key.startswith(prefix) and isinstance(meta, TensorStorageMetadata)
    }
    try:
        with _quiet_single_process():
            dcp_load({MODEL_KEY: full}, storage_reader=reader, no_dist=True)
    except CheckpointException as exc:
        raise _plain_error(exc) from exc
    return full


def read_extra(ckpt_dir: str | Path) -> dict[str, Any]:
    """The `extra` a checkpoint was saved with (the legacy format's `scheduler` dict)."""
    path = Path(ckpt_dir)
    if (path / RECORD_FILE).is_file():
        extra: dict[str, Any] = _read_record(path)["extra"]
        return extra
    if (path / LEGACY_FILE).is_file():
        return dict(_load_legacy_file(path)["scheduler"])
    raise _not_a_checkpoint(path)


# ---- loading ----------------------------------------------------------------------------


def _not_a_checkpoint(path: Path) -> FileNotFoundError:
    return FileNotFoundError(
        f"{path} holds no torch trainer checkpoint: neither {RECORD_FILE} (sharded, beside "
        f"DCP's .metadata) nor {LEGACY_FILE} (before sharding); point at a checkpoint's "
        "trainer/ folder"
    )


def _read_record(path: Path) -> dict[str, Any]:
    record: dict[str, Any] = json.loads((path / RECORD_FILE).read_text(encoding="utf-8"))
    if record.get("format") != FORMAT or record.get("version") != FORMAT_VERSION:
        raise ValueError(
            f"{path / RECORD_FILE} is format {record.get('format')!r} version "
            f"{record.get('version')!r}; this rlpost reads {FORMAT!r} version {FORMAT_VERSION}"
        )
    return record


def _load_dcp(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None
) -> dict[str, Any]:
    record = _read_record(path)
    with_optimizer = optimizer is not None and bool(record["optimizer_saved"])
    state: dict[str, Any] = {MODEL_KEY: get_model_state_dict(model)}
    if with_optimizer:
        assert optimizer is not None
        # initialises the optimizer's state (a step with zero gradients and lr 0) for DCP to
        # load into; every value is then overwritten
        state[OPTIMIZER_KEY] = get_optimizer_state_dict(model, optimizer)
    elif optimizer is not None:
        optimizer.state.clear()
    try:
        with _quiet_single_process():
            dcp_load(state, checkpoint_id=path, no_dist=not _distributed())
    except CheckpointException as exc:
        raise _plain_error(exc) from exc
    set_model_state_dict(model, state[MODEL_KEY])
    if with_optimizer:
        assert optimizer is not None
        set_optimizer_state_dict(model, optimizer, state[OPTIMIZER_KEY])
    extra: dict[str, Any] = record["extra"]
    return extra


def _load_legacy_file(path: Path) -> dict[str, Any]:
    state: dict[str, Any] = torch.load(path / LEGACY_FILE, map_location="cpu", weights_only=True)
    return state


def _load_legacy(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None
) -> dict[str, Any]:
    """Every rank reads the whole replica and keeps its shards of it."""
    state = _load_legacy_file(path)
    set_model_state_dict(model, state[MODEL_KEY], options=FULL)
    if optimizer is not None:
        optimizer.state.clear()
        if OPTIMIZER_KEY in state:
            named = _name_legacy_optimizer_state(model, optimizer, state[OPTIMIZER_KEY])
            set_optimizer_state_dict(model, optimizer, named, options=FULL)
    return dict(state["scheduler"])


def _name_legacy_optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, saved: dict[str, Any]
) -> dict[str, Any]:
    """`optimizer.state_dict()` keys parameters by position in its groups; DCP's full
    optimizer state dict keys them by name. The positions are this optimizer's: the trainer
    builds its groups from the model's parameters in the same order either way."""
    names = {id(p): name for name, p in model.named_parameters()}
    groups = optimizer.param_groups
    saved_groups = saved["param_groups"]
    shapes = [len(g["params"]) for g in groups], [len(g["params"]) for g in saved_groups]
    if shapes[0] != shapes[1]:
        raise ValueError(
            f"the optimizer in {LEGACY_FILE} has parameter groups of sizes {shapes[1]}, this "
            f"trainer's has {shapes[0]}: it was saved for another model or optimizer layout; "
            "resume with the model the run was saved with, or start the run over"
        )
    state, param_groups = {}, []
    for group, saved_group in zip(groups, saved_groups, strict=True):
        fqns = [names[id(p)] for p in group["params"]]
        for fqn, index in zip(fqns, saved_group["params"], strict=True):
            if index in saved["state"]:
                state[fqn] = saved["state"][index]
        param_groups.append({**saved_group, "params": fqns})
    return {"state": state, "param_groups": param_groups}


# ---- writing ----------------------------------------------------------------------------


class _Writer(FileSystemWriter):
    """DCP's file writer, one file per rank, reporting a refused write as the OSError it is.

    DCP writes tensors with torch.save into a Python file: a write the disk refuses
    surfaces as a RuntimeError ("unexpected pos") with the OSError behind it, and only this
    rank sees what is behind it (exceptions cross ranks pickled, without their context).
    Re-raised here as the OSError, every rank's CheckpointException carries it.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(path, single_file_per_rank=True, sync_files=True, overwrite=True)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        try:
            return super().write_data(plan, planner)
        except RuntimeError as exc:
            _raise_os_error_behind(exc)
            raise

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        try:
            super().finish(metadata, results)
        except RuntimeError as exc:
            _raise_os_error_behind(exc)
            raise


def _raise_os_error_behind(exc: RuntimeError) -> None:
    cause = _os_error_behind(exc)
    if cause is not None:
        raise cause from exc


def _os_error_behind(exc: BaseException) -> OSError | None:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _plain_error(exc: CheckpointException) -> Exception:
    """The first rank's OSError when any rank's disk refused a write (every rank sees the
    same failures, so every rank raises it), else a RuntimeError with DCP's report."""
    for rank in sorted(exc.failures):
        failure, _ = exc.failures[rank]
        cause = _os_error_behind(failure)
        if cause is not None:
            return type(cause)(cause.errno, f"rank {rank}: {cause.strerror}", cause.filename)
    return RuntimeError(str(exc))


def _write_synced(path: Path, data: bytes) -> None:
    with path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


@contextmanager
def _quiet_single_process() -> Iterator[None]:
    """DCP warns on every save and load without a process group, even when told so
    (`no_dist=True`); a single process is a supported case here, not a mistake."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable")
        yield


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


def _from_rank0(value: OSError | None) -> OSError | None:
    if not _distributed():
        return value
    box: list[OSError | None] = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
