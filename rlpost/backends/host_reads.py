"""Counting host reads of tensor values: each one makes the host wait for the GPU.

A `TorchFunctionMode` sees Tensor.item, tolist, cpu, numpy, __int__, __float__, __bool__,
__index__ and .to() towards the host, on CPU tensors too (a TorchDispatchMode misses .tolist()
and .cpu() there, so on CPU it would undercount). The megatron trainer's tests hold the count
per step flat with depth; benchmarks/megatron_train.py --profile prints it.
"""

from __future__ import annotations

import os
import traceback
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

T = torch.Tensor
READS = {T.item, T.tolist, T.cpu, T.numpy, T.__int__, T.__float__, T.__bool__, T.__index__}
MOE_ROUTING = f"megatron{os.sep}core{os.sep}transformer{os.sep}moe{os.sep}"
"""Where megatron-core's MoE code reads its routing counts (its all-to-all is sized by them)."""


CURRENT_DEVICE_ON_CPU = torch.device("cpu")
"""What `torch.cuda.current_device()` answers on a CPU machine while megatron-core runs there
(backends/megatron/compat.py). A `.to()` to it moves a tensor to the device it computes on, so
on a GPU it reads nothing on the host: not counted."""


def _to_host(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    device = kwargs.get("device")
    for arg in args[1:]:
        if isinstance(arg, str | torch.device):
            device = arg
    if device is None or device is CURRENT_DEVICE_ON_CPU:
        return False
    return torch.device(device).type == "cpu"


class HostReads(TorchFunctionMode):
    """Counts host reads by kind while active; with `moe_apart`, those made inside
    megatron-core's MoE code count under "moe" instead."""

    def __init__(self, moe_apart: bool = False) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.moe_apart = moe_apart

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func in READS or (func is T.to and _to_host(args, kwargs)):
            kind = getattr(func, "__name__", str(func))
            if self.moe_apart and any(
                MOE_ROUTING in frame.filename for frame in traceback.extract_stack(limit=12)
            ):
                kind = "moe"
            self.counts[kind] += 1
        return func(*args, **kwargs)
