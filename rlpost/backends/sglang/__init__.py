"""Engines that speak SGLang's HTTP API: SGLang itself (GPU) and rlpost's CPU engine.

`launch` builds each engine's command from the plan (importable anywhere: no torch, ray or
sglang); `process` runs one; `trainer_side`, `update_group` and `buckets` are the trainer's
half of weight sync (torch).
"""

from rlpost.backends.sglang.launch import (
    ENGINE_BACKENDS,
    EngineBackend,
    EngineSpec,
    engine_backend,
    engine_commands,
    engine_specs,
)

__all__ = [
    "ENGINE_BACKENDS",
    "EngineBackend",
    "EngineSpec",
    "engine_backend",
    "engine_commands",
    "engine_specs",
]
