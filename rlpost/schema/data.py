"""The data section (recipe.data): where the training prompts come from and how they are read."""

from __future__ import annotations

from typing import Any

from pydantic import Field, PositiveInt, model_validator

from rlpost.schema.base import InvariantError, Section, refuse_unused
from rlpost.schema.prompt_file import PromptPath
from rlpost.schema.training_only import training_rule

# The arguments rlpost passes to tokenizer.apply_chat_template itself (rlpost.data.prompts).
TEMPLATE_CALL_ARGUMENTS = frozenset(
    {"conversation", "add_generation_prompt", "tokenize", "continue_final_message", "tools"}
)


class DataConfig(Section):
    prompt_data: PromptPath | None = Field(
        None,
        description="a jsonl or parquet file of prompts, optionally with a row slice as "
        "slime's --prompt-data takes it: /data/train.parquet@[0:1000] (Python's slice of the "
        "rows; @[-100:] the last 100); required unless `source` is set",
    )
    source: str | None = Field(
        None,
        description="a data source class by dotted path (slime's RolloutDataSource): "
        "get_samples(n), add_samples(groups), state_dict(), load_state_dict(state); "
        "built as cls(ctx) with rlpost.data.source.SourceContext",
    )
    source_settings: dict[str, Any] = Field(
        default_factory=dict, description="the data source class's own settings (ctx.settings)"
    )
    input_key: str = Field(
        "input",
        description="the field of a prompt row that holds the prompt; a dotted path reads a "
        "nested object's field, where the row has no top-level key of that name (dots and "
        "all), which is read first",
    )
    label_key: str | None = Field(
        None,
        description="the field of a prompt row that holds the label (the reference answer); "
        "a dotted path reads a nested object's field (reward_model.ground_truth in verl's "
        "parquet files), where the row has no top-level key of that name (dots and all), "
        "which is read first; slime reads top-level keys only",
    )
    metadata_key: str = "metadata"
    tool_key: str | None = Field(
        "tools",
        description="the field of a prompt line that holds its tools (a list of tool schemas, "
        "or a JSON string of one), passed to the chat template as `tools` and kept in the "
        "line's metadata as 'tools', as slime's --tool-key; null reads no tools",
    )
    apply_chat_template: bool = False
    apply_chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    shuffle: bool = False
    seed: int = 42
    max_prompt_len: PositiveInt | None = None

    @model_validator(mode="after")
    @training_rule
    def check_prompts_have_a_source(self) -> DataConfig:
        if self.prompt_data is None and self.source is None:
            raise InvariantError(
                "no prompts: neither prompt_data (a jsonl or parquet file) nor source (a data "
                "source class) is set",
                fields=("prompt_data",),
                fix="set prompt_data: /path/train.jsonl (or .parquet), or source: "
                "my_pkg.data.MySource",
            )
        if self.source is None:
            refuse_unused(
                self,
                "source_settings",
                why="the jsonl source reads no settings",
                fix="set source to the class that reads them, or remove source_settings",
            )
        return self

    @model_validator(mode="after")
    @training_rule
    def check_seed_orders_a_shuffle(self) -> DataConfig:
        if self.source is None and not self.shuffle:
            refuse_unused(
                self,
                "seed",
                why="the jsonl source draws the prompts in the file's order when shuffle is "
                "false, and seed only orders its shuffle (every seed gives the same order)",
                fix="set shuffle: true to draw the prompts in the seed's order, or remove seed",
            )
        return self

    @model_validator(mode="after")
    def check_template_kwargs_have_a_template(self) -> DataConfig:
        if not self.apply_chat_template:
            refuse_unused(
                self,
                "apply_chat_template_kwargs",
                why="they are passed to the tokenizer's chat template, and apply_chat_template "
                "is false: prompts are sent as written",
                fix="set apply_chat_template: true, or remove apply_chat_template_kwargs",
            )
        return self

    @model_validator(mode="after")
    def check_template_kwargs_are_the_templates(self) -> DataConfig:
        own = sorted(self.apply_chat_template_kwargs.keys() & TEMPLATE_CALL_ARGUMENTS)
        if own:
            raise InvariantError(
                f"{', '.join(own)} {'is' if len(own) == 1 else 'are'} set by rlpost itself when "
                "it renders a prompt (a generation prompt, as text, with the line's tools); "
                "passed again, every prompt would fail with 'got multiple values for keyword "
                "argument'",
                fields=("apply_chat_template_kwargs",),
                fix=f"remove {', '.join(own)}; apply_chat_template_kwargs are the template's "
                "own variables (enable_thinking, ...)"
                + ("; tools come from each prompt line's tool_key field" if "tools" in own else ""),
            )
        return self
