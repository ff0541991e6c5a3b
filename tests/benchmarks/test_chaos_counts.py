"""benchmarks/chaos.py's count of restarts from a launch's output: an engine's death while it
starts is an engine restart only where engine fault tolerance started it again; without it,
that death restarted the run."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import sys
from pathlib import Path
from types import ModuleType

import pytest

from rlpost.backends.sglang.process import EngineStartError
from rlpost.runtime.engine_pool import EnginePool, HealthSettings

ROOT = Path(__file__).resolve().parents[2]


def load_chaos() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chaos", ROOT / "benchmarks" / "chaos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_an_engine_death_while_starting_counts_as_the_restart_that_followed_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    chaos = load_chaos()

    class DiesOnce:
        """An engine whose first start is ended by a signal, as chaos's kill does."""

        index = 0
        started = 0

        async def start(self) -> str:
            self.started += 1
            if self.started == 1:
                raise EngineStartError("the engine process ended by signal 9", returncode=-9)
            return "http://127.0.0.1:1"

        async def stop(self) -> None:
            pass

    pool = EnginePool([DiesOnce()], HealthSettings(enabled=True))  # type: ignore[list-item]
    with caplog.at_level(logging.WARNING):
        asyncio.run(pool.start())
    tolerant = caplog.text
    assert chaos.engine_restarts(tolerant) == 1 and chaos.run_restarts(tolerant) == 0
    without = (
        "RunFault: the engine 0 died while starting (its process (pid 1 on 127.0.0.1) ended "
        "without a word: killed (SIGKILL, the OOM killer) or crashed)\n"
        "[rlpost] restarting from rollout 0 (no checkpoint yet)\n"
    )
    assert chaos.engine_restarts(without) == 0 and chaos.run_restarts(without) == 1
