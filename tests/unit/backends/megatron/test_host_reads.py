"""Host reads of tensor values in a train step do not grow with the model's depth.

On a GPU every read of a tensor's value on the host (`.item()`, `.tolist()`, `int(t)`, `.cpu()`,
...) waits for the device to finish its queued work. What a layer needs about the batch is
worked out once per micro-batch (rlpost.backends.megatron.packed), so a dense model's step
reads the same number of values at any depth (rlpost.backends.host_reads counts every such
call). MoE layers with the all-to-all dispatcher read their routing counts on the host by
design (megatron-core sizes its all-to-all from them): they are counted apart, not flat.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rlpost.backends.host_reads import HostReads
from rlpost.backends.megatron.trainer import MegatronTrainer
from rlpost.schema import ModelConfig

from .conftest import Setup, rollout
from .tiny_checkpoints import ARCHITECTURES


def reads_per_step(trainer: MegatronTrainer) -> tuple[int, dict[str, int], int]:
    """(host reads outside MoE routing, all reads by kind, micro-batches) of one step."""
    trainer.train_step(rollout(8, seed=1))  # the first step builds state (optimizer, caches)
    with HostReads(moe_apart=True) as reads:
        metrics = trainer.train_step(rollout(8, seed=2))
    dense = sum(n for kind, n in reads.counts.items() if kind != "moe")
    return dense, dict(reads.counts), int(metrics["train/micro_batches"])


@pytest.mark.parametrize(
    ("arch", "recompute"),
    [("qwen3", "none"), ("qwen3", "full"), ("glm4_moe", "none"), ("glm4_moe_lite", "none")],
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
