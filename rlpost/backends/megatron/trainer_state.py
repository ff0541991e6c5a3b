"""A MegatronTrainer's state on disk and off the GPU: torch_dist checkpoints of the model and
the distributed optimizer, and the host round trip around a colocated rollout.

    <ckpt_dir>/            torch_dist shards every rank writes (metadata.json, *.distcp, ...)
      rlpost_trainer.json  the optimizer step, and whether the optimizer state was saved

The model part loads under any parallel layout; the distributed optimizer's Adam state is
saved in megatron-core's dp_reshardable format, so it loads under the same TP/PP/EP and any DP.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from megatron.core.distributed import DistributedDataParallel

from rlpost.backends.megatron.compat import untie_adam_steps
from rlpost.backends.megatron.convert import load_torch_dist_state, save_torch_dist

STATE_FILE = "rlpost_trainer.json"
# canonical optimizer state (per model parameter): loads under another layout too
OPTIMIZER_CKPT_FORMAT = {"distrib_optim_sharding_type": "dp_reshardable"}


def _sharded_state(
    model: DistributedDataParallel, optimizer: Any, is_loading: bool, with_optimizer: bool
) -> dict[str, Any]:
    model_state = model.module.sharded_state_dict()
    if not with_optimizer:
        return {"model": model_state}
    optimizer_state = optimizer.sharded_state_dict(
        model_state, is_loading=is_loading, metadata=OPTIMIZER_CKPT_FORMAT
    )
    return {"model": model_state, "optimizer": optimizer_state}


def save_state(
    model: DistributedDataParallel, optimizer: Any, step: int, path: Path, with_optimizer: bool
) -> Path:
    """Every rank writes its shards; rank 0 the step record. Collective."""
    save_torch_dist(_sharded_state(model, optimizer, False, with_optimizer), path)
    if dist.get_rank() == 0:
        record = {"step": step, "optimizer": with_optimizer}
        (path / STATE_FILE).write_text(json.dumps(record) + "\n")
    dist.barrier()
    return path


def load_state(model: DistributedDataParallel, optimizer: Any, path: Path) -> int:
    """Load what save_state wrote into this rank's shards; returns the step. Without a saved
    optimizer, Adam starts over from the loaded weights. Collective."""
    record = json.loads((path / STATE_FILE).read_text())
    with_optimizer = bool(record["optimizer"])
    with torch.no_grad():  # fp32 main params are the model's own leaves
        if with_optimizer:
            _materialize_optimizer_state(optimizer)
        sharded = _sharded_state(model, optimizer, True, with_optimizer)
        state = load_torch_dist_state(sharded, path)
        model.module.load_state_dict(state["model"], strict=False)
        if with_optimizer:
            optimizer.load_state_dict(state["optimizer"])
            untie_adam_steps(optimizer)
        else:  # the optimizer's own (e.g. fp32 main) copies of the weights follow them
            optimizer.reload_model_params()
    return int(record["step"])


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
