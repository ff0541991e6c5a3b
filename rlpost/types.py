"""Data that crosses layers: prompts, samples and what the trainer consumes."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

Prompt = str | list[dict[str, Any]]


class SampleStatus(str, Enum):
    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"


@dataclass
class Sample:
    """One response to one prompt, filled in as it moves through rollout.

    Mutable on purpose: generation, reward and filtering each fill their own fields on a
    sample owned by one rollout; nothing else holds a reference to it.
    """

    group_index: int
    index: int
    prompt: Prompt
    prompt_ids: list[int]
    label: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    response_ids: list[int] = field(default_factory=list)
    response_text: str = ""
    rollout_logprobs: list[float] = field(default_factory=list)
    status: SampleStatus = SampleStatus.PENDING
    reward: float | None = None
    weight_version: str | None = None

    @property
    def total_length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass(frozen=True)
class TrainSample:
    """What a trainer needs of a sample: tokens, where the response starts, its signal."""

    tokens: list[int]
    response_length: int
    reward: float
    rollout_logprobs: list[float] | None = None
    loss_mask: list[int] | None = None

    @property
    def length(self) -> int:
        return len(self.tokens)
