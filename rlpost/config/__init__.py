"""Composing and validating a run's config (Hydra in, typed RunConfig out).

    from rlpost.config import compose_run_config
    run, sources = compose_run_config(["model=qwen3-4b", "hardware=h100x8"])

Names are imported on first use, so `import rlpost.config.resolvers` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "compose_run_config": "rlpost.config.loader",
    "load_run_config": "rlpost.config.loader",
    "SourceMap": "rlpost.config.sources",
    "build_source_map": "rlpost.config.sources",
    "prepare_argv": "rlpost.config.overrides",
    "check_overrides": "rlpost.config.overrides",
    "attach_locations": "rlpost.config.diagnostics",
    "check_sglang_options": "rlpost.config.sglang_options",
    "check_hf_config": "rlpost.config.hf_check",
    "register_resolvers": "rlpost.config.resolvers",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rlpost.config' has no attribute '{name}'")
    return getattr(importlib.import_module(module), name)
