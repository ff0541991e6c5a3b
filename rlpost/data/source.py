"""Where rollouts get their prompts: a RolloutDataSource, plus the loop's buffer.

The shipped source (JsonlSource) reads `recipe.data.prompt_data`: epoch e visits every
prompt once, in the order of a shuffle seeded with seed + e, so the position (epoch,
offset) alone fixes everything that follows: saving it with a checkpoint and loading it back
continues exactly where the run stopped. `recipe.data.source` replaces it with a class of
the user's (curricula, online prompts). Either way, groups left unfinished by a rollout
(partial rollout) wait in the loop's buffer and are handed out before fresh prompts.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Mapping, Sequence, Sized
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from rlpost.data.prompts import (
    ChatTokenizer,
    PromptFormat,
    PromptRecord,
    load_prompts,
    prompt_format,
    render_prompt_ids,
)
from rlpost.hooks import BUFFER_FILTER, DATA_SOURCE, load_hook, load_object, shown
from rlpost.types import Prompt, Sample

if TYPE_CHECKING:
    from rlpost.schema.data import DataConfig

logger = logging.getLogger(__name__)

Group = list[Sample]
BufferFilter = Callable[[int, list[Group], int], list[Group]]
DEFAULT_BUFFER_FILTER = "rlpost.filters.pop_first"
MAX_DROPPED_DRAWS = 100
"""A source class whose prompts are all too long fails after this many draws of each group."""
START_ROLLOUT_KEY = "start_rollout_id"


@dataclass(frozen=True)
class DataSourceState:
    """Position in the prompt stream: `offset` prompts of epoch `epoch` are used."""

    epoch: int
    offset: int
    seed: int


@runtime_checkable
class RolloutDataSource(Protocol):
    """Where rollouts get fresh prompts (slime's RolloutDataSource), by dotted path in
    `recipe.data.source`; built once per launch as `cls(ctx: SourceContext)`.

    - `get_samples(num_groups)`: that many fresh groups of `ctx.n_samples_per_prompt`
      samples each (`ctx.make_group` builds one); group indices unique over the run.
    - `add_samples(groups)`: the groups a train step trained, rewards filled in (for
      curricula and online prompts; a source may ignore them).
    - `state_dict()` / `load_state_dict(state)`: JSON-able state, saved with every
      checkpoint and loaded on resume, so a resumed run draws what an uninterrupted one would.

    Groups a rollout leaves unfinished (partial rollout, prompts to generate again) never
    come back here: the loop's buffer holds them and hands them out first. Groups whose
    prompt is longer than `ctx.max_prompt_len` (recipe.data.max_prompt_len) tokens are dropped
    as they come and others drawn in their place; `ctx.shuffle` (recipe.data.shuffle) is the
    source's to honour, as slime's sources read `--rollout-shuffle`.
    """

    def get_samples(self, num_groups: int) -> list[Group]: ...

    def add_samples(self, groups: list[Group]) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


@dataclass(frozen=True)
class SourceContext:
    """What a data source class is built with: its settings (`recipe.data.source_settings`),
    the tokenizer and prompt format of `recipe.data`, and the group size."""

    settings: Mapping[str, Any]
    tokenizer: Any
    fmt: PromptFormat
    n_samples_per_prompt: int
    seed: int
    prompt_data: str | None = None
    shuffle: bool = False
    max_prompt_len: int | None = None

    def make_group(
        self,
        group_index: int,
        prompt: Prompt,
        label: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> Group:
        """One group for `prompt` (a string or a chat message list), rendered with the chat
        template when `recipe.data.apply_chat_template` is set, and tokenized. `tools` (tool
        schemas) are written into the prompt by the chat template and kept in the samples'
        metadata as "tools", as a prompt file's tools column is."""
        listed = [dict(tool) for tool in tools] if tools else None
        ids = render_prompt_ids(prompt, self.fmt, self.tokenizer, listed)
        extra = {"tools": listed} if listed else {}
        record = PromptRecord(
            line=0,
            prompt=prompt,
            prompt_ids=tuple(ids),
            label=label,
            metadata={**(metadata or {}), **extra},
        )
        return make_group(record, group_index, self.n_samples_per_prompt)


class JsonlSource:
    """The shipped source: the prompts of `recipe.data.prompt_data`, epoch by epoch, each
    epoch in the order of a shuffle seeded with seed + epoch."""

    def __init__(
        self,
        prompts: Sequence[PromptRecord],
        *,
        n_samples_per_prompt: int,
        shuffle: bool,
        seed: int,
        num_dropped: int = 0,
    ) -> None:
        if not prompts:
            raise ValueError("a data source needs at least one prompt")
        self.prompts = list(prompts)
        self.n_samples_per_prompt = n_samples_per_prompt
        self.shuffle = shuffle
        self.num_dropped = num_dropped
        self._seed = seed
        self._epoch = 0
        self._offset = 0
        self._order = self._epoch_order(0)

    def __len__(self) -> int:
        return len(self.prompts)

    def get_samples(self, num_groups: int) -> list[Group]:
        groups: list[Group] = []
        while len(groups) < num_groups:
            if self._offset == len(self.prompts):
                self._epoch += 1
                self._offset = 0
                self._order = self._epoch_order(self._epoch)
            position = self._offset
            self._offset += 1
            groups.append(self._make_group(position))
        return groups

    def add_samples(self, groups: list[Group]) -> None:
        """The file's order does not depend on what was trained."""

    def state_dict(self) -> dict[str, Any]:
        return asdict(DataSourceState(epoch=self._epoch, offset=self._offset, seed=self._seed))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a saved position."""
        saved = DataSourceState(**state)
        if not 0 <= saved.offset <= len(self.prompts) or saved.epoch < 0:
            raise ValueError(
                f"saved data position epoch={saved.epoch} offset={saved.offset} does not fit "
                f"a dataset of {len(self.prompts)} prompts; was the prompt file or "
                "max_prompt_len changed since the checkpoint?"
            )
        if saved.seed != self._seed:
            logger.warning(
                "data seed is %d in the config but %d in the checkpoint; continuing with the "
                "checkpoint's so the prompt order stays the same",
                self._seed,
                saved.seed,
            )
        self._seed = saved.seed
        self._epoch = saved.epoch
        self._offset = saved.offset
        self._order = self._epoch_order(saved.epoch)

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


class DataSource:
    """A RolloutDataSource and the buffer the loop keeps in front of it: groups handed back
    unfinished are handed out first (through the buffer filter), then fresh ones."""

    def __init__(
        self,
        source: RolloutDataSource,
        *,
        buffer_filter: str | None = None,
        max_prompt_len: int | None = None,
    ) -> None:
        self.source = source
        self.max_prompt_len = max_prompt_len
        self._dropped = 0  # fresh groups dropped over max_prompt_len, in this process
        self.name = f"{type(source).__module__}.{type(source).__qualname__}"
        self._buffer_filter_path = buffer_filter or DEFAULT_BUFFER_FILTER
        self._buffer_filter: BufferFilter = load_hook(self._buffer_filter_path, BUFFER_FILTER)
        self._buffer: list[Group] = []
        self._seen: set[int] = set()

    @classmethod
    def of_prompts(
        cls,
        prompts: Sequence[PromptRecord],
        *,
        n_samples_per_prompt: int,
        shuffle: bool,
        seed: int,
        buffer_filter: str | None = None,
        num_dropped: int = 0,
    ) -> DataSource:
        source = JsonlSource(
            prompts,
            n_samples_per_prompt=n_samples_per_prompt,
            shuffle=shuffle,
            seed=seed,
            num_dropped=num_dropped,
        )
        return cls(source, buffer_filter=buffer_filter)

    @classmethod
    def from_config(
        cls,
        config: DataConfig,
        tokenizer: ChatTokenizer,
        *,
        n_samples_per_prompt: int,
        buffer_filter: str | None = None,
        prompts_per_rollout: int = 1,
    ) -> DataSource:
        if config.source:
            ctx = SourceContext(
                settings=dict(config.source_settings),
                tokenizer=tokenizer,
                fmt=prompt_format(config),
                n_samples_per_prompt=n_samples_per_prompt,
                seed=config.seed,
                prompt_data=config.prompt_data,
                shuffle=config.shuffle,
                max_prompt_len=config.max_prompt_len,
            )
            source_class = load_object(config.source, DATA_SOURCE)
            try:
                source = source_class(ctx)
            except Exception as exc:  # the user's class: name it, and what it was given
                raise DataSourceError(
                    f"data source '{config.source}' could not be built: "
                    f"{config.source.rpartition('.')[2]}(ctx) raised {type(exc).__name__}: "
                    f"{exc} (ctx.settings, recipe.data.source_settings: "
                    f"{dict(config.source_settings)!r}; ctx.prompt_data: {config.prompt_data!r})"
                ) from exc
            return cls(source, buffer_filter=buffer_filter, max_prompt_len=config.max_prompt_len)
        assert config.prompt_data is not None  # the schema requires one of the two
        prompts, dropped = load_prompts(
            config.prompt_data,
            prompt_format(config),
            tokenizer,
            config.max_prompt_len,
            min_prompts=prompts_per_rollout,
        )
        return cls.of_prompts(
            prompts,
            n_samples_per_prompt=n_samples_per_prompt,
            shuffle=config.shuffle,
            seed=config.seed,
            buffer_filter=buffer_filter,
            num_dropped=dropped,
        )

    def __len__(self) -> int:
        return len(self.source) if isinstance(self.source, Sized) else 0

    @property
    def num_dropped(self) -> int:
        """Prompts dropped over max_prompt_len: by the jsonl source as it loaded, and here as
        a source class's groups came."""
        return int(getattr(self.source, "num_dropped", 0)) + self._dropped

    def next_groups(self, num_prompts: int, rollout_id: int = 0) -> list[Group]:
        """`num_prompts` groups: buffered ones first (via the buffer filter), then fresh."""
        groups = self._take_from_buffer(rollout_id, num_prompts) if self._buffer else []
        if len(groups) < num_prompts:
            groups += self._fresh(num_prompts - len(groups))
        return groups

    def _fresh(self, wanted: int) -> list[Group]:
        """`wanted` groups from the source whose prompts fit max_prompt_len, drawing again in
        place of those that do not; a source that gives `MAX_DROPPED_DRAWS` x `wanted` long
        prompts in a row without one that fits is an error, not a hang."""
        fresh: list[Group] = []
        dropped = dropped_in_a_row = 0
        while len(fresh) < wanted:
            missing = wanted - len(fresh)
            got = self._checked(self.source.get_samples(missing), missing)
            kept = [g for g in got if self._fits(g)]
            dropped += missing - len(kept)
            dropped_in_a_row = 0 if kept else dropped_in_a_row + missing
            if dropped_in_a_row >= MAX_DROPPED_DRAWS * wanted:
                raise DataSourceError(
                    f"data source '{self.name}' gave {dropped_in_a_row} prompts in a row "
                    f"longer than recipe.data.max_prompt_len={self.max_prompt_len} tokens: "
                    "raise max_prompt_len, or make the source give shorter prompts"
                )
            fresh += kept
        if dropped:
            self._dropped += dropped
            logger.info(
                "%s: dropped %d prompts over max_prompt_len=%s tokens (%d so far)",
                self.name, dropped, self.max_prompt_len, self._dropped,
            )  # fmt: skip
        return fresh

    def _fits(self, group: Group) -> bool:
        limit = self.max_prompt_len
        return limit is None or len(group[0].prompt_ids) <= limit

    def trained(self, groups: Sequence[Group]) -> None:
        """Tell the source which groups a train step trained (RolloutDataSource.add_samples)."""
        self.source.add_samples(list(groups))

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

    def state(self) -> dict[str, Any]:
        """A copy of the source's state as it is now (the buffer is saved with the
        checkpoint's groups): JSON, so drawing on while a checkpoint is written cannot
        change what it saves."""
        state = self.source.state_dict()
        try:
            copied: dict[str, Any] = json.loads(json.dumps(state))
        except (TypeError, ValueError) as exc:
            raise DataSourceError(
                f"data source '{self.name}'.state_dict() returned a state that is not JSON "
                f"({exc}): return plain dicts, lists, strings and numbers"
            ) from None
        return copied

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Continue from a saved state (the buffer is restored with add_to_buffer)."""
        self.source.load_state_dict(state)

    def _checked(self, groups: Any, wanted: int) -> list[Group]:
        """What a source's get_samples returned, checked: a list of `wanted` groups, each a
        non-empty list of Samples of one new group index."""
        where = f"data source '{self.name}'.get_samples({wanted})"
        if not isinstance(groups, list) or len(groups) != wanted:
            size = len(groups) if isinstance(groups, list) else type(groups).__name__
            raise DataSourceError(f"{where} returned {size}; expected a list of {wanted} groups")
        for group in groups:
            if not group or not all(isinstance(s, Sample) for s in group):
                raise DataSourceError(
                    f"{where} returned a group that is not a non-empty list of Samples "
                    "(build groups with ctx.make_group)"
                )
            index = group[0].group_index
            if any(s.group_index != index for s in group) or index in self._seen:
                raise DataSourceError(
                    f"{where} returned group index {index} twice: group indices must be "
                    "unique over the run (keep a counter in the source's state_dict)"
                )
            self._seen.add(index)
        return groups

    def _take_from_buffer(self, rollout_id: int, num_groups: int) -> list[Group]:
        where = f"buffer filter '{self._buffer_filter_path}'"
        buffered = {id(group) for group in self._buffer}
        try:
            taken = self._buffer_filter(rollout_id, self._buffer, num_groups)
        except Exception as exc:
            raise DataSourceError(f"{where} raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(taken, list | tuple) or any(id(g) not in buffered for g in taken):
            raise DataSourceError(
                f"{where} returned {shown(taken)}; it returns a list of at most {num_groups} "
                "of the groups in the buffer it is given (each a list of Samples, as the "
                "buffer holds them), removing them from it"
            )
        if len(taken) > num_groups:
            raise DataSourceError(
                f"{where} returned {len(taken)} groups when asked for at most {num_groups}"
            )
        # A filter should remove what it returns; make sure nothing is handed out twice.
        taken_ids = {id(group) for group in taken}
        self._buffer[:] = [group for group in self._buffer if id(group) not in taken_ids]
        return list(taken)


class DataSourceError(RuntimeError):
    """A data source class returned something the loop cannot use."""


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


def load_eval_groups(
    path: str | Path,
    config: DataConfig,
    tokenizer: ChatTokenizer,
    *,
    n_samples_per_prompt: int,
    input_key: str | None = None,
    label_key: str | Literal[False] | None = None,
    tool_key: str | Literal[False] | None = None,
) -> list[Group]:
    """Every prompt of an eval file, in file order, `n_samples_per_prompt` samples each.

    Same reading and template as the training data (keys may differ); never shuffled and
    not filtered by length here: only recipe.eval.max_prompt_len, where set, leaves prompts
    out (rlpost.runtime.evaluation), so a benchmark's score is otherwise over all of them.
    """
    fmt = prompt_format(config, input_key, label_key, tool_key)
    prompts, _ = load_prompts(path, fmt, tokenizer, max_prompt_len=None)
    return [make_group(record, i, n_samples_per_prompt) for i, record in enumerate(prompts)]
