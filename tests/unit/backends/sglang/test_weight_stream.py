"""The trainer side's weight stream holds one bucket of gathered weights at a time."""

from __future__ import annotations

import weakref
from collections.abc import Iterator

import pytest
import torch
from torch import Tensor

from rlpost.backends.fp8 import Fp8Format
from rlpost.backends.sglang import trainer_side

# (name, shape): float32 weights of a small model's sizes, two of them larger than a bucket
SHAPES = [
    ("model.embed_tokens.weight", (64, 32)),
    *((f"model.layers.{i}.self_attn.q_proj.weight", (32, 32)) for i in range(4)),
    *((f"model.layers.{i}.mlp.up_proj.weight", (64, 32)) for i in range(4)),
    ("model.norm.weight", (32,)),
    ("lm_head.weight", (64, 32)),
]
BUCKET_BYTES = 12 << 10


class GatheringTrainer:
    """A trainer whose every bucket is freshly gathered: new tensors each time, as a sharded
    trainer's all-gathers make them. It counts the gathered bytes still alive (referenced
    anywhere) at the moment each bucket has been gathered."""

    def __init__(self) -> None:
        self.alive = 0
        self.peaks: list[int] = []
        self.largest = 0

    def _freed(self, nbytes: int) -> None:
        self.alive -= nbytes

    def iter_hf_weights(self, bucket_bytes: int) -> Iterator[list[tuple[str, Tensor]]]:
        bucket: list[tuple[str, Tensor]] = []
        size = 0
        for i, (name, shape) in enumerate(SHAPES):
            tensor = torch.full(shape, float(i + 1))
            nbytes = tensor.numel() * tensor.element_size()
            self.largest = max(self.largest, nbytes)
            if bucket and size + nbytes > bucket_bytes:
                yield self._gathered(bucket)
                bucket, size = [], 0
            bucket.append((name, tensor))
            size += nbytes
            del tensor
        yield self._gathered(bucket)

    def _gathered(self, bucket: list[tuple[str, Tensor]]) -> list[tuple[str, Tensor]]:
        for _, tensor in bucket:
            nbytes = tensor.numel() * tensor.element_size()
            self.alive += nbytes
            weakref.finalize(tensor, self._freed, nbytes)
        self.peaks.append(self.alive)
        return bucket


@pytest.mark.parametrize("fp8", [None, Fp8Format()], ids=["bf16-or-fp32", "fp8"])
def test_each_step_drops_the_previous_bucket_before_the_next_is_gathered(
    fp8: Fp8Format | None,
) -> None:
    trainer = GatheringTrainer()
    trainer_side.open_weight_stream(trainer, BUCKET_BYTES, fp8)
    names: list[str] = []
    try:
        while (infos := trainer_side.next_weight_bucket(trainer)) is not None:
            names += [w.name for w in infos]
            # what an update group's broadcast or an IPC payload reads
            assert [n for n, _ in trainer_side._current_bucket()] == [w.name for w in infos]
    finally:
        trainer_side.close_weight_stream(trainer)
    weights = [n for n in names if not n.endswith("_scale_inv")]
    assert weights == [n for n, _ in SHAPES]  # every weight once, in order
    if fp8 is not None:
        assert any(n.endswith("_scale_inv") for n in names)
    assert len(trainer.peaks) > 3
    # the bucket just gathered, and nothing of the ones before it
    assert max(trainer.peaks) <= max(BUCKET_BYTES, trainer.largest), trainer.peaks
    assert trainer.alive == 0  # the stream keeps nothing once it is done


def test_the_stream_ends_with_none_and_has_no_current_bucket_after() -> None:
    trainer = GatheringTrainer()
    trainer_side.open_weight_stream(trainer, 1 << 30)
    assert trainer_side.next_weight_bucket(trainer) is not None  # all in one bucket
    assert trainer_side.next_weight_bucket(trainer) is None
    with pytest.raises(RuntimeError, match="no weight bucket is open"):
        trainer_side._current_bucket()
