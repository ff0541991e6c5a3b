"""A prompt file's path as slime writes it: a jsonl or parquet file, optionally followed by a
row slice, `train.parquet@[0:1000]` (Python's slice of the file's rows: either bound may be
negative or left out, `@[-100:]` is the last 100 rows; no step).

Used by recipe.data.prompt_data and recipe.eval.datasets[].path; read by rlpost.data.files.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import AfterValidator

from rlpost.schema.base import InvariantError, expand_home

SUFFIXES = {".jsonl": "jsonl", ".parquet": "parquet"}
FORMS = "a .jsonl or .parquet file, optionally with a row slice: /data/train.parquet@[0:1000]"
_SLICE = re.compile(r"^(?P<path>.*)@\[(?P<start>-?\d*):(?P<stop>-?\d*)\]$")
_SLICE_LIKE = re.compile(r"^(?P<path>.*)@\[(?P<inside>[^\[\]]*)\]$")

FileKind = Literal["jsonl", "parquet"]


@dataclass(frozen=True)
class PromptFile:
    """A prompt path split: the file, and the rows it selects (None: every row)."""

    path: str
    rows: slice | None = None

    @property
    def kind(self) -> FileKind:
        return "parquet" if self.path.endswith(".parquet") else "jsonl"

    @property
    def unit(self) -> str:
        """What the file's records are called in messages: a jsonl line, a parquet row."""
        return "row" if self.kind == "parquet" else "line"

    @property
    def slice_text(self) -> str:
        if self.rows is None:
            return ""
        start, stop = self.rows.start, self.rows.stop
        return f"@[{'' if start is None else start}:{'' if stop is None else stop}]"


def split_prompt_path(text: str) -> PromptFile:
    """The file and row slice of a prompt path, as slime's reader splits them; a path with no
    slice is the file itself (a malformed slice is the schema's to refuse)."""
    match = _SLICE.match(text)
    if match is None:
        return PromptFile(text)
    start, stop = match["start"], match["stop"]
    return PromptFile(
        match["path"], slice(int(start) if start else None, int(stop) if stop else None)
    )


def selects_none(rows: slice) -> bool:
    """True when the slice selects no row of any file, as its bounds alone say (`@[5:5]`,
    `@[-2:-5]`, `@[:0]`); one that selects none of a given file's rows is the preflight's."""
    start: int | None = rows.start
    stop: int | None = rows.stop
    if stop == 0:
        return True
    if start is None or stop is None or (start < 0) != (stop < 0):
        return False
    return stop <= start


def check_prompt_path(text: str) -> str:
    """A prompt path slime's reader takes: a .jsonl or .parquet file, a well-formed row slice
    that can select a row."""
    if _SLICE.match(text) is None and (bad := _SLICE_LIKE.match(text)) is not None:
        raise InvariantError(
            f"the row slice @[{bad['inside']}] is not START:END with whole numbers",
            fields=(),
            fix=f"write {bad['path']}@[START:END], e.g. @[0:1000] (the first 1000 rows) or "
            "@[-100:] (the last 100); either bound may be left out, no step",
        )
    prompt = split_prompt_path(text)
    suffix = os.path.splitext(prompt.path)[1]
    if suffix not in SUFFIXES:
        what = (
            f"the suffix {suffix!r}"
            if suffix
            else "no suffix (a folder, or a file named without one)"
        )
        raise InvariantError(
            f"{prompt.path} has {what}; prompt files are read as jsonl (.jsonl) or parquet "
            "(.parquet), by the suffix",
            fields=(),
            fix=f"give {FORMS}"
            + (
                ""
                if suffix
                else "; a folder written by HF datasets' save_to_disk converts with "
                "datasets.load_from_disk(FOLDER).to_parquet('train.parquet')"
            ),
        )
    if prompt.rows is not None and selects_none(prompt.rows):
        raise InvariantError(
            f"the row slice {prompt.slice_text} selects no row (its end is not past its start)",
            fields=(),
            fix="write an end past the start, e.g. @[0:1000], or remove the slice to read "
            "every row",
        )
    return text


PromptPath = Annotated[str, AfterValidator(expand_home), AfterValidator(check_prompt_path)]
"""A prompt file (a LocalPath: `~` expanded) with an optional row slice (`check_prompt_path`)."""
