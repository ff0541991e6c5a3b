"""Prompts from a jsonl or parquet file: checked row by row, rendered with the chat template,
tokenized.

Each row is a JSON object (a jsonl line) or a parquet row; the path may select rows with a
slice, `train.parquet@[0:1000]` (rlpost.data.files). The input key holds a string or a chat
message list (`[{"role": "user", "content": "..."}]`, as in dapo-math-17k); the label key a
string or a number; the metadata key, when present, an object; the tool key, when present,
the row's tools: a list of tool schemas, or a JSON string of one, which the chat template
renders into the prompt and the row's metadata keeps as "tools" (slime's `--tool-key`). A
top-level `data_source` field (the data set's name in verl's parquet files, which a reward
function of verl's shape is given) is kept in the metadata as "data_source", unless the
metadata holds one of its own. The input key and the label key may be dotted paths into
nested objects (`reward_model.ground_truth`, where verl's parquet files keep the answer); a key
a row has at its top level, dots and all, is read first. A column of JSON text (an export
that json.dumps its objects first) reads as what it holds: a prompt string that is a JSON
list of objects with roles is a message list, a metadata string must hold an object, and a
dotted key reads into a string of an object (slime and verl hand such a prompt string to the chat
template undecoded, where a message list is expected). Bad rows are all reported at once,
with file and line number (a parquet file: row number).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from rlpost.data.files import RawRow, UnreadableFile, prompt_rows
from rlpost.errors import Issue, Location, UserError
from rlpost.schema.prompt_file import split_prompt_path
from rlpost.types import Prompt

logger = logging.getLogger(__name__)

# the field of verl's rows that names their data set, kept in the metadata under its name
DATA_SOURCE = "data_source"

MAX_REPORTED_LINES = 10
ONE_OBJECT = "make every line one JSON object"
Tools = list[dict[str, Any]]
PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "probe_tool",
        "description": "A tool that shows whether the chat template renders tools.",
        "parameters": {"type": "object", "properties": {}},
    },
}


class ChatTokenizer(Protocol):
    """The two tokenizer calls prompts need (a transformers tokenizer has both)."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def __call__(self, text: Any, **kwargs: Any) -> Any: ...


class PromptDataError(UserError):
    """A prompt file that cannot be used: missing, or with bad lines."""

    def __init__(self, issues: Sequence[Issue]) -> None:
        super().__init__(issues, title="data error")


@dataclass(frozen=True)
class PromptRecord:
    """One usable prompt; `line` is its 1-based line in the file (a parquet file: its row)."""

    line: int
    prompt: Prompt
    prompt_ids: tuple[int, ...]
    label: str | None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PromptFormat:
    """How to read and render a prompt file (the data section's keys and template)."""

    input_key: str
    label_key: str | None
    metadata_key: str
    tool_key: str | None
    apply_chat_template: bool
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


def prompt_format(
    config: Any,
    input_key: str | None = None,
    label_key: str | Literal[False] | None = None,
    tool_key: str | Literal[False] | None = None,
) -> PromptFormat:
    """The data section's keys and template settings, optionally with other keys (label_key
    False: no label, tool_key False: no tools, as an evaluation set's)."""
    return PromptFormat(
        input_key=input_key or config.input_key,
        label_key=(
            None if label_key is False else config.label_key if label_key is None else label_key
        ),
        metadata_key=config.metadata_key,
        tool_key=(None if tool_key is False else config.tool_key if tool_key is None else tool_key),
        apply_chat_template=config.apply_chat_template,
        chat_template_kwargs=dict(config.apply_chat_template_kwargs),
    )


def load_prompts(
    path: str | Path,
    fmt: PromptFormat,
    tokenizer: ChatTokenizer,
    max_prompt_len: int | None = None,
    min_prompts: int = 1,
) -> tuple[list[PromptRecord], int]:
    """The prompts the path selects (a jsonl or parquet file, with its row slice if any) and
    how many `max_prompt_len` (recipe.data's) dropped; PromptDataError if bad, or if the drop
    leaves fewer than `min_prompts` (one rollout's)."""
    prompt_file = split_prompt_path(str(path))
    unit = prompt_file.unit
    rows: list[Row] = []
    texts: list[str] = []
    issues: list[Issue] = []
    bad_lines = 0
    try:
        for number, raw in prompt_rows(prompt_file):
            where = Location(file=prompt_file.path, line=number, unit=unit)
            try:
                row = read_row(number, raw, fmt, unit=unit)
                texts.append(_render(row.prompt, fmt, tokenizer, row.tools))
            except LineError as exc:
                bad_lines += 1
                if len(issues) < MAX_REPORTED_LINES:
                    issue = Issue(exc.key, exc.message, exc.fix, value=exc.value, location=where)
                    issues.append(issue)
                continue
            rows.append(row)
    except UnreadableFile as exc:
        raise PromptDataError(
            [
                Issue(
                    "prompt file",
                    str(exc),
                    "check the path (data.prompt_data, or the eval dataset's path)",
                    value=str(path),
                )
            ]
        ) from None
    ignored = _ignored_tools(rows, fmt, tokenizer, prompt_file.path, unit)
    if bad_lines or ignored:
        more = _more_lines(bad_lines - len(issues), prompt_file.path, unit)
        raise PromptDataError(issues + more + ignored)
    records = _tokenize(rows, texts, tokenizer)
    if not records:
        why = "has no prompts"
        if prompt_file.rows is not None:
            why += f" in the rows {prompt_file.slice_text} selects"
        fix = f"write one JSON object per {unit} into it, or use another file"
        raise PromptDataError([Issue("prompt file", why, fix, value=str(path))])
    kept = [r for r in records if max_prompt_len is None or len(r.prompt_ids) <= max_prompt_len]
    dropped = len(records) - len(kept)
    if dropped and len(kept) < min_prompts:
        too_few = _too_few_left(prompt_file.path, records, len(kept), max_prompt_len, min_prompts)
        raise PromptDataError([too_few])
    if dropped:  # said where the person launching sees it, not only in a log
        logger.warning(
            "%s: left out %d of %d prompts longer than recipe.data.max_prompt_len=%s tokens",
            path, dropped, len(records), max_prompt_len,
        )  # fmt: skip
    return kept, dropped


def _too_few_left(
    path: str,
    records: Sequence[PromptRecord],
    kept: int,
    max_prompt_len: int | None,
    min_prompts: int,
) -> Issue:
    """The refusal of a max_prompt_len that leaves out all prompts, or so many that those left
    cannot fill one rollout, naming the limit that keeps enough."""
    lengths = sorted(len(r.prompt_ids) for r in records)
    needed = lengths[min(min_prompts, len(lengths)) - 1]  # keeps min_prompts (or every one)
    spread = f"(they run from {lengths[0]} to {lengths[-1]} tokens, the chat template's included)"
    what = (
        f"leaves out all {len(records)} prompts of the file {spread}"
        if not kept
        else f"leaves out {len(records) - kept} of the file's {len(records)} prompts {spread}, "
        f"and the {kept} left cannot fill one rollout of recipe.rollout.batch_size="
        f"{min_prompts} prompts: every rollout would draw the same few again"
    )
    return Issue(
        "recipe.data.max_prompt_len",
        what,
        f"raise recipe.data.max_prompt_len to at least {needed} (within the engines' context), "
        "or use a file of shorter prompts",
        value=max_prompt_len,
        location=Location(file=path),
    )


class LineError(Exception):
    """What is wrong with one line (`key`: the line's field, or "line"), and the fix."""

    def __init__(
        self, key: str, message: str, fix: str, value: Any = None, missing_from: Any = None
    ) -> None:
        super().__init__(message)
        self.key, self.message, self.fix, self.value = key, message, fix, value
        # the keys the line has, when `key` is one of the data section's and it lacks it
        self.missing_from: tuple[str, ...] | None = (
            None if missing_from is None else tuple(sorted(missing_from))
        )


@dataclass(frozen=True)
class Row:
    """A line read and checked: `tools` is None when the line has none."""

    line: int
    prompt: Prompt
    label: str | None
    metadata: dict[str, Any]
    tools: Tools | None


def read_row(
    number: int,
    raw: RawRow,
    fmt: PromptFormat,
    markers: Sequence[str] = (),
    unit: str = "line",
) -> Row:
    """One row (a jsonl line's text, or a parquet row) read and checked as far as no
    tokenizer is needed (`rlpost validate` runs the same reading; `markers`: the chat
    template's, where known); LineError names what is wrong and the fix, `unit` says what a
    row is called there (a jsonl line, a parquet row)."""
    row = _parse_line(number, raw, fmt, unit)
    if not fmt.apply_chat_template:
        _check_untemplated(row.prompt, fmt, row.tools)
    else:
        check_not_templated(row.prompt, fmt, markers)
    return row


def _parse_line(number: int, line: RawRow, fmt: PromptFormat, unit: str = "line") -> Row:
    if isinstance(line, dict):
        row = line
    else:
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise LineError(
                "line",
                f"is not valid JSON ({exc.msg}, column {exc.colno})",
                ONE_OBJECT,
                _short(line),
            ) from None
    if not isinstance(row, dict):
        kind = type(row).__name__
        raise LineError("line", f"is a JSON {kind}, not an object", ONE_OBJECT, _short(row))
    prompt = _message_text(_field(row, fmt.input_key, "data.input_key", unit))
    _check_prompt(fmt.input_key, prompt, unit)
    label = None
    if fmt.label_key is not None:
        raw = _field(row, fmt.label_key, "data.label_key", unit)
        if raw is None:  # a JSON null, or a parquet row's empty cell
            raise LineError(
                fmt.label_key,
                f"is null: the {unit} has no reference answer to grade against",
                f"store this {unit}'s reference answer under that key, or leave the {unit} out",
            )
        if isinstance(raw, bool) or not isinstance(raw, str | int | float):
            raise LineError(
                fmt.label_key,
                f"is of type {type(raw).__name__}; a label must be a string or a number",
                "store the reference answer as a string",
                _short(raw),
            )
        label = str(raw)
    metadata = row.get(fmt.metadata_key)
    if metadata is None:
        metadata = {}
    if isinstance(metadata, str):
        metadata = _object_text(fmt.metadata_key, metadata)
    if not isinstance(metadata, dict):
        raise LineError(
            fmt.metadata_key,
            f"is of type {type(metadata).__name__}; metadata must be a JSON object",
            "store metadata as an object, or point data.metadata_key at another field",
            _short(metadata),
        )
    source = row.get(DATA_SOURCE)
    if source is not None and DATA_SOURCE not in metadata and fmt.metadata_key != DATA_SOURCE:
        metadata = {**metadata, DATA_SOURCE: source}
    if fmt.tool_key is None or row.get(fmt.tool_key) is None:
        return Row(number, prompt, label, metadata, tools=None)
    tools = _tools(fmt.tool_key, row[fmt.tool_key])
    _check_metadata_tools(metadata, tools, fmt.tool_key, fmt.metadata_key)
    return Row(number, prompt, label, {**metadata, "tools": tools}, tools)


def _message_text(prompt: Any) -> Any:
    """A prompt string that holds a JSON list of objects each with a "role" is a message list
    written as JSON text (a parquet column of messages that pandas or json.dumps wrote as
    strings): decoded, then checked as messages. Any other string, JSON of another shape
    included, is the prompt's own text."""
    messages = _json_text(prompt, "[")
    if (
        isinstance(messages, list)
        and messages
        and all(isinstance(m, dict) and "role" in m for m in messages)
    ):
        return messages
    return prompt


def _json_text(value: Any, opener: str) -> Any:
    """What `value` holds where it is a string of JSON text opening with `opener` ("[" a list,
    "{" an object); None where it is not (the caller then keeps `value` as it is)."""
    if not isinstance(value, str) or not value.lstrip().startswith(opener):
        return None
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return None


def _decoded(key: str, value: str, fix: str) -> Any:
    """A string a field must hold JSON text in (metadata, tools), decoded; LineError naming
    the key where it is not JSON."""
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        message = f"is a string that is not JSON ({exc.msg}, column {exc.colno})"
        raise LineError(key, message, fix, _short(value)) from None


# "role" as JSON text inside a JSON string: its quotes escaped, as JSON writers escape them
QUOTED_ROLE = ('\\"role\\"', "\\u0022role\\u0022")


def holds_json_messages(raw: RawRow, key: str) -> bool:
    """Whether a row's top-level `key` holds a message list as JSON text: a string the row
    reader decodes into messages (`_message_text`), where a reader of the string as it is
    (slime) takes it for the user's text."""
    if isinstance(raw, dict):
        row: Any = raw
    elif not any(quoted in raw for quoted in QUOTED_ROLE):
        return False  # no string in the line can hold a message with a role: not parsed
    else:
        try:
            row = json.loads(raw)
        except json.JSONDecodeError:
            return False
    value = row.get(key) if isinstance(row, dict) else None
    return isinstance(value, str) and isinstance(_message_text(value), list)


def _object_text(key: str, value: str) -> dict[str, Any]:
    """A metadata string: JSON text of an object (a parquet column of objects with varying
    keys, written as strings), decoded; anything else is refused naming the key."""
    fix = f"store {key} as an object, or a string of one; or point data.metadata_key elsewhere"
    decoded = _decoded(key, value, fix)
    if not isinstance(decoded, dict):
        kind = type(decoded).__name__
        message = f"is a string holding a JSON {kind}; metadata must be a JSON object"
        raise LineError(key, message, fix, _short(value))
    return decoded


def _tools(key: str, value: Any) -> Tools:
    """A line's tools: a list of objects, or a string holding one (decoded, as slime does)."""
    fix = (
        'store the tools as a list of tool schemas [{"type": "function", "function": {...}}], '
        "or point data.tool_key at the field that holds them"
    )
    tools = _decoded(key, value, fix) if isinstance(value, str) else value
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise LineError(
            key,
            f"holds {_kind(tools)}; tools must be a list of JSON objects (tool schemas), or "
            "a string holding one",
            fix,
            _short(value),
        )
    return tools


def _kind(value: Any) -> str:
    if isinstance(value, list):
        kinds = sorted({type(item).__name__ for item in value if not isinstance(item, dict)})
        return f"a list with items of type {', '.join(kinds)}"
    return f"a value of type {type(value).__name__}"


def _check_metadata_tools(
    metadata: dict[str, Any], tools: Tools, key: str, metadata_key: str
) -> None:
    """A line's tools are kept in its metadata as "tools" (as slime keeps them): other tools
    there would be lost."""
    if "tools" in metadata and metadata["tools"] != tools:
        raise LineError(
            key,
            f"differs from the line's {metadata_key}.tools, where the line's tools are kept: "
            "one of the two would be lost",
            f"remove 'tools' from {metadata_key}, or make it equal to the '{key}' field",
            _short(tools),
        )


def _field(row: dict[str, Any], key: str, config_key: str, unit: str = "line") -> Any:
    """The row's value at `key`: its top-level key of that name, else (a dotted key) the
    value at that path through nested objects (a string of a JSON object is one)."""
    if key in row:
        return row[key]
    value: Any = row
    for part in key.split(".") if "." in key else (key,):
        value = _nested_object(value)
        if not isinstance(value, dict) or part not in value:
            break
        value = value[part]
    else:
        return value
    keys = row_keys(row)
    present = ", ".join(keys) or "none"
    nested = [k for k in keys if "." in k]
    how = f" (a dotted key reads a nested one, e.g. {nested[0]})" if nested else ""
    raise LineError(
        key,
        f"is missing (this {unit}'s keys: {present})",
        f"add '{key}' to every {unit}, or set {config_key} to the field that holds it{how}",
        missing_from=keys,
    )


def _nested_object(value: Any) -> Any:
    """`value`, or the object a string of JSON text holds (verl's reward_model column
    written as strings)."""
    decoded = _json_text(value, "{")
    return decoded if isinstance(decoded, dict) else value


def row_keys(row: dict[str, Any]) -> list[str]:
    """A row's keys, sorted, each object-valued one followed by its own keys as dotted paths
    (`reward_model.ground_truth`), a string of a JSON object's as well: what a data key may
    name."""
    keys: list[str] = []
    for name in sorted(row):
        keys.append(name)
        value = _nested_object(row[name])
        if isinstance(value, dict):
            keys += [f"{name}.{inner}" for inner in sorted(value)]
    return keys


def _check_prompt(key: str, prompt: Any, unit: str = "line") -> None:
    if isinstance(prompt, str):
        if not prompt.strip():
            raise LineError(key, "is an empty string", f"give every {unit} a prompt", prompt)
        return
    fix = 'use a string or a message list [{"role": "user", "content": "..."}]'
    if not isinstance(prompt, list) or not prompt:
        raise LineError(
            key, f"is of type {type(prompt).__name__}, not a prompt", fix, _short(prompt)
        )
    for position, message in enumerate(prompt):
        ok = isinstance(message, dict) and isinstance(message.get("role"), str)
        if not ok or "content" not in message:
            raise LineError(
                key,
                f"message {position} is not an object with 'role' and 'content'",
                fix,
                _short(message),
            )


def _render(
    prompt: Prompt, fmt: PromptFormat, tokenizer: ChatTokenizer, tools: Tools | None = None
) -> str:
    if not fmt.apply_chat_template:
        _check_untemplated(prompt, fmt, tools)
        assert isinstance(prompt, str)  # _check_untemplated refuses message lists
        return prompt
    check_not_templated(prompt, fmt, _template_markers(tokenizer))
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    try:
        text = tokenizer.apply_chat_template(
            messages,
            tools=tools,
            add_generation_prompt=True,
            tokenize=False,
            **fmt.chat_template_kwargs,
        )
    except Exception as exc:  # jinja raises anything a template author chose
        raise LineError(
            fmt.input_key,
            f"the tokenizer's chat template failed on it: {type(exc).__name__}: {exc}",
            "fix the messages (roles, order) or data.apply_chat_template_kwargs",
            _short(prompt),
        ) from None
    if not isinstance(text, str):
        raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}")
    return text


def _check_untemplated(prompt: Prompt, fmt: PromptFormat, tools: Tools | None) -> None:
    """A prompt sent as written (no chat template) is text, with no tools to describe."""
    if not isinstance(prompt, str):
        raise LineError(
            fmt.input_key,
            "is a message list, which needs the chat template to become text",
            "set data.apply_chat_template: true",
            _short(prompt),
        )
    if tools:
        raise LineError(
            fmt.tool_key or "tools",
            "holds tools, which only the chat template writes into a prompt, and "
            "apply_chat_template is false: the prompt would never describe them",
            "set data.apply_chat_template: true, or data.tool_key: null to keep them out "
            "of the prompt",
            _short(tools),
        )


_MARKERS: dict[int, tuple[ChatTokenizer, tuple[str, ...]]] = {}


def _template_markers(tokenizer: ChatTokenizer) -> tuple[str, ...]:
    """The special tokens the chat template writes around a message (ChatML's <|im_start|>
    and <|im_end|>, Llama 3's headers): text that holds one was rendered already."""
    cached = _MARKERS.get(id(tokenizer))
    if cached is not None and cached[0] is tokenizer:
        return cached[1]
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    special = dict.fromkeys(
        [
            *(getattr(tokenizer, "all_special_tokens", None) or []),
            *(str(t.content) for t in added.values() if getattr(t, "special", False)),
        ]
    )  # the named special tokens, and every added token marked special
    try:
        probe = tokenizer.apply_chat_template(
            [{"role": "user", "content": "x"}], add_generation_prompt=True, tokenize=False
        )
    except Exception:  # a template that needs more than one user message: nothing to learn
        probe = ""
    markers = tuple(t for t in special if isinstance(probe, str) and t and t in probe)
    _MARKERS[id(tokenizer)] = (tokenizer, markers)
    return markers


def held_marker(prompt: Prompt, markers: Sequence[str]) -> str | None:
    """The first of the chat template's markers a prompt's text holds, None when none."""
    if isinstance(prompt, str):
        texts = [prompt]
    else:
        texts = [m["content"] for m in prompt if isinstance(m.get("content"), str)]
    if not markers or not any("<" in t or "[" in t for t in texts):  # markers are bracketed
        return None
    return next((m for m in markers for t in texts if m in t), None)


def check_not_templated(prompt: Prompt, fmt: PromptFormat, markers: Sequence[str]) -> None:
    """A prompt rendered already (data written for another framework) would be wrapped in a
    second conversation by the template: LineError naming the marker it holds."""
    marker = held_marker(prompt, markers)
    if marker is not None:
        raise LineError(
            fmt.input_key,
            f"already holds the chat template's marker {marker!r}: the template would wrap "
            "the rendered conversation in a second one",
            "store the question itself (or a message list), or set "
            "recipe.data.apply_chat_template: false to send prompts as written",
            _short(prompt),
        )


_TOOL_PROBES: dict[tuple[int, str], tuple[ChatTokenizer, bool]] = {}


def _template_ignores_tools(tokenizer: ChatTokenizer, kwargs: dict[str, Any]) -> bool:
    """True when the chat template renders a conversation the same with a tool as without:
    transformers passes `tools` to every template and drops it silently in one that never
    reads it. Probed once per tokenizer and template arguments."""
    key = (id(tokenizer), json.dumps(kwargs, sort_keys=True, default=repr))
    cached = _TOOL_PROBES.get(key)
    if cached is not None and cached[0] is tokenizer:
        return cached[1]
    messages = [{"role": "user", "content": "x"}]
    try:
        renders = [
            tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=False, **kwargs
            )
            for tools in (None, [PROBE_TOOL])
        ]
    except Exception:  # a template that refuses the probe: nothing to learn (a line's own
        renders = []  # render reports what its template refuses)
    ignores = len(renders) == 2 and renders[0] == renders[1]
    _TOOL_PROBES[key] = (tokenizer, ignores)
    return ignores


def _ignored_tools(
    rows: Sequence[Row], fmt: PromptFormat, tokenizer: ChatTokenizer, path: str, unit: str
) -> list[Issue]:
    """One issue when lines have tools and the chat template would drop them, else none."""
    first = next((row for row in rows if row.tools), None)
    if first is None or not _template_ignores_tools(tokenizer, fmt.chat_template_kwargs):
        return []
    return [
        Issue(
            "model.hf_checkpoint",
            "the chat template does not render tools (it renders a conversation the same "
            f"with a tool as without), and this {unit}'s '{fmt.tool_key}' holds some (others "
            "may too): no prompt would describe them",
            "use a tokenizer whose chat template renders tools, pass one as "
            "data.apply_chat_template_kwargs.chat_template, or set data.tool_key: null to "
            "keep the tools out of the prompt",
            value=getattr(tokenizer, "name_or_path", None) or None,
            location=Location(file=path, line=first.line, unit=unit),
        )
    ]


def _tokenize(rows: list[Row], texts: list[str], tokenizer: ChatTokenizer) -> list[PromptRecord]:
    if not texts:
        return []
    # The template already wrote any BOS and role markers: add nothing on top.
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [
        PromptRecord(row.line, row.prompt, tuple(token_ids), row.label, row.metadata)
        for row, token_ids in zip(rows, ids, strict=True)
    ]


def _more_lines(count: int, path: str, unit: str) -> list[Issue]:
    if count <= 0:
        return []
    fix = f"fix the {unit}s above, then run again to see the rest"
    where = Location(file=path)
    return [Issue(f"more {unit}s", f"{count} more bad {unit}s not shown", fix, location=where)]


def _short(value: Any, limit: int = 80) -> str:
    # default=str: a parquet row's values may be bytes, dates, decimals
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def render_prompt_ids(
    prompt: Prompt, fmt: PromptFormat, tokenizer: ChatTokenizer, tools: Tools | None = None
) -> list[int]:
    """One prompt's token ids, rendered as a prompt file's lines are (data sources' groups),
    with `tools` written into it by the chat template."""
    try:
        text = _render(prompt, fmt, tokenizer, tools)
        if tools and _template_ignores_tools(tokenizer, fmt.chat_template_kwargs):
            raise LineError(
                "tools",
                "the chat template does not render tools (it renders a conversation the same "
                "with a tool as without): the prompt would not describe them",
                "use a tokenizer whose chat template renders tools, or pass one as "
                "data.apply_chat_template_kwargs.chat_template",
                _short(tools),
            )
    except LineError as exc:
        raise ValueError(f"prompt {_short(prompt)}: {exc.message}; fix: {exc.fix}") from None
    return list(tokenizer([text], add_special_tokens=False)["input_ids"][0])
