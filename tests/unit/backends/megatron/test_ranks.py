"""How the megatron tests start their ranks: forked on CPU; spawned once the pytest process
has initialised CUDA (a forked child cannot use it), which the gpu tests need when an earlier
test in the same worker touched the GPU."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .conftest import Setup, run_world, start_method


def describe(rank: int, world: int, port: int, setup: Setup, tag: str) -> dict[str, Any]:
    return {"rank": rank, "world": world, "port": port, "model": setup.model.name, "tag": tag}


def test_ranks_fork_while_this_process_has_not_initialised_cuda() -> None:
    assert not torch.cuda.is_initialized()  # these CPU tests never initialise it
    assert start_method() == "fork"


def test_a_spawned_rank_gets_a_test_modules_function_and_a_setup(
    make_setup: Callable[..., Setup],
) -> None:
    setup = make_setup("qwen3")
    # what the gpu tests send their spawned ranks: a function of a test module, a Setup
    [spawned] = run_world(describe, 1, setup, "sent", method="spawn")
    assert spawned["rank"] == 0 and spawned["world"] == 1 and spawned["port"] > 0
    assert (spawned["model"], spawned["tag"]) == (setup.model.name, "sent")
