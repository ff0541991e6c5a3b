"""The trainer's half of weight sync, probes and offload: functions of a trainer, run in its
own process (`TrainActor.apply(fn, *args)` calls `fn(trainer, *args)`).

A trainer here is anything with `model` (a torch module holding the policy under Hugging
Face parameter names), `optimizer`, `model_dir` and `compute_logprobs`, as the torch
trainer has. State that must outlive one call (an open weight-update group, a bucket whose
IPC handles an engine is still reading) is kept per process in this module.
"""

from __future__ import annotations

import base64
import pickle
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from rlpost.backends.sglang.buckets import WeightInfo, weight_infos
from rlpost.backends.sglang.update_group import (
    broadcast_weights,
    destroy_update_group,
    init_update_group,
)

_GROUPS: dict[str, torch.distributed.ProcessGroup] = {}
_HELD_BUCKET: list[Tensor] = []
_OFFLOADED: dict[int, torch.device] = {}


def _named_weights(trainer: Any) -> list[tuple[str, Tensor]]:
    return [(name, p) for name, p in trainer.model.named_parameters()]


def weight_layout(trainer: Any) -> list[WeightInfo]:
    """Every weight the engines receive, in sending order."""
    return weight_infos(_named_weights(trainer))


def _select(trainer: Any, names: Sequence[str]) -> list[tuple[str, Tensor]]:
    weights = dict(_named_weights(trainer))
    missing = [n for n in names if n not in weights]
    if missing:
        raise KeyError(f"the trainer has no weights named {missing[:3]}")
    return [(n, weights[n]) for n in names]


# ---- distributed (an NCCL group the engines join) ---------------------------------------


def update_group_address(trainer: Any, multi_node: bool) -> tuple[str, int]:
    """Where the group's rendezvous listens: this node (its IP when engines are on other
    nodes), on a port free here."""
    from rlpost.backends.sglang.process import free_port

    host = "127.0.0.1"
    if multi_node:
        import ray

        host = ray.util.get_node_ip_address()
    return host, free_port("0.0.0.0" if multi_node else host)


def join_update_group(
    trainer: Any,
    address: tuple[str, int],
    world_size: int,
    group_name: str,
    backend: str,
    timeout_s: float,
) -> None:
    """Rank 0 of the group; returns once every engine rank has joined."""
    _GROUPS[group_name] = init_update_group(
        address[0], address[1], 0, world_size, group_name, backend, timeout_s
    )


def broadcast_bucket(trainer: Any, group_name: str, names: Sequence[str]) -> None:
    device = _group_device(group_name)
    tensors = [t.to(device) for _, t in _select(trainer, names)]
    broadcast_weights(tensors, _GROUPS[group_name])


def _group_device(group_name: str) -> torch.device:
    if torch.distributed.get_backend(_GROUPS[group_name]) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def leave_update_group(trainer: Any, group_name: str) -> None:
    group = _GROUPS.pop(group_name, None)
    if group is not None:
        destroy_update_group(group)


# ---- tensor (CUDA IPC handles of flattened buckets) -------------------------------------


def _sglang_bucket_type() -> Any:
    """SGLang's FlattenedTensorBucket (its module moved between releases)."""
    try:
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket
    except ImportError:
        from sglang.srt.model_executor.model_runner import FlattenedTensorBucket
    return FlattenedTensorBucket


def tensor_bucket_payload(trainer: Any, names: Sequence[str]) -> str:
    """This rank's share of a bucket for SGLang's update_weights_from_tensor with
    load_format "flattened_bucket": a base64 pickle of the flattened tensor (travelling as a
    CUDA IPC handle) and its metadata. The tensor stays alive here until `release_bucket`.

    Built with SGLang's own bucket type and serializer, so the engine (the same SGLang
    install, on the same machine) reads exactly what it expects.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("tensor weight sync passes CUDA IPC handles and needs a GPU")
    from sglang.srt.patch_torch import monkey_patch_torch_reductions
    from sglang.srt.utils import MultiprocessingSerializer

    # Handles name the GPU by UUID, not index: this process sees only its own GPU (as
    # cuda:0) while the engine sees the whole node. Idempotent.
    monkey_patch_torch_reductions()

    device = torch.device("cuda", torch.cuda.current_device())
    named = [(n, t.detach().to(device)) for n, t in _select(trainer, names)]
    bucket = _sglang_bucket_type()(named_tensors=named)
    flat = bucket.get_flattened_tensor()
    _HELD_BUCKET.append(flat)
    payload = {"flattened_tensor": flat, "metadata": bucket.get_metadata()}
    return str(MultiprocessingSerializer.serialize(payload, output_str=True))


def release_bucket(trainer: Any) -> None:
    """Drop the buckets the engines have finished reading."""
    _HELD_BUCKET.clear()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def ipc_handle_payload(tensor: Tensor) -> str:
    """A CUDA tensor as a base64 pickle of its IPC handle (torch's own reduction), readable
    by another process on the same machine with `tensor_from_payload`."""
    from torch.multiprocessing.reductions import reduce_tensor

    return base64.b64encode(pickle.dumps(reduce_tensor(tensor))).decode()


def tensor_from_payload(payload: str) -> Tensor:
    rebuild, args = pickle.loads(base64.b64decode(payload))
    return rebuild(*args)


# ---- probe --------------------------------------------------------------------------------


def probe_prompt_ids(trainer: Any, text: str) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(trainer.model_dir), local_files_only=True)
    return list(tokenizer.encode(text))


def probe_logprobs(trainer: Any, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
    """The trainer's logprobs of `output_ids` after `prompt_ids` (at its rollout temperature)."""
    from rlpost.types import TrainSample

    sample = TrainSample(
        tokens=list(prompt_ids) + list(output_ids), response_length=len(output_ids), reward=0.0
    )
    (logprobs,) = trainer.compute_logprobs([sample])
    return [float(v) for v in logprobs.tolist()]


# ---- offload ------------------------------------------------------------------------------


def _move_optimizer(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, Tensor):
                state[key] = value.to(device, non_blocking=True)


def offload(trainer: Any) -> int:
    """Model, gradients and optimizer state to host memory; returns bytes moved off the
    accelerator (0 when the trainer already runs on the CPU)."""
    params = list(trainer.model.parameters())
    device = params[0].device if params else torch.device("cpu")
    if device.type == "cpu":
        return 0
    moved = sum(p.numel() * p.element_size() for p in params)
    _OFFLOADED[id(trainer)] = device
    trainer.model.to("cpu")
    for p in params:
        if p.grad is not None:
            p.grad = None
    _move_optimizer(trainer.optimizer, torch.device("cpu"))
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return moved


def onload(trainer: Any) -> None:
    """Back to the device `offload` took the trainer from (a no-op when nothing moved)."""
    device = _OFFLOADED.pop(id(trainer), None)
    if device is None:
        return
    trainer.model.to(device)
    _move_optimizer(trainer.optimizer, device)
    torch.cuda.synchronize()
