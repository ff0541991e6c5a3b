"""Trainer backend on megatron-core: the seed models under TP, PP, CP, EP and DP.

    trainer = MegatronTrainer(model, algo, optim, train, plan.parallel, rank=r, world_size=n)

On a machine without CUDA it runs on CPU over gloo (compat.py says how and when that can go).
Names are imported on first use, so the light modules (model_yaml) load without megatron-core.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

# Said by megatron-core (or torch under it) on every import or step, about things rlpost chose:
# no TransformerEngine/Apex on CPU, megatron-core's own collective calls and leaf checks.
KNOWN_NOISE = (
    r"Transformer Engine and Apex are not installed",
    r"Apex is not installed",
    r"full scope is deprecated",
    r"The \.grad attribute of a Tensor that is not a leaf",
    r"`torch\.distributed\.(reduce_scatter_tensor|all_gather_into_tensor)` is deprecated",
    r"`load_state_dict` is deprecated",
    r"Please use DTensor instead and we are deprecating ShardedTensor",
)

_EXPORTS = {
    "MegatronSettings": "rlpost.backends.megatron.config",
    "ParallelSizes": "rlpost.backends.megatron.config",
    "megatron_settings": "rlpost.backends.megatron.config",
    "hf_to_torch_dist": "rlpost.backends.megatron.conversion",
    "torch_dist_to_hf": "rlpost.backends.megatron.conversion",
    "MegatronTrainer": "rlpost.backends.megatron.trainer",
}
__all__ = sorted(_EXPORTS)


def silence_known_warnings() -> None:
    """Keep a run's log to what matters: drop megatron-core's known, expected warnings."""
    for pattern in KNOWN_NOISE:
        warnings.filterwarnings("ignore", message=pattern)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
