"""Packed forward passes: several samples in one row, each attending only to itself.

Samples are concatenated into a single row; every token keeps its position within its own
sample (RoPE sees each sample from position 0). Attention stays within a sample in either of
two ways:
- the default `rlpost_packed_sdpa` implementation (attention.py) gets each sample's row
  positions (`SampleRows`) and attends sample by sample;
- with transformers' "sdpa" or "eager", transformers (>= 5) reads the position restarts as
  packed-sequence boundaries (`find_packed_sequence_indices` in masking_utils) and builds a
  block-diagonal causal mask, provided no 2D attention mask and no KV cache are passed.

With `share_prompts` (the default implementation only), samples with the same prompt (a
GRPO group: n samples of one prompt) share one copy of it in the row: the prompt's tokens
are computed once, and each response attends to that copy as if it were its own. Causal
attention makes the prompt's hidden states the same in every sample, so the logprobs are the
same; the tokens the layers run over drop from n x (prompt + response) to prompt + n x
response per group. Tests compare packed, shared and one-by-one forwards, so an upstream
change cannot go unnoticed.

Logprobs come from the final hidden states through the chunked log-prob kernel shared with
the megatron backend (rlpost.backends.logprobs), so the logits are never whole; a model whose
logits are more than its output layer's (a bias, softcapping, a scale) goes through its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from rlpost.algo.losses import entropy_of_log_probs
from rlpost.algo.steps import prompt_of
from rlpost.backends.logprobs import linear_logprobs
from rlpost.backends.torch_trainer.attention import PACKED_SDPA, ROWS_KWARG, SampleRows
from rlpost.types import TrainSample


@dataclass(frozen=True)
class PackedBatch:
    """One micro-batch: the packed row plus flat views over its response tokens."""

    input_ids: Tensor  # [1, T]
    position_ids: Tensor  # [1, T]
    logit_positions: Tensor  # [R] row positions whose logits predict response tokens
    targets: Tensor  # [R] the response tokens
    segment_ids: Tensor  # [R] sample index within the micro-batch
    rows: SampleRows  # each sample's row positions, for the packed attention
    response_lengths: tuple[int, ...]
    shared: bool  # prompts appear once per distinct prompt (only rlpost_packed_sdpa reads that)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def split(self, flat: Tensor) -> list[Tensor]:
        """Flat response-token values back into one tensor per sample."""
        return list(torch.split(flat, list(self.response_lengths)))

    def to(self, device: torch.device) -> PackedBatch:
        """The same micro-batch with its tensors on `device` (the model's)."""
        if self.input_ids.device == device:
            return self
        return dataclasses.replace(
            self,
            input_ids=self.input_ids.to(device),
            position_ids=self.position_ids.to(device),
            logit_positions=self.logit_positions.to(device),
            targets=self.targets.to(device),
            segment_ids=self.segment_ids.to(device),
            rows=self.rows.to(device),
        )


def pack_samples(samples: Sequence[TrainSample], share_prompts: bool = False) -> PackedBatch:
    """Concatenate samples into one row, no padding, no truncation; with `share_prompts`, a
    prompt already in the row is not repeated (the sample's rows point at the first copy)."""
    ids: list[int] = []
    positions: list[int] = []
    owners: list[tuple[int, int]] = []  # per row position: (sample, offset) that computes it
    sample_rows: list[list[int]] = []
    logit_positions: list[int] = []
    targets: list[int] = []
    segments: list[int] = []
    seen: dict[tuple[int, ...], list[int]] = {}
    for segment, sample in enumerate(samples):
        length, response = len(sample.tokens), sample.response_length
        prompt = prompt_of(sample)
        prompt_rows = seen.get(prompt) if share_prompts else None
        if prompt_rows is None:
            prompt_rows = list(range(len(ids), len(ids) + len(prompt)))
            ids.extend(prompt)
            positions.extend(range(len(prompt)))
            owners.extend((segment, offset) for offset in range(len(prompt)))
            seen[prompt] = prompt_rows
        rows = prompt_rows + list(range(len(ids), len(ids) + response))
        ids.extend(sample.tokens[len(prompt) :])
        positions.extend(range(len(prompt), length))
        owners.extend((segment, offset) for offset in range(len(prompt), length))
        sample_rows.append(rows)
        logit_positions.extend(rows[len(prompt) - 1 : length - 1])
        targets.extend(sample.tokens[len(prompt) :])
        segments.extend([segment] * response)
    return PackedBatch(
        input_ids=torch.tensor([ids], dtype=torch.long),
        position_ids=torch.tensor([positions], dtype=torch.long),
        logit_positions=torch.tensor(logit_positions, dtype=torch.long),
        targets=torch.tensor(targets, dtype=torch.long),
        segment_ids=torch.tensor(segments, dtype=torch.long),
        rows=SampleRows.of(sample_rows, owners),
        response_lengths=tuple(s.response_length for s in samples),
        shared=share_prompts and len(ids) < sum(len(s.tokens) for s in samples),
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
        boundaries = {ROWS_KWARG: batch.rows}
    elif batch.shared:
        raise ValueError(
            f"a row with shared prompts needs the {PACKED_SDPA!r} attention; "
            f"{model.config._attn_implementation!r} would not let a response see its prompt"
        )
    head = plain_output_weight(model)
    if head is not None:  # the output layer inside the chunked log-prob kernel
        hidden = model.base_model(
            input_ids=batch.input_ids,
            position_ids=batch.position_ids,
            use_cache=False,
            **boundaries,
        ).last_hidden_state[0, batch.logit_positions]
        out = linear_logprobs(hidden, head, batch.targets, head.shape[0], temperature, entropy)
        return TokenOutputs(out.logp, out.entropy)
    logits = (
        model(
            input_ids=batch.input_ids,
            position_ids=batch.position_ids,
            use_cache=False,
            logits_to_keep=batch.logit_positions,
            **boundaries,
        )
        .logits[0]
        .float()
        / temperature
    )
    log_probs = torch.log_softmax(logits, dim=-1)
    logp = log_probs.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1)
    if entropy == "none":
        return TokenOutputs(logp, None)
    if entropy == "grad":
        return TokenOutputs(logp, entropy_of_log_probs(log_probs))
    with torch.no_grad():
        return TokenOutputs(logp, entropy_of_log_probs(log_probs.detach()))


class TokenForward(nn.Module):
    """An HF causal LM behind one call, `forward_tokens`, so that FSDP2's root hooks (which
    gather what no decoder layer holds: the embeddings, the final norm, the output layer) run
    around the whole of it, the output layer inside the chunked log-prob kernel included."""

    def __init__(self, lm: PreTrainedModel) -> None:
        super().__init__()
        self.lm = lm

    def forward(
        self, batch: PackedBatch, temperature: float, entropy: str = "none"
    ) -> tuple[Tensor, Tensor | None]:
        # a tuple, not TokenOutputs: FSDP2 finds the tensors of a forward's output to hook
        # its backward onto, and it does not look inside dataclasses
        out = forward_tokens(self.lm, batch, temperature, entropy)
        return out.logp, out.entropy


FILLER = TrainSample(tokens=[0, 0], response_length=1, reward=0.0)
"""The sample of a micro-batch that evens out the ranks' counts: its forward (and, in
training, its backward with a zero loss) joins the collectives and changes nothing."""


LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale")
"""Config fields with which an HF model changes its logits after the output layer."""


def plain_output_weight(model: PreTrainedModel) -> Tensor | None:
    """The output layer's weight when the model's logits are exactly hidden @ weight.T (no
    bias, no softcapping or scaling afterwards); None sends the forward through the model's
    own logits."""
    head = model.get_output_embeddings()  # type: ignore[no-untyped-call]
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        return None
    if any(getattr(model.config, name, None) not in (None, 1.0) for name in LOGIT_TRANSFORMS):
        return None
    return head.weight
