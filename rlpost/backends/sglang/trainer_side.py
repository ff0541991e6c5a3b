"""The trainer's half of weight sync, probes and offload: functions of a trainer, run in its
own process (`TrainActor.apply(fn, *args)` calls `fn(trainer, *args)`).

A trainer here is either backend (torch or megatron-core): it offers `iter_hf_weights(bucket_bytes)`
(the policy in Hugging Face names, in size-bounded buckets; collective for megatron-core, whose
weights are sharded), `model_dir` (the HF folder with the tokenizer), `compute_logprobs` and, for
offload, `offload()` / `onload()`. State that must outlive one
call (the weight stream being sent, an open weight-update group, a bucket whose IPC handles an
engine is still reading) is kept per process in this module.
"""

from __future__ import annotations

import base64
import pickle
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from rlpost.backends.fp8 import Fp8Format, quantize_named
from rlpost.backends.sglang.buckets import WeightInfo, plan_buckets, weight_infos
from rlpost.backends.sglang.update_group import (
    broadcast_weights,
    destroy_update_group,
    init_update_group,
)

NamedTensors = list[tuple[str, Tensor]]

_GROUPS: dict[str, torch.distributed.ProcessGroup] = {}
_HELD_BUCKET: list[Tensor] = []
_STREAM: dict[str, Iterator[NamedTensors]] = {}
_CURRENT: dict[str, NamedTensors] = {}


# ---- the weight stream: every rank walks it bucket by bucket, in step ----------------------
#
# No rank holds more than one bucket of gathered weights: each step drops the bucket before
# the next is gathered, and nothing looks ahead. The engines learn the new weight version
# from a call of its own once the last bucket is in (rlpost.runtime.weight_sync).


def _one_dtype_buckets(
    buckets: Iterator[NamedTensors], bucket_bytes: int
) -> Iterator[NamedTensors]:
    """The trainer's buckets split so that each holds one dtype (it travels flattened)."""
    for bucket in buckets:
        parts = plan_buckets(weight_infos(bucket), bucket_bytes)
        tensors = dict(bucket)
        del bucket
        for part in parts:
            yield [(w.name, tensors.pop(w.name)) for w in part]
        del tensors


def _quantized(buckets: Iterator[NamedTensors], fp8: Fp8Format) -> Iterator[NamedTensors]:
    """Each bucket as the FP8 checkpoint stores it; the gathered weights are dropped once
    quantised."""
    for bucket in buckets:
        quantised = list(quantize_named(bucket, fp8))
        del bucket
        yield quantised
        del quantised


def open_weight_stream(trainer: Any, bucket_bytes: int, fp8: Fp8Format | None = None) -> None:
    """Start walking the policy's weights; every rank must, when the trainer shards them.
    `fp8`: the engines serve FP8, and each bucket is quantised to it here, on the trainer's
    device, before it travels (weights with no FP8 counterpart go as they are)."""
    trained: Iterator[NamedTensors] = iter(trainer.iter_hf_weights(bucket_bytes))
    if fp8 is not None:
        trained = _quantized(trained, fp8)
    _STREAM["policy"] = _one_dtype_buckets(trained, bucket_bytes)
    _CURRENT.pop("policy", None)


def next_weight_bucket(trainer: Any) -> list[WeightInfo] | None:
    """Advance the stream (on every rank: a step may gather shards); returns the bucket's
    weights, or None once the stream is done. The previous bucket is dropped first."""
    _CURRENT.pop("policy", None)
    bucket = next(_STREAM["policy"], None)
    if bucket is None:
        close_weight_stream(trainer)
        return None
    _CURRENT["policy"] = bucket
    return weight_infos(bucket)


def close_weight_stream(trainer: Any) -> None:
    _STREAM.pop("policy", None)
    _CURRENT.pop("policy", None)


def _current_bucket() -> NamedTensors:
    if "policy" not in _CURRENT:
        raise RuntimeError("no weight bucket is open: call next_weight_bucket on every rank")
    return _CURRENT["policy"]


# ---- distributed (an NCCL group the engines join) ---------------------------------------


def update_group_address(trainer: Any, multi_node: bool) -> tuple[str, int]:
    """Where the group's rendezvous listens: this node (its IP when engines are on other
    nodes), on a port this process holds until `join_update_group` serves the store on it
    (no other launch on the node can take it in between)."""
    from rlpost.backends.ports import hold_port

    host = "127.0.0.1"
    if multi_node:
        import ray

        host = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    return host, hold_port(host)


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


def broadcast_bucket(trainer: Any, group_name: str) -> None:
    """Send the current bucket to the group (train rank 0 only)."""
    device = _group_device(group_name)
    tensors = [t.to(device) for _, t in _current_bucket()]
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


def tensor_bucket_payload(trainer: Any) -> str:
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
    named = [(n, t.detach().to(device)) for n, t in _current_bucket()]
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

    handle = reduce_tensor(tensor)  # type: ignore[no-untyped-call]
    return base64.b64encode(pickle.dumps(handle)).decode()


def tensor_from_payload(payload: str) -> Tensor:
    rebuild, args = pickle.loads(base64.b64decode(payload))
    tensor: Tensor = rebuild(*args)
    return tensor


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


def offload(trainer: Any) -> int:
    """The trainer's model, gradients and optimizer state to host memory while the engines
    generate; returns bytes moved off the accelerator (0 on CPU). Each backend knows where its
    memory lives."""
    moved: int = trainer.offload()
    return moved


def onload(trainer: Any) -> None:
    """Back to the device `offload` took the trainer from."""
    trainer.onload()
