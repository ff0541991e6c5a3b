"""Data that crosses layers: prompts, samples and what the trainer consumes."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

Prompt = str | list[dict[str, Any]]


class SampleStatus(StrEnum):
    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"


UNVERSIONED = -1  # tokens no policy wrote (tool or environment output)


@dataclass
class Sample:
    """One response to one prompt, filled in as it moves through rollout.

    Mutable on purpose: generation, reward and filtering each fill their own fields on a
    sample owned by one rollout; nothing else holds a reference to it.

    Per response token, four lists of the same length: `response_ids`, `rollout_logprobs`
    (the sampling policy's logprob; 0.0 for tokens it did not sample), `loss_mask` (1 for
    tokens the policy generated, 0 for tokens a tool or environment inserted) and
    `token_versions` (the policy version that generated the token; UNVERSIONED for inserted
    tokens). `resumed_at` is where the current generation began: earlier tokens were carried
    over from an earlier rollout (partial rollout). `turns` counts the policy turns that
    ended (multi-turn generate functions); `turn_start` is where the current or last policy
    turn began in `response_text`.
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
    loss_mask: list[int] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)
    resumed_at: int = 0
    turns: int = 0
    turn_start: int = 0
    # `metadata` as it was when generation began (before a generate function kept its
    # episode's state there): what the sample's prompt says, which `fresh()` starts from
    prompt_metadata: dict[str, Any] | None = None
    status: SampleStatus = SampleStatus.PENDING
    reward: float | None = None
    # what the scorer's dict held beside the reward (its "score"; a reward server's
    # "reward"), by key: numbers (finite, else None), strings, JSON values, others as str();
    # None where the reward came alone (rlpost.rewards.scored.reward_extra)
    reward_extra: dict[str, Any] | None = None
    weight_version: str | None = None
    # the special token's text that ended the response (its eos or end-of-turn token, as
    # the engine wrote it into response_text), which the rule-based graders leave out
    end_text: str = ""

    @property
    def answer_text(self) -> str:
        """`response_text` without the special token that ended it: what rule-based graders
        read (`42<|im_end|>` is not the answer 42 to a token F1 or a DAPO answer)."""
        end = self.end_text
        if end and self.response_text.endswith(end):
            return self.response_text[: -len(end)]
        return self.response_text

    @property
    def total_length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def finished(self) -> bool:
        return self.status in (SampleStatus.COMPLETED, SampleStatus.TRUNCATED)

    def append_policy_tokens(
        self, token_ids: list[int], logprobs: list[float], text: str, version: int
    ) -> None:
        """Tokens the policy sampled (trained), with their logprobs and policy version."""
        if len(logprobs) != len(token_ids):
            raise ValueError(
                f"{len(token_ids)} generated tokens came with {len(logprobs)} logprobs"
            )
        self.response_ids += token_ids
        self.rollout_logprobs += logprobs
        self.loss_mask += [1] * len(token_ids)
        self.token_versions += [version] * len(token_ids)
        self.response_text += text

    def append_inserted_tokens(self, token_ids: list[int], text: str) -> None:
        """Tokens a tool or environment inserted: part of the context, never trained."""
        self.response_ids += token_ids
        self.rollout_logprobs += [0.0] * len(token_ids)
        self.loss_mask += [0] * len(token_ids)
        self.token_versions += [UNVERSIONED] * len(token_ids)
        self.response_text += text
        self.end_text = ""

    def policy_versions(self, since: int = 0) -> list[int]:
        """Versions of the policy tokens from response position `since` on."""
        return [
            v
            for v, m in zip(self.token_versions[since:], self.loss_mask[since:], strict=True)
            if m and v != UNVERSIONED
        ]

    def begin_generation(self) -> None:
        """Keep the prompt's metadata before a generate function first sees the sample, so
        generating it again starts from the prompt, not from a discarded episode's state."""
        if self.prompt_metadata is None:
            self.prompt_metadata = copy.deepcopy(self.metadata)

    def fresh(self) -> Sample:
        """The same prompt with nothing generated (to generate again): its metadata as the
        prompt had it, without what an earlier generation wrote there."""
        kept = self.prompt_metadata
        metadata = dict(self.metadata) if kept is None else copy.deepcopy(kept)
        return Sample(
            group_index=self.group_index,
            index=self.index,
            prompt=self.prompt,
            prompt_ids=list(self.prompt_ids),
            label=self.label,
            metadata=metadata,
        )


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
