"""The batched decoding loop: left-padded prefill, a KV cache, per-row stops and aborts.

One call decodes until every row has finished. Finished rows leave the batch (and the KV
cache) at once, and, when an `admit` callback is given, waiting rows join between steps,
so the batch stays full while requests keep arriving.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from rlpost.backends.cpu_engine.batch import ActiveBatch, left_pad
from rlpost.backends.cpu_engine.row import FinishReason, Row
from rlpost.backends.cpu_engine.sampling import (
    BatchSampler,
    SamplingParams,
    apply_logit_adjustments,
)

StepHook = Callable[[], None]
Admit = Callable[[int], list[Row]]  # rows running now -> rows to add
Decoder = Callable[[Sequence[int], bool], str]

__all__ = ["BatchGenerator", "FinishReason", "Row"]


class BatchGenerator:
    """Decodes batches with a transformers causal LM; one instance per engine."""

    def __init__(
        self,
        model: PreTrainedModel,
        eos_ids: Sequence[int],
        decode: Decoder,
        share_prefill: bool = True,
    ) -> None:
        """`share_prefill`: rows with the same prompt are prefilled once (see `_start`)."""
        self.model = model
        self.share_prefill = share_prefill
        self.eos_ids = frozenset(eos_ids)
        self.decode = decode
        self.weight_version = "default"
        # transformers 5 renames forward's `past_key_values` to `cache` (the old name warns
        # and is to go): use whichever this model's forward takes
        parameters = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in parameters else "past_key_values"

    @torch.inference_mode()
    def run(
        self,
        rows: Sequence[Row],
        between_steps: StepHook | None = None,
        admit: Admit | None = None,
    ) -> None:
        """Generate until every row, including admitted ones, has finished.

        `between_steps` runs after each sampling step (pause points); `admit` is asked for
        newcomers at each step once the batch supports merging."""
        batch = self._start(rows)
        while True:
            if between_steps is not None:
                between_steps()
            if batch is not None:
                self._finish_aborted(batch.rows)
                batch.keep([i for i, r in enumerate(batch.rows) if r.finish is None])
                if not batch.rows:
                    batch = None
            if admit is not None and (batch is None or batch.can_merge):
                batch = self._admit(batch, admit)
            if batch is None:
                return
            self._decode_step(batch)

    def _admit(self, batch: ActiveBatch | None, admit: Admit) -> ActiveBatch | None:
        newcomers = admit(0 if batch is None else len(batch.rows))
        if not newcomers:
            return batch
        joined = self._start(newcomers)
        if joined is not None:  # finished on their first token: no decode step for them
            joined.keep([i for i, r in enumerate(joined.rows) if r.finish is None])
            joined = joined if joined.rows else None
        if batch is None or joined is None:
            return batch or joined
        if not joined.can_merge:  # cannot happen when batch merges; keep the types honest
            raise RuntimeError("a KV cache of this model cannot be merged")
        batch.merge(joined)
        return batch

    def _start(self, rows: Sequence[Row]) -> ActiveBatch | None:
        """Prefill `rows` and sample their first tokens; None when none needs decoding.

        Rows with the same prompt (a group's samples, sent together) are prefilled once and
        their KV cache copied to each of them, as SGLang's prefix cache would share it."""
        live = [r for r in rows if not self._finished_before_start(r)]
        if not live:
            return None
        cache = DynamicCache(config=self.model.config)
        prompts: dict[tuple[int, ...], int] = {}
        copies = [prompts.setdefault(tuple(r.prompt_ids), len(prompts)) for r in live]
        shared = (
            self.share_prefill
            and len(prompts) < len(live)
            and all(type(layer) is DynamicLayer for layer in cache.layers)
        )
        input_ids, attention_mask = left_pad(
            list(prompts) if shared else [r.prompt_ids for r in live]
        )
        position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
        logits = self._forward(input_ids, attention_mask, position_ids, cache)
        if shared:
            index = torch.tensor(copies, dtype=torch.long)
            cache.batch_select_indices(index)
            attention_mask, position_ids, logits = (
                attention_mask[index],
                position_ids[index],
                logits[index],
            )
        sampler = BatchSampler([r.params for r in live], [r.generator for r in live])
        tokens = self._sample(live, sampler, logits)
        return ActiveBatch(live, cache, attention_mask, position_ids[:, -1], tokens, sampler)

    def _decode_step(self, batch: ActiveBatch) -> None:
        ones = batch.attention_mask.new_ones(len(batch.rows), 1)
        batch.attention_mask = torch.cat([batch.attention_mask, ones], dim=1)
        batch.next_position = batch.next_position + 1
        logits = self._forward(
            batch.tokens.unsqueeze(1),
            batch.attention_mask,
            batch.next_position.unsqueeze(1),
            batch.cache,
        )
        batch.tokens = self._sample(batch.rows, batch.sampler, logits)

    def _forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: DynamicCache,
    ) -> torch.Tensor:
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            **{self._cache_arg: cache},
            logits_to_keep=1,
        )
        logits: torch.Tensor = out.logits[:, -1, :].float()
        return logits

    def _sample(self, rows: list[Row], sampler: BatchSampler, logits: torch.Tensor) -> torch.Tensor:
        self._adjust_logits(rows, sampler, logits)
        tokens, logprobs = sampler.sample(logits)
        for row, token, logprob in zip(rows, tokens.tolist(), logprobs.tolist(), strict=True):
            row.output_ids.append(token)
            row.logprobs.append(logprob)
            reason = self._check_stop(row, token)
            if reason is not None:
                row.finish_with(reason, self.weight_version)
        return tokens

    def _adjust_logits(self, rows: list[Row], sampler: BatchSampler, logits: torch.Tensor) -> None:
        if any(p.logit_bias or p.penalized for p in sampler.params):
            apply_logit_adjustments(
                logits, sampler.params, [r.output_ids for r in rows], [r.prompt_ids for r in rows]
            )
        for index, row in enumerate(rows):
            if len(row.output_ids) < row.params.min_new_tokens:
                banned = list(self._stop_ids(row.params))
                if banned:
                    logits[index, banned] = float("-inf")

    def _stop_ids(self, params: SamplingParams) -> frozenset[int]:
        extra = frozenset(params.stop_token_ids)
        return extra if params.ignore_eos else extra | self.eos_ids

    def _check_stop(self, row: Row, token: int) -> FinishReason | None:
        params = row.params
        count = len(row.output_ids)
        if count >= params.min_new_tokens:
            if token in self._stop_ids(params):
                return FinishReason("stop", matched=token)
            if params.stop:
                text = self.decode(row.output_ids, params.skip_special_tokens)
                tail = text[-(max(map(len, params.stop)) + 32) :]
                for stop in params.stop:
                    if stop in tail:
                        return FinishReason("stop", matched=stop)
        if count >= params.max_new_tokens:
            return FinishReason("length", length=count)
        return None

    def _finish_aborted(self, rows: list[Row]) -> None:
        for row in rows:
            if row.finish is None and row.abort is not None:
                row.finish_with(row.abort, self.weight_version)

    def _finished_before_start(self, row: Row) -> bool:
        if row.finish is not None:
            return True
        if row.abort is not None:
            row.finish_with(row.abort, self.weight_version)
        elif row.params.max_new_tokens == 0:
            row.finish_with(FinishReason("length", length=0), self.weight_version)
        return row.finish is not None
