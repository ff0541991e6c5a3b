"""Prompt data: jsonl files, chat templates, the shuffled stream and its resume state."""

from rlpost.data.prompts import (
    ChatTokenizer,
    PromptDataError,
    PromptFormat,
    PromptRecord,
    load_prompts,
    prompt_format,
)
from rlpost.data.source import (
    DataSource,
    DataSourceError,
    DataSourceState,
    JsonlSource,
    RolloutDataSource,
    SourceContext,
    load_eval_groups,
    make_group,
)

__all__ = [
    "ChatTokenizer",
    "DataSource",
    "DataSourceError",
    "DataSourceState",
    "JsonlSource",
    "PromptDataError",
    "PromptFormat",
    "PromptRecord",
    "RolloutDataSource",
    "SourceContext",
    "load_eval_groups",
    "load_prompts",
    "make_group",
    "prompt_format",
]
