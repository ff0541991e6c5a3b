"""Prompt data: jsonl files, chat templates, the shuffled stream and its resume state."""

from rlpost.data.prompts import (
    ChatTokenizer,
    PromptDataError,
    PromptFormat,
    PromptRecord,
    load_prompts,
)
from rlpost.data.source import (
    DataSource,
    DataSourceState,
    load_eval_groups,
    make_group,
    prompt_format,
)

__all__ = [
    "ChatTokenizer",
    "DataSource",
    "DataSourceState",
    "PromptDataError",
    "PromptFormat",
    "PromptRecord",
    "load_eval_groups",
    "load_prompts",
    "make_group",
    "prompt_format",
]
