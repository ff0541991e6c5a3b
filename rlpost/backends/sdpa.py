"""Which of SDPA's backends the trainers' padded attention asks for first.

Both trainers attend over packed samples gathered into padded batches on some path (the
megatron trainer's padded path, megatron.kernels.padded_attention; the torch trainer's packed
attention, torch_trainer.attention), and call `F.scaled_dot_product_attention` there inside
`preferred_backends(query)`: on a GPU of CUDNN_FIRST_CAPABILITIES SDPA tries cuDNN's attention
first, elsewhere its own order.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, cast

import torch
from torch import Tensor

from rlpost import switches

CUDNN_FIRST_CAPABILITIES = frozenset({(9, 0)})
"""GPUs on which the padded attention asks SDPA for cuDNN's attention before flash attention's:
Hopper, where cuDNN's kernels train 1.7-2.3x faster for training shapes, and not elsewhere
(slower on Ampere and Blackwell by the same published measurements). A preference, not a
restriction: a call cuDNN cannot serve goes to the next backend, as SDPA chooses by default.
RLPOST_CUDNN_ATTENTION=0 leaves SDPA's own order."""


def sdpa_preference() -> list[Any]:
    """SDPA's backends with cuDNN first, then its default order, each only if it is enabled
    (torch.backends.cuda's switches); [] where this torch cannot set a priority."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if "set_priority" not in inspect.signature(sdpa_kernel).parameters:
        return []
    cuda: Any = torch.backends.cuda  # its switch functions are untyped
    order = [
        (SDPBackend.CUDNN_ATTENTION, cuda.cudnn_sdp_enabled),
        (SDPBackend.FLASH_ATTENTION, cuda.flash_sdp_enabled),
        (SDPBackend.EFFICIENT_ATTENTION, cuda.mem_efficient_sdp_enabled),
        (SDPBackend.MATH, cuda.math_sdp_enabled),
    ]
    return [backend for backend, enabled in order if enabled()]


def preferred_backends(query: Tensor) -> contextlib.AbstractContextManager[Any]:
    """cuDNN first for an SDPA call on `query`'s GPU where CUDNN_FIRST_CAPABILITIES holds it;
    nothing for any other device."""
    if not query.is_cuda or switches.CUDNN_ATTENTION.value() == "0":
        return contextlib.nullcontext()
    if torch.cuda.get_device_capability(query.device) not in CUDNN_FIRST_CAPABILITIES:
        return contextlib.nullcontext()
    backends = sdpa_preference()
    if not backends:
        return contextlib.nullcontext()
    from torch.nn.attention import sdpa_kernel

    return cast(contextlib.AbstractContextManager[Any], sdpa_kernel(backends, set_priority=True))
