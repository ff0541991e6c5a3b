"""Packed forward passes: several samples in one row, each attending only to itself.

Samples are concatenated into a single row whose position_ids restart at 0 for every sample
(RoPE sees each sample from position 0). Attention stays within a sample in either of two ways:
- the default `rlpost_packed_sdpa` implementation (attention.py) gets the row's sample
  boundaries as `cu_seq_lens_q` and attends sample by sample;
- with transformers' "sdpa" or "eager", transformers (>= 5) reads the position restarts as
  packed-sequence boundaries (`find_packed_sequence_indices` in masking_utils) and builds a
  block-diagonal causal mask, provided no 2D attention mask and no KV cache are passed.
Tests compare packed against one-by-one forwards for all three, so an upstream change cannot
go unnoticed.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import PreTrainedModel

from rlpost.algo.losses import entropy_of_log_probs
from rlpost.backends.torch_trainer.attention import PACKED_SDPA
from rlpost.types import TrainSample


@dataclass(frozen=True)
class PackedBatch:
    """One micro-batch: the packed row plus flat views over its response tokens."""

    input_ids: Tensor  # [1, T]
    position_ids: Tensor  # [1, T]
    logit_positions: Tensor  # [R] row positions whose logits predict response tokens
    targets: Tensor  # [R] the response tokens
    segment_ids: Tensor  # [R] sample index within the micro-batch
    cu_seq_lens: Tensor  # [S + 1] row offsets where samples start, then T
    response_lengths: tuple[int, ...]

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def split(self, flat: Tensor) -> list[Tensor]:
        """Flat response-token values back into one tensor per sample."""
        return list(torch.split(flat, list(self.response_lengths)))


def pack_samples(samples: Sequence[TrainSample]) -> PackedBatch:
    """Concatenate samples into one row; no padding, no truncation."""
    ids: list[int] = []
    positions: list[int] = []
    logit_positions: list[int] = []
    targets: list[int] = []
    segments: list[int] = []
    offset = 0
    for segment, sample in enumerate(samples):
        length, response = len(sample.tokens), sample.response_length
        ids.extend(sample.tokens)
        positions.extend(range(length))
        start = offset + length - response - 1
        logit_positions.extend(range(start, start + response))
        targets.extend(sample.tokens[length - response :])
        segments.extend([segment] * response)
        offset += length
    return PackedBatch(
        input_ids=torch.tensor([ids], dtype=torch.long),
        position_ids=torch.tensor([positions], dtype=torch.long),
        logit_positions=torch.tensor(logit_positions, dtype=torch.long),
        targets=torch.tensor(targets, dtype=torch.long),
        segment_ids=torch.tensor(segments, dtype=torch.long),
        cu_seq_lens=torch.tensor([0, *itertools.accumulate(len(s.tokens) for s in samples)]),
        response_lengths=tuple(s.response_length for s in samples),
    )


@dataclass(frozen=True)
class TokenOutputs:
    """Flat response-token outputs of one forward."""

    logp: Tensor
    entropy: Tensor | None


def forward_tokens(
    model: PreTrainedModel,
    batch: PackedBatch,
    temperature: float,
    entropy: str = "none",
) -> TokenOutputs:
    """Logprobs of the response tokens under `model`, logits divided by `temperature`.

    `entropy` is "none", "detached" (for logging) or "grad" (entropy bonus in the loss).
    """
    boundaries = {}
    if model.config._attn_implementation == PACKED_SDPA:
        boundaries = {"cu_seq_lens_q": batch.cu_seq_lens, "cu_seq_lens_k": batch.cu_seq_lens}
    out = model(
        input_ids=batch.input_ids,
        position_ids=batch.position_ids,
        use_cache=False,
        logits_to_keep=batch.logit_positions,
        **boundaries,
    )
    logits = out.logits[0].float() / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    logp = log_probs.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1)
    if entropy == "none":
        return TokenOutputs(logp, None)
    if entropy == "grad":
        return TokenOutputs(logp, entropy_of_log_probs(log_probs))
    with torch.no_grad():
        return TokenOutputs(logp, entropy_of_log_probs(log_probs.detach()))
