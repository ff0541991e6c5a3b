"""A prompt file's rows, read as slime reads them: a jsonl file line by line (blank lines
skipped), a parquet file batch by batch with each row a dict (its struct and map columns dicts
too), then the path's row slice (`train.parquet@[0:1000]`, rlpost.schema.prompt_file) applied
to the rows in file order.

The training data and the evaluation sets, the loader and the preflight all read through
`prompt_rows`. pyarrow is imported only where a parquet file is read: planning never needs it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from rlpost.schema.prompt_file import PromptFile, split_prompt_path

RawRow = str | dict[str, Any]
"""A jsonl line as written (its JSON is the row reader's to parse), or a parquet row."""


class UnreadableFile(Exception):
    """A prompt file that cannot be opened or decoded; the message says why."""


def prompt_rows(path: str | PromptFile) -> Iterator[tuple[int, RawRow]]:
    """(number, row) for every row the path selects: the number is the 1-based line of a
    jsonl file (blank lines counted, so an editor finds it) or row of a parquet file."""
    prompt = split_prompt_path(path) if isinstance(path, str) else path
    rows = _parquet_rows(prompt.path) if prompt.kind == "parquet" else _jsonl_rows(prompt.path)
    selected = prompt.rows
    if selected is None:
        yield from rows
        return
    start, stop = selected.start, selected.stop
    if (start or 0) < 0 or (stop or 0) < 0:  # a bound counted from the end: needs the count
        if prompt.kind == "parquet":
            start, stop, _ = selected.indices(row_count(prompt))
        else:
            yield from list(rows)[selected]
            return
    yield from itertools.islice(rows, start, stop)


def row_count(path: str | PromptFile) -> int:
    """How many rows the file holds, whatever slice the path has."""
    prompt = split_prompt_path(path) if isinstance(path, str) else path
    if prompt.kind == "parquet":
        return int(_parquet_file(prompt.path).metadata.num_rows)
    return sum(1 for _ in _jsonl_rows(prompt.path))


def _jsonl_rows(path: str) -> Iterator[tuple[int, RawRow]]:
    try:
        with open(path, encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if line.strip():
                    yield number, line
    except OSError as exc:
        raise UnreadableFile(f"cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UnreadableFile(f"is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _parquet_file(path: str) -> Any:
    import pyarrow as pa  # only where a parquet file is read
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except OSError as exc:
        raise UnreadableFile(f"cannot be read: {exc.strerror or exc}") from None
    except pa.ArrowException as exc:
        raise UnreadableFile(f"is not a parquet file pyarrow can read ({exc})") from None


def _parquet_rows(path: str) -> Iterator[tuple[int, RawRow]]:
    import pyarrow as pa

    number = 0
    try:
        for batch in _parquet_file(path).iter_batches():
            # a map column (Spark writes dicts as maps) reads as an object, as a struct column
            # does: a dotted key reads into both, as into a jsonl line's nested object
            for row in batch.to_pylist(maps_as_pydicts="strict"):
                number += 1
                yield number, row
    except pa.ArrowException as exc:
        raise UnreadableFile(f"cannot be read past row {number} ({exc})") from None
    except KeyError as exc:  # a map value that holds one key twice: no object holds it
        raise UnreadableFile(
            f"cannot be read past row {number}: a map column holds a key twice ({exc.args[0]})"
        ) from None
