"""Where rollouts get their prompts: an epoch-shuffled stream of groups, plus a buffer.

Epoch e visits every prompt once, in the order of a shuffle seeded with seed + e, so the
position (epoch, offset) alone fixes everything that follows: saving it with a checkpoint
and loading it back continues exactly where the run stopped. Groups left unfinished by a
rollout (partial rollout) wait in a buffer and are handed out before fresh prompts.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlpost.data.prompts import ChatTokenizer, PromptFormat, PromptRecord, load_prompts
from rlpost.hooks import BUFFER_FILTER, load_hook
from rlpost.types import Sample

if TYPE_CHECKING:
    from rlpost.schema.recipe import DataConfig

logger = logging.getLogger(__name__)

Group = list[Sample]
BufferFilter = Callable[[int, list[Group], int], list[Group]]
DEFAULT_BUFFER_FILTER = "rlpost.filters.pop_first"
START_ROLLOUT_KEY = "start_rollout_id"


@dataclass(frozen=True)
class DataSourceState:
    """Position in the prompt stream: `offset` prompts of epoch `epoch` are used."""

    epoch: int
    offset: int
    seed: int


class DataSource:
    """Hands out groups of `n_samples_per_prompt` samples per prompt, buffer first."""

    def __init__(
        self,
        prompts: Sequence[PromptRecord],
        *,
        n_samples_per_prompt: int,
        shuffle: bool,
        seed: int,
        buffer_filter: str | None = None,
        num_dropped: int = 0,
    ) -> None:
        if not prompts:
            raise ValueError("a data source needs at least one prompt")
        self.prompts = list(prompts)
        self.n_samples_per_prompt = n_samples_per_prompt
        self.shuffle = shuffle
        self.num_dropped = num_dropped
        self._buffer_filter_path = buffer_filter or DEFAULT_BUFFER_FILTER
        self._buffer_filter: BufferFilter = load_hook(self._buffer_filter_path, BUFFER_FILTER)
        self._buffer: list[Group] = []
        self._seed = seed
        self._epoch = 0
        self._offset = 0
        self._order = self._epoch_order(0)

    @classmethod
    def from_config(
        cls,
        config: DataConfig,
        tokenizer: ChatTokenizer,
        *,
        n_samples_per_prompt: int,
        buffer_filter: str | None = None,
    ) -> DataSource:
        prompts, dropped = load_prompts(
            config.prompt_data, prompt_format(config), tokenizer, config.max_prompt_len
        )
        return cls(
            prompts,
            n_samples_per_prompt=n_samples_per_prompt,
            shuffle=config.shuffle,
            seed=config.seed,
            buffer_filter=buffer_filter,
            num_dropped=dropped,
        )

    def __len__(self) -> int:
        return len(self.prompts)

    def next_groups(self, num_prompts: int, rollout_id: int = 0) -> list[Group]:
        """`num_prompts` groups: buffered ones first (via the buffer filter), then fresh."""
        groups = self._take_from_buffer(rollout_id, num_prompts) if self._buffer else []
        while len(groups) < num_prompts:
            if self._offset == len(self.prompts):
                self._epoch += 1
                self._offset = 0
                self._order = self._epoch_order(self._epoch)
            position = self._offset
            self._offset += 1
            groups.append(self._make_group(position))
        return groups

    def add_to_buffer(self, groups: Sequence[Group], rollout_id: int | None = None) -> None:
        """Keep unfinished groups for a later rollout, tagged with the rollout they began in."""
        for group in groups:
            if rollout_id is not None:
                for sample in group:
                    sample.metadata.setdefault(START_ROLLOUT_KEY, rollout_id)
            self._buffer.append(group)

    @property
    def buffer(self) -> list[Group]:
        """The buffered groups, oldest first (a copy: change it through the methods)."""
        return list(self._buffer)

    def state(self) -> DataSourceState:
        return DataSourceState(epoch=self._epoch, offset=self._offset, seed=self._seed)

    def load_state(self, state: DataSourceState) -> None:
        """Continue from a saved position (the buffer is restored with add_to_buffer)."""
        if not 0 <= state.offset <= len(self.prompts) or state.epoch < 0:
            raise ValueError(
                f"saved data position epoch={state.epoch} offset={state.offset} does not fit "
                f"a dataset of {len(self.prompts)} prompts; was the prompt file or "
                "max_prompt_len changed since the checkpoint?"
            )
        if state.seed != self._seed:
            logger.warning(
                "data seed is %d in the config but %d in the checkpoint; continuing with the "
                "checkpoint's so the prompt order stays the same",
                self._seed,
                state.seed,
            )
        self._seed = state.seed
        self._epoch = state.epoch
        self._offset = state.offset
        self._order = self._epoch_order(state.epoch)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.prompts)))
        if self.shuffle:
            random.Random(self._seed + epoch).shuffle(order)
        return order

    def _make_group(self, position: int) -> Group:
        group_index = self._epoch * len(self.prompts) + position
        return make_group(
            self.prompts[self._order[position]], group_index, self.n_samples_per_prompt
        )

    def _take_from_buffer(self, rollout_id: int, num_groups: int) -> list[Group]:
        taken = self._buffer_filter(rollout_id, self._buffer, num_groups)
        if len(taken) > num_groups:
            raise RuntimeError(
                f"buffer filter '{self._buffer_filter_path}' returned {len(taken)} groups "
                f"when asked for at most {num_groups}"
            )
        # A filter should remove what it returns; make sure nothing is handed out twice.
        taken_ids = {id(group) for group in taken}
        self._buffer[:] = [group for group in self._buffer if id(group) not in taken_ids]
        return list(taken)


def make_group(record: PromptRecord, group_index: int, n_samples: int) -> Group:
    """`n_samples` fresh samples of one prompt; indices are group_index * n + j."""
    return [
        Sample(
            group_index=group_index,
            index=group_index * n_samples + j,
            prompt=record.prompt,
            prompt_ids=list(record.prompt_ids),
            label=record.label,
            metadata=dict(record.metadata),
        )
        for j in range(n_samples)
    ]


def prompt_format(
    config: Any, input_key: str | None = None, label_key: str | None = None
) -> PromptFormat:
    """The data section's keys and template settings, optionally with other keys."""
    return PromptFormat(
        input_key=input_key or config.input_key,
        label_key=label_key if label_key is not None else config.label_key,
        metadata_key=config.metadata_key,
        apply_chat_template=config.apply_chat_template,
        chat_template_kwargs=dict(config.apply_chat_template_kwargs),
    )


def load_eval_groups(
    path: str | Path,
    config: DataConfig,
    tokenizer: ChatTokenizer,
    *,
    n_samples_per_prompt: int,
    input_key: str | None = None,
    label_key: str | None = None,
) -> list[Group]:
    """Every prompt of an eval file, in file order, `n_samples_per_prompt` samples each.

    Same reading and template as the training data (keys may differ); never shuffled and
    never filtered by length, so a benchmark's score is over all of its prompts.
    """
    fmt = prompt_format(config, input_key, label_key)
    prompts, _ = load_prompts(path, fmt, tokenizer, max_prompt_len=None)
    return [make_group(record, i, n_samples_per_prompt) for i, record in enumerate(prompts)]
