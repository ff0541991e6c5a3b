"""What a generate function gets besides its sample: the GenerateContext.

A generate function (`recipe.rollout.generate_function`, `async def fn(sample, ctx)`) fills
the sample's response and returns the sample the loop trains on. The context carries the
group's generation client, the tokenizer, the sampling parameters, whether this is an
evaluation, `max_turns`, the recipe's `generate_settings`, and two helpers that keep the
per-token lists of a multi-turn response consistent:

- `await ctx.policy_turn(sample)`: the policy continues the response (one /generate call
  through the router); its tokens are trained (loss mask 1) and carry their logprobs and
  policy version. A turn a weight update interrupted continues where it stopped when called
  again.
- `ctx.environment_turn(sample, content, role="tool")`: what a tool or environment answers,
  rendered with the chat template's `role` turn and the generation prompt that hands the
  word back to the model; its tokens are context, never trained (loss mask 0).

The whole response, every turn included, stays within `max_response_len`: a turn that would
not fit is cut at the budget and the sample is TRUNCATED.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rlpost.runtime.rollout.client import EngineAbortError
from rlpost.types import Sample, SampleStatus

PROBE_USER, PROBE_ASSISTANT = "\x00user\x00", "\x00assistant\x00"
TAIL_TOKENS = 8  # enough of a turn's end to see which of the template's closing it wrote


def version_number(reported: str | None) -> int:
    """An engine's weight version as a policy version: 'default' (never updated) is 0."""
    if reported is None or reported == "default":
        return 0
    return int(reported)


FINISH_STATUS = {
    "stop": SampleStatus.COMPLETED,
    "length": SampleStatus.TRUNCATED,
    "abort": SampleStatus.ABORTED,
}


def special_token_text(tokenizer: Any, token_id: int) -> str | None:
    """The text of `token_id` when the tokenizer marks it special (an eos, an end-of-turn
    token, any added token flagged special), else None."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    token = added.get(token_id)
    if token is not None and getattr(token, "special", False):
        return str(token.content)
    if token_id in (getattr(tokenizer, "all_special_ids", None) or ()):
        return str(tokenizer.convert_ids_to_tokens(token_id))
    return None


class Seeder(Protocol):
    """Deterministic mode's per-request seed (rlpost.runtime.determinism.Seeding)."""

    def seed_for(self, sample: Sample) -> int: ...


class TemplateError(ValueError):
    """The chat template cannot render an environment turn after a policy turn."""


@dataclass(frozen=True)
class Turn:
    """One policy turn: its whole text (a continued turn included) and how it ended."""

    text: str
    status: SampleStatus


@dataclass
class GenerateContext:
    """See the module docstring. `sampling_params` are SGLang's; their `max_new_tokens` is
    the response budget of the whole sample (`max_response_len`)."""

    client: Any
    tokenizer: Any
    sampling_params: Mapping[str, Any]
    evaluation: bool = False
    max_turns: int = 1
    settings: Mapping[str, Any] = field(default_factory=dict)
    seeder: Seeder | None = None

    @property
    def max_response_len(self) -> int:
        return int(self.sampling_params["max_new_tokens"])

    def remaining(self, sample: Sample) -> int:
        """Response tokens the sample may still add."""
        return self.max_response_len - len(sample.response_ids)

    def params_for(self, sample: Sample, **overrides: Any) -> dict[str, Any]:
        """Sampling parameters for the sample's next request: `max_new_tokens` capped by the
        remaining budget, the per-request seed in deterministic mode, then `overrides`."""
        params = {**self.sampling_params, "max_new_tokens": self.remaining(sample)}
        if self.seeder is not None:
            params["sampling_seed"] = self.seeder.seed_for(sample)
        params.update(overrides)
        params["max_new_tokens"] = min(int(params["max_new_tokens"]), self.remaining(sample))
        return params

    async def policy_turn(self, sample: Sample, **overrides: Any) -> Turn:
        """The policy continues the response until a stop, the budget, or an interruption.

        Sets the sample's status from how the turn ended: COMPLETED (a stop), TRUNCATED (the
        response budget), ABORTED (a weight update or the group being stopped; call again to
        continue the same turn). `sample.turns` counts the policy turns that ended.
        """
        if self._begin_turn(sample):
            await self._generate([sample], self.params_for(sample, **overrides))
        return self._turn(sample)

    async def policy_turns(self, samples: Sequence[Sample]) -> list[Turn]:
        """`policy_turn` for each of `samples`, those with the same sampling parameters in
        one request (SGLang's batch form); the group's samples when none was interrupted."""
        together: dict[str, tuple[dict[str, Any], list[Sample]]] = {}
        for sample in samples:
            if self._begin_turn(sample):
                params = self.params_for(sample)
                key = json.dumps(params, sort_keys=True)
                together.setdefault(key, (params, []))[1].append(sample)
        await asyncio.gather(
            *(self._generate(group, params) for params, group in together.values())
        )
        return [self._turn(s) for s in samples]

    async def _generate(self, samples: list[Sample], params: dict[str, Any]) -> None:
        """Continue `samples` under `params`: one request, batched when there are several."""
        prompts = [s.prompt_ids + s.response_ids for s in samples]
        try:
            if len(samples) == 1:
                results = [await self.client.generate(prompts[0], params)]
            else:
                results = await self.client.generate_batch(prompts, params)
        except EngineAbortError as exc:  # named by the samples it aborted
            exc.samples = [samples[position].index for position, _, _ in exc.aborted]
            raise
        for sample, result in zip(samples, results, strict=True):
            self._end_turn(sample, result)

    def _begin_turn(self, sample: Sample) -> bool:
        """Mark where a new turn starts; False (and TRUNCATED) when no budget is left."""
        if sample.status is not SampleStatus.ABORTED:  # a new turn (not a continued one)
            sample.turn_start = len(sample.response_text)
        if self.remaining(sample) <= 0:
            sample.status = SampleStatus.TRUNCATED
            return False
        return True

    def _end_turn(self, sample: Sample, result: Any) -> None:
        sample.append_policy_tokens(
            list(result.output_ids),
            list(result.output_logprobs),
            result.text,
            version_number(result.weight_version),
        )
        sample.weight_version = result.weight_version
        sample.status = FINISH_STATUS[str(result.finish_reason)]
        sample.end_text = ""
        if sample.status is SampleStatus.COMPLETED and result.output_ids:
            end = special_token_text(self.tokenizer, int(result.output_ids[-1]))
            if end and sample.response_text.endswith(end):
                sample.end_text = end
        if sample.status is not SampleStatus.ABORTED:
            sample.turns += 1

    def environment_turn(self, sample: Sample, content: str, role: str = "tool") -> bool:
        """Append what the environment answers (masked), rendered with the chat template,
        and hand the word back to the policy (status PENDING). False when it did not fit in
        the response budget: then as much as fits is appended and the sample is TRUNCATED."""
        # the policy's last tokens as written, special tokens included (response_text may
        # leave them out: skip_special_tokens)
        tail = self.tokenizer.decode(sample.response_ids[-TAIL_TOKENS:], skip_special_tokens=False)
        text = render_environment_turn(self.tokenizer, tail, content, role)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        room = self.remaining(sample)
        if len(ids) >= room:  # no room left for the policy to answer: the sample ends here
            kept = ids[: max(room, 0)]
            sample.append_inserted_tokens(kept, self.tokenizer.decode(kept))
            sample.status = SampleStatus.TRUNCATED
            return False
        sample.append_inserted_tokens(ids, text)
        sample.status = SampleStatus.PENDING
        return True

    def _turn(self, sample: Sample) -> Turn:
        return Turn(text=sample.response_text[sample.turn_start :], status=sample.status)


def render_environment_turn(tokenizer: Any, policy_text: str, content: str, role: str) -> str:
    """The text between the end of a policy turn and the policy's next turn: the rest of the
    assistant turn's closing (what the policy did not write itself, e.g. the newline after
    its end-of-turn token), the `role` message, and the generation prompt.

    Found by rendering a probe conversation with the tokenizer's own chat template, with and
    without the environment message, so any template (ChatML, Llama, GLM) renders its own
    tool turn.
    """
    base = [
        {"role": "user", "content": PROBE_USER},
        {"role": "assistant", "content": PROBE_ASSISTANT},
    ]
    closed: str = tokenizer.apply_chat_template(base, tokenize=False)
    extended: str = tokenizer.apply_chat_template(
        [*base, {"role": role, "content": content}], tokenize=False, add_generation_prompt=True
    )
    if not extended.startswith(closed) or PROBE_ASSISTANT not in closed:
        raise TemplateError(
            f"the chat template renders a conversation differently once a '{role}' message "
            "follows the assistant's turn, so an environment turn cannot be appended to a "
            "response; use a template that renders earlier turns unchanged (or render the "
            "turn yourself and use Sample.append_inserted_tokens)"
        )
    closing = closed[closed.rindex(PROBE_ASSISTANT) + len(PROBE_ASSISTANT) :]
    written = _overlap(policy_text, closing)
    return closing[written:] + extended[len(closed) :]


def _overlap(text: str, closing: str) -> int:
    """How much of `closing` the policy already wrote at the end of `text` (its stop
    token, say)."""
    for size in range(len(closing), 0, -1):
        if text.endswith(closing[:size]):
            return size
    return 0


@dataclass(frozen=True)
class ContextFactory:
    """What every context of one runner shares (the train runner, the eval runner)."""

    tokenizer: Any = None
    evaluation: bool = False
    max_turns: int = 1
    settings: Mapping[str, Any] = field(default_factory=dict)
    seeder: Seeder | None = None

    def context(self, client: Any, sampling_params: Mapping[str, Any]) -> GenerateContext:
        return GenerateContext(
            client=client,
            tokenizer=self.tokenizer,
            sampling_params=sampling_params,
            evaluation=self.evaluation,
            max_turns=self.max_turns,
            settings=self.settings,
            seeder=self.seeder,
        )
