"""Trainer backend on megatron-core: the seed models under TP, PP, CP, EP and DP.

    trainer = MegatronTrainer(model, algo, optim, train, plan.parallel, rank=r, world_size=n)

On a machine without CUDA it runs on CPU over gloo (compat.py says how and when that can go).
Names are imported on first use, so the light modules (model_yaml) load without megatron-core.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "MegatronSettings": "rlpost.backends.megatron.config",
    "ParallelSizes": "rlpost.backends.megatron.config",
    "megatron_settings": "rlpost.backends.megatron.config",
    "hf_to_torch_dist": "rlpost.backends.megatron.conversion",
    "torch_dist_to_hf": "rlpost.backends.megatron.conversion",
    "MegatronTrainer": "rlpost.backends.megatron.trainer",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
