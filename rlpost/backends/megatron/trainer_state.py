"""A MegatronTrainer's state on disk and off the GPU: torch_dist checkpoints of the model and
the distributed optimizer, and the host round trip around a colocated rollout.

    <ckpt_dir>/            torch_dist shards every rank writes (metadata.json, *.distcp, ...)
      rlpost_trainer.json  the optimizer step, and whether the optimizer state was saved

The model part loads under any parallel layout. The distributed optimizer's Adam state is
saved in megatron-core's fully_reshardable format: one tensor per model parameter (gathered
on each DP group's first rank), so it loads under any TP, PP, CP, EP, ETP and DP. Checkpoints
written before carry dp_reshardable state (the record says which), which loads under the same
TP/PP/EP and any DP.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from megatron.core.distributed import DistributedDataParallel

from rlpost.backends.megatron.ckpt_format import (
    LEGACY_OPTIMIZER_FORMAT,
    OPTIMIZER_FORMAT,
    STATE_FILE,
    saved_optimizer_format,
)
from rlpost.backends.megatron.compat import untie_adam_steps
from rlpost.backends.megatron.convert import load_torch_dist_state, save_torch_dist


def _parts(optimizer: Any) -> list[Any]:
    """The optimizers a (chained) megatron optimizer is made of: dense parameters and, with
    expert parallelism, experts apart; how many depends on the layout."""
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def _sharded_state(
    model: DistributedDataParallel,
    optimizer: Any,
    is_loading: bool,
    with_optimizer: bool,
    optimizer_format: str = OPTIMIZER_FORMAT,
) -> dict[str, Any]:
    """The model's sharded state and, per optimizer part, its Adam state. In the reshardable
    format each part's tensors are keyed by parameter name alone (no part index), so a
    checkpoint loads whichever way the next layout splits its parameters into parts."""
    model_state = model.module.sharded_state_dict()
    if not with_optimizer:
        return {"model": model_state}
    metadata = {"distrib_optim_sharding_type": optimizer_format}
    if optimizer_format == LEGACY_OPTIMIZER_FORMAT:
        state = optimizer.sharded_state_dict(model_state, is_loading=is_loading, metadata=metadata)
        return {"model": model_state, "optimizer": state}
    sync = getattr(optimizer, "_synchronize_steps", None)
    if sync is not None and not is_loading:
        sync()
    parts = {
        str(i): part.sharded_state_dict(model_state, is_loading=is_loading, metadata=metadata)
        for i, part in enumerate(_parts(optimizer))
    }
    return {"model": model_state, "optimizer": parts}


def save_state(
    model: DistributedDataParallel, optimizer: Any, step: int, path: Path, with_optimizer: bool
) -> Path:
    """Every rank writes its shards; rank 0 the step record. Collective."""
    save_torch_dist(_sharded_state(model, optimizer, False, with_optimizer), path)
    if dist.get_rank() == 0:
        record = {"step": step, "optimizer": with_optimizer, "optimizer_format": OPTIMIZER_FORMAT}
        (path / STATE_FILE).write_text(json.dumps(record) + "\n")
    dist.barrier()
    return path


def load_state(model: DistributedDataParallel, optimizer: Any, path: Path) -> int:
    """Load what save_state wrote into this rank's shards (under any layout, for the
    reshardable format); returns the step. Without a saved optimizer, Adam starts over from
    the loaded weights. Collective."""
    record = json.loads((path / STATE_FILE).read_text())
    fmt = saved_optimizer_format(path)
    with torch.no_grad():  # fp32 main params are the model's own leaves
        if fmt is not None:
            _materialize_optimizer_state(optimizer)
        sharded = _sharded_state(model, optimizer, True, fmt is not None, fmt or OPTIMIZER_FORMAT)
        state = load_torch_dist_state(sharded, path)
        model.module.load_state_dict(state["model"], strict=False)
        if fmt == LEGACY_OPTIMIZER_FORMAT:
            optimizer.load_state_dict(state["optimizer"])
        elif fmt is not None:
            _load_parts(optimizer, state["optimizer"])
        else:  # the optimizer's own (e.g. fp32 main) copies of the weights follow them
            optimizer.reload_model_params()
        if fmt is not None:
            untie_adam_steps(optimizer)
    return int(record["step"])


def load_weights(module: torch.nn.Module, path: Path) -> int:
    """The model part of what save_state wrote, into a GPTModel built without an optimizer
    (mode=eval); returns the step. Collective."""
    record = json.loads((path / STATE_FILE).read_text())
    with torch.no_grad():
        state = load_torch_dist_state({"model": module.sharded_state_dict()}, path)  # type: ignore[operator]
        module.load_state_dict(state["model"], strict=False)
    return int(record["step"])


def _saved_steps(tree: Any) -> set[int]:
    """Adam's step count wherever the saved (common) state holds param groups."""
    found: set[int] = set()
    if isinstance(tree, dict):
        for key, value in tree.items():
            if key == "param_groups" and isinstance(value, list):
                found |= {int(g["step"]) for g in value if isinstance(g, dict) and "step" in g}
            else:
                found |= _saved_steps(value)
    return found


def _load_parts(optimizer: Any, loaded: dict[str, Any]) -> None:
    """Each optimizer part takes its parameters' loaded state, with its own param groups
    (hyperparameters come from the config) and the saved step count."""
    steps = _saved_steps(loaded)
    if len(steps) > 1:
        raise ValueError(f"the checkpoint's optimizer parts disagree on the step: {steps}")
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    for i, part in enumerate(_parts(optimizer)):
        if not isinstance(part, DistributedOptimizer):
            # a replicated optimizer's state is keyed by parameter already (the resume check
            # keeps its layout's parts: no EP/ETP change)
            part.load_state_dict(loaded[str(i)])
            continue
        own = part.state_dict()
        for group in own["optimizer"]["param_groups"]:
            if steps and "step" in group:
                group["step"] = next(iter(steps))
        own["param_state"] = loaded[str(i)]["param_state"]
        own["param_state_sharding_type"] = OPTIMIZER_FORMAT
        part.load_state_dict(own)


def _materialize_optimizer_state(optimizer: Any) -> None:
    """The distributed optimizer describes its checkpoint from existing Adam state; before the
    first step there is none, so take megatron-core's zero-gradient step (the loaded values
    then overwrite it)."""
    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        fill = getattr(part, "_init_optimizer_states_with_dummy_values", None)
        if fill is not None and not part.optimizer.state:
            fill()


def offload_to_host(model: DistributedDataParallel, optimizer: Any) -> int:
    """Weights, gradient buffers and optimizer state to host memory (megatron-core's own RL
    helpers); returns the bytes freed on the GPU, as measured."""
    held = torch.cuda.memory_allocated()
    for buffer in model.buffers + model.expert_parallel_buffers:
        buffer.offload_to_cpu(move_params=True, move_grads=True)
    optimizer.offload_to_cpu()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return max(0, held - torch.cuda.memory_allocated())


def onload_from_host(model: DistributedDataParallel, optimizer: Any) -> None:
    """Back from offload_to_host before training."""
    for buffer in model.buffers + model.expert_parallel_buffers:
        buffer.reload_from_cpu(move_params=True, move_grads=True)
    optimizer.restore_from_cpu()
    torch.cuda.synchronize()
