"""Deterministic mode: fixed seeds everywhere, so a resumed run repeats an uninterrupted one.

Engines sample each request from its own generator seeded with `sampling_seed`; here that
seed is derived from (run seed, stream, round, sample index, tokens already generated), so a
sample draws the same tokens whichever engine serves it, in whatever order requests arrive,
and after a resume. Sample indices are unique over a run (epoch and position in the data),
so the train stream needs no round; evaluation repeats its prompts and counts rounds.
"""

from __future__ import annotations

import hashlib
import random

from rlpost.types import Sample

SEED_BITS = 62


def sampling_seed(
    run_seed: int, stream: str, round_id: int, sample_index: int, generated: int = 0
) -> int:
    """A stable 62-bit seed; independent of Python's hash randomisation."""
    key = f"{run_seed}/{stream}/{round_id}/{sample_index}/{generated}".encode()
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "little") >> (64 - SEED_BITS)


class Seeding:
    """Every request carries its sample's derived seed (a sample continued after an
    interruption, or in a later turn, gets a seed of its own for the rest). The generate
    context asks it for each request (GenerateContext.params_for)."""

    def __init__(self, run_seed: int, stream: str = "train") -> None:
        self.run_seed = run_seed
        self.stream = stream
        self.round = 0

    def at(self, round_id: int) -> Seeding:
        self.round = round_id
        return self

    def seed_for(self, sample: Sample) -> int:
        return sampling_seed(
            self.run_seed, self.stream, self.round, sample.index, len(sample.response_ids)
        )


def seed_driver(seed: int) -> None:
    """Seed this process and make torch pick deterministic kernels."""
    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)


CUBLAS_WORKSPACE = ":4096:8"
"""cuBLAS's fixed workspace configuration, without which torch refuses every cuBLAS call once
deterministic kernels are on ("...uses CuBLAS and you have CUDA >= 10.2")."""


def deterministic_env(deterministic: bool, on_gpu: bool) -> dict[str, str]:
    """What a train rank's environment needs before CUDA starts in it, for the deterministic
    kernels `run.deterministic` switches on (torch.use_deterministic_algorithms)."""
    return {"CUBLAS_WORKSPACE_CONFIG": CUBLAS_WORKSPACE} if deterministic and on_gpu else {}
