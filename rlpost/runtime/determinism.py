"""Deterministic mode: fixed seeds everywhere, so a resumed run repeats an uninterrupted one.

Engines sample each request from its own generator seeded with `sampling_seed`; here that
seed is derived from (run seed, stream, rollout id, sample index), so a sample draws the same
tokens whichever engine serves it, in whatever order requests arrive, and after a resume.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

from rlpost.runtime.rollout.manager import GenerateHook, GenerationClient
from rlpost.types import Sample

SEED_BITS = 62


def sampling_seed(run_seed: int, stream: str, rollout_id: int, sample_index: int) -> int:
    """A stable 62-bit seed; independent of Python's hash randomisation."""
    key = f"{run_seed}/{stream}/{rollout_id}/{sample_index}".encode()
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "little") >> (64 - SEED_BITS)


class SeededGenerate:
    """Wraps a generate function; every request carries its sample's derived seed.

    Set the stream ("train" or "eval") and rollout id with `at` before each generation.
    """

    def __init__(self, inner: GenerateHook, run_seed: int) -> None:
        self.inner = inner
        self.run_seed = run_seed
        self.stream = "train"
        self.rollout_id = 0

    def at(self, stream: str, rollout_id: int) -> SeededGenerate:
        self.stream, self.rollout_id = stream, rollout_id
        return self

    async def __call__(
        self, sample: Sample, params: dict[str, Any], client: GenerationClient
    ) -> Sample:
        seed = sampling_seed(self.run_seed, self.stream, self.rollout_id, sample.index)
        return await self.inner(sample, {**params, "sampling_seed": seed}, client)


def seed_driver(seed: int) -> None:
    """Seed this process and make torch pick deterministic kernels."""
    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
