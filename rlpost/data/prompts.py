"""Prompts from a jsonl file: checked line by line, rendered with the chat template, tokenized.

Each line is a JSON object. The input key holds a string or a chat message list
(`[{"role": "user", "content": "..."}]`, as in dapo-math-17k); the label key a string or a
number; the metadata key, when present, an object. Bad lines are all reported at once, with
file and line number.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rlpost.errors import Issue, Location, UserError
from rlpost.types import Prompt

logger = logging.getLogger(__name__)

MAX_REPORTED_LINES = 10
ONE_OBJECT = "make every line one JSON object"


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
    """One usable prompt; `line` is its 1-based line in the file."""

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
    apply_chat_template: bool
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


def load_prompts(
    path: str | Path,
    fmt: PromptFormat,
    tokenizer: ChatTokenizer,
    max_prompt_len: int | None = None,
) -> tuple[list[PromptRecord], int]:
    """The file's prompts and how many `max_prompt_len` dropped; PromptDataError if bad."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise PromptDataError(
            [
                Issue(
                    "prompt file",
                    f"cannot be read: {exc.strerror or exc}",
                    "check the path (data.prompt_data, or the eval dataset's path)",
                    value=str(path),
                )
            ]
        ) from None
    rows: list[tuple[int, Prompt, str | None, dict[str, Any]]] = []
    texts: list[str] = []
    issues: list[Issue] = []
    bad_lines = 0
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = Location(file=str(path), line=number)
        try:
            prompt, label, metadata = _parse_line(line, fmt)
            texts.append(_render(prompt, fmt, tokenizer))
        except _LineError as exc:
            bad_lines += 1
            if len(issues) < MAX_REPORTED_LINES:
                issues.append(Issue(exc.key, exc.message, exc.fix, value=exc.value, location=where))
            continue
        rows.append((number, prompt, label, metadata))
    if bad_lines:
        raise PromptDataError(issues + _more_lines(bad_lines - len(issues), path))
    records = _tokenize(rows, texts, tokenizer)
    kept = [r for r in records if max_prompt_len is None or len(r.prompt_ids) <= max_prompt_len]
    dropped = len(records) - len(kept)
    if dropped:
        logger.info(
            "%s: dropped %d of %d prompts over max_prompt_len=%s tokens",
            path,
            dropped,
            len(records),
            max_prompt_len,
        )
    if not kept:
        why = f"all {len(records)} prompts exceed max_prompt_len" if records else "no prompts"
        fix = "use another file, or raise max_prompt_len"
        raise PromptDataError([Issue("prompt file", f"has {why}", fix, value=str(path))])
    return kept, dropped


class _LineError(Exception):
    def __init__(self, key: str, message: str, fix: str, value: Any = None) -> None:
        super().__init__(message)
        self.key, self.message, self.fix, self.value = key, message, fix, value


def _parse_line(line: str, fmt: PromptFormat) -> tuple[Prompt, str | None, dict[str, Any]]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise _LineError(
            "line",
            f"is not valid JSON ({exc.msg}, column {exc.colno})",
            ONE_OBJECT,
            _short(line),
        ) from None
    if not isinstance(row, dict):
        kind = type(row).__name__
        raise _LineError("line", f"is a JSON {kind}, not an object", ONE_OBJECT, _short(row))
    prompt = _field(row, fmt.input_key, "data.input_key")
    _check_prompt(fmt.input_key, prompt)
    label = None
    if fmt.label_key is not None:
        raw = _field(row, fmt.label_key, "data.label_key")
        if isinstance(raw, bool) or not isinstance(raw, str | int | float):
            raise _LineError(
                fmt.label_key,
                f"is of type {type(raw).__name__}; a label must be a string or a number",
                "store the reference answer as a string",
                _short(raw),
            )
        label = str(raw)
    metadata = row.get(fmt.metadata_key)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise _LineError(
            fmt.metadata_key,
            f"is of type {type(metadata).__name__}; metadata must be a JSON object",
            "store metadata as an object, or point data.metadata_key at another field",
            _short(metadata),
        )
    return prompt, label, metadata


def _field(row: dict[str, Any], key: str, config_key: str) -> Any:
    if key not in row:
        present = ", ".join(sorted(row)) or "none"
        raise _LineError(
            key,
            f"is missing (this line's keys: {present})",
            f"add '{key}' to every line, or set {config_key} to the field that holds it",
        )
    return row[key]


def _check_prompt(key: str, prompt: Any) -> None:
    if isinstance(prompt, str):
        if not prompt.strip():
            raise _LineError(key, "is an empty string", "give every line a prompt", prompt)
        return
    fix = 'use a string or a message list [{"role": "user", "content": "..."}]'
    if not isinstance(prompt, list) or not prompt:
        raise _LineError(
            key, f"is of type {type(prompt).__name__}, not a prompt", fix, _short(prompt)
        )
    for position, message in enumerate(prompt):
        ok = isinstance(message, dict) and isinstance(message.get("role"), str)
        if not ok or "content" not in message:
            raise _LineError(
                key,
                f"message {position} is not an object with 'role' and 'content'",
                fix,
                _short(message),
            )


def _render(prompt: Prompt, fmt: PromptFormat, tokenizer: ChatTokenizer) -> str:
    if not fmt.apply_chat_template:
        if not isinstance(prompt, str):
            raise _LineError(
                fmt.input_key,
                "is a message list, which needs the chat template to become text",
                "set data.apply_chat_template: true",
                _short(prompt),
            )
        return prompt
    marker = _already_templated(prompt, tokenizer)
    if marker is not None:
        raise _LineError(
            fmt.input_key,
            f"already holds the chat template's marker {marker!r}: the template would wrap "
            "the rendered conversation in a second one",
            "store the question itself (or a message list), or set "
            "data.apply_chat_template: false to send prompts as written",
            _short(prompt),
        )
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    try:
        text = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **fmt.chat_template_kwargs
        )
    except Exception as exc:  # jinja raises anything a template author chose
        raise _LineError(
            fmt.input_key,
            f"the tokenizer's chat template failed on it: {type(exc).__name__}: {exc}",
            "fix the messages (roles, order) or data.apply_chat_template_kwargs",
            _short(prompt),
        ) from None
    if not isinstance(text, str):
        raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}")
    return text


_MARKERS: dict[int, tuple[ChatTokenizer, tuple[str, ...]]] = {}


def _template_markers(tokenizer: ChatTokenizer) -> tuple[str, ...]:
    """The special tokens the chat template writes around a message (ChatML's <|im_start|>
    and <|im_end|>, Llama 3's headers): text that holds one was rendered already."""
    cached = _MARKERS.get(id(tokenizer))
    if cached is not None and cached[0] is tokenizer:
        return cached[1]
    special = getattr(tokenizer, "all_special_tokens", None) or []
    try:
        probe = tokenizer.apply_chat_template(
            [{"role": "user", "content": "x"}], add_generation_prompt=True, tokenize=False
        )
    except Exception:  # a template that needs more than one user message: nothing to learn
        probe = ""
    markers = tuple(t for t in special if isinstance(probe, str) and t and t in probe)
    _MARKERS[id(tokenizer)] = (tokenizer, markers)
    return markers


def _already_templated(prompt: Prompt, tokenizer: ChatTokenizer) -> str | None:
    """The first chat marker a prompt's text holds, None when it holds none."""
    if isinstance(prompt, str):
        texts = [prompt]
    else:
        texts = [m["content"] for m in prompt if isinstance(m.get("content"), str)]
    if not any("<" in t or "[" in t for t in texts):  # every chat marker known is bracketed
        return None
    return next((m for m in _template_markers(tokenizer) for t in texts if m in t), None)


def _tokenize(
    rows: list[tuple[int, Prompt, str | None, dict[str, Any]]],
    texts: list[str],
    tokenizer: ChatTokenizer,
) -> list[PromptRecord]:
    if not texts:
        return []
    # The template already wrote any BOS and role markers: add nothing on top.
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [
        PromptRecord(line, prompt, tuple(token_ids), label, metadata)
        for (line, prompt, label, metadata), token_ids in zip(rows, ids, strict=True)
    ]


def _more_lines(count: int, path: Path) -> list[Issue]:
    if count <= 0:
        return []
    fix = "fix the lines above, then run again to see the rest"
    where = Location(file=str(path))
    return [Issue("more lines", f"{count} more bad lines not shown", fix, location=where)]


def _short(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def render_prompt_ids(prompt: Prompt, fmt: PromptFormat, tokenizer: ChatTokenizer) -> list[int]:
    """One prompt's token ids, rendered as a prompt file's lines are (data sources' groups)."""
    try:
        text = _render(prompt, fmt, tokenizer)
    except _LineError as exc:
        raise ValueError(f"prompt {_short(prompt)}: {exc.message}; fix: {exc.fix}") from None
    return list(tokenizer([text], add_special_tokens=False)["input_ids"][0])
