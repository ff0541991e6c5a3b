"""Host reads of tensor values in a train step do not grow with the model's depth.

On a GPU every read of a tensor's value on the host (`.item()`, `.tolist()`, `int(t)`, `.cpu()`,
...) waits for the device to finish its queued work. What a layer needs about the batch is
worked out once per micro-batch (rlpost.backends.megatron.packed), so a dense model's step
reads the same number of values at any depth. A TorchFunctionMode sees every such call, on CPU
tensors too (a TorchDispatchMode misses `.tolist()` and `.cpu()` there). MoE layers with the
all-to-all dispatcher read their routing counts on the host by design (megatron-core sizes its
all-to-all from them): they are counted apart, not held flat.
"""

from __future__ import annotations

import os
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from rlpost.backends.megatron.trainer import MegatronTrainer
from rlpost.schema import ModelConfig

from .conftest import Setup, rollout
from .tiny_checkpoints import ARCHITECTURES

T = torch.Tensor
READS = {T.item, T.tolist, T.cpu, T.numpy, T.__int__, T.__float__, T.__bool__, T.__index__}


def _to_host(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    device = kwargs.get("device")
    for a in args[1:]:
        if isinstance(a, str | torch.device):
            device = a
    return device is not None and torch.device(device).type == "cpu"


MOE_DISPATCH = f"megatron{os.sep}core{os.sep}transformer{os.sep}moe{os.sep}"


class HostReads(TorchFunctionMode):
    """Counts host reads by kind; those made inside megatron-core's MoE code under "moe"."""

    def __init__(self) -> None:
        super().__init__()
        self.count: Counter[str] = Counter()

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func in READS or (func is T.to and _to_host(args, kwargs)):
            frames = traceback.extract_stack(limit=12)
            moe = any(MOE_DISPATCH in frame.filename for frame in frames)
            self.count["moe" if moe else getattr(func, "__name__", str(func))] += 1
        return func(*args, **kwargs)


def reads_per_step(trainer: MegatronTrainer) -> tuple[int, dict[str, int], int]:
    """(host reads outside MoE routing, all reads by kind, micro-batches) of one step."""
    trainer.train_step(rollout(8, seed=1))  # the first step builds state (optimizer, caches)
    with HostReads() as reads:
        metrics = trainer.train_step(rollout(8, seed=2))
    dense = sum(n for kind, n in reads.count.items() if kind != "moe")
    return dense, dict(reads.count), int(metrics["train/micro_batches"])


@pytest.mark.parametrize(
    ("arch", "recompute"), [("qwen3", "none"), ("qwen3", "full"), ("glm4_moe", "none")]
)
def test_host_reads_per_step_do_not_grow_with_depth(
    make_setup: Callable[..., Setup], tmp_path: Path, arch: str, recompute: str
) -> None:
    """Flat for dense layers; an MoE model's reads outside its routing are flat too, and its
    routing reads (megatron-core sizes the all-to-all from the token counts) grow per layer."""
    counts = {}
    for layers in (2, 6):
        model: ModelConfig = ARCHITECTURES[arch](tmp_path / f"l{layers}", layers=layers)
        setup = make_setup(model, recompute=recompute)
        counts[layers] = setup.run(reads_per_step)
    (two, kinds2, mbs), (six, kinds6, _) = counts[2], counts[6]
    assert mbs > 1, "the step must run several micro-batches"
    assert two == six, f"2 layers: {two} {kinds2}; 6 layers: {six} {kinds6}"
    assert two < 16 * mbs, (two, kinds2)  # a handful per micro-batch, none per layer
    if arch == "glm4_moe":  # layer 1 is dense: 1 MoE layer against 5
        assert kinds6["moe"] > kinds2["moe"] > 0, (kinds2, kinds6)
