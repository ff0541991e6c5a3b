"""User-facing errors: where, what, why and the fix, rendered without a traceback."""

from __future__ import annotations

import difflib
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from rlpost.streams import guard_std_streams

EXIT_USER_ERROR = 2


@dataclass(frozen=True)
class Location:
    """Where a value came from: a YAML file and line, or the command line."""

    file: str | None = None
    line: int | None = None
    override: str | None = None
    unit: str = "line"  # what `line` counts: a parquet file's are rows

    def __str__(self) -> str:
        if self.override is not None:
            return f"command line: {self.override}"
        if self.file is None:
            return "default"
        if not self.line:
            return self.file
        return (
            f"{self.file}:{self.line}" if self.unit == "line" else f"{self.file}, row {self.line}"
        )


@dataclass(frozen=True)
class Issue:
    """One problem with a user's input."""

    key: str
    message: str
    fix: str
    value: Any = None
    location: Location | None = None

    def render(self) -> str:
        head = self.key if self.value is None else f"{self.key} = {self.value!r}"
        where = f"   ({self.location})" if self.location else ""
        return f"  {head}{where}\n    {self.message}\n    fix: {self.fix}"


class UserError(Exception):
    """Bad input from a user: config, data or paths. Exits 2 with no traceback."""

    def __init__(
        self, issues: Sequence[Issue], title: str = "configuration error", note: str = ""
    ) -> None:
        self.issues = list(issues)
        self.title = title
        self.note = note
        super().__init__(self.render())

    def render(self) -> str:
        count = len(self.issues)
        plural = "s" if count > 1 else ""
        body = "\n\n".join(issue.render() for issue in self.issues)
        note = f"\n\n{self.note}" if self.note else ""
        return f"rlpost: {count} {self.title}{plural}\n\n{body}{note}"


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """A ' Did you mean ...?' suffix, or '' when nothing is close."""
    matches = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" Did you mean '{matches[0]}'?" if matches else ""


def exit_with(error: UserError) -> NoReturn:
    """Print the refusal and exit 2. A reader that closed the pipe early (`... 2>&1 | head`)
    does not change the status: the refusal stands whether or not all of it was read
    (rlpost.streams)."""
    guard_std_streams()
    print(error.render(), file=sys.stderr, flush=True)
    raise SystemExit(EXIT_USER_ERROR)
