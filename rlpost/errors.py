"""User-facing errors: where, what, why and the fix, rendered without a traceback."""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from rlpost.streams import guard_std_streams

EXIT_USER_ERROR = 2
# an exception nothing in rlpost expected before a run started: most likely a bug of rlpost's
EXIT_INTERNAL_ERROR = 4


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


def exit_with_internal_error(exc: Exception, command: str | None = None) -> NoReturn:
    """An exception nothing expected: most likely a defect of rlpost's, not the user's. Its
    traceback once, then one line saying what it is, and exit status EXIT_INTERNAL_ERROR:
    distinct from a refusal (2), from a run that failed (3) and from the status 1 of any
    Python crash. Without `command` it is the launcher's, before the run started (composing,
    validating, planning, the preflight; Hydra's report would wrap it in its own frames and a
    note about HYDRA_FULL_ERROR); with it, that command's (`rlpost show`, `export_hf`)."""
    import traceback

    guard_std_streams()
    traceback.print_exception(exc, file=sys.stderr)
    if command is None:
        head = "rlpost: internal error before the run started"
        tail = "not a problem with the config; nothing was started"
    else:
        head = f"{command}: internal error"
        tail = "not a problem with the config or the command line"
    print(
        f"{head}: {type(exc).__name__}: {exc}\n"
        f"  rlpost did not expect it: most likely a bug in rlpost, {tail}. The traceback "
        "above says where: please report it with the command line.",
        file=sys.stderr,
        flush=True,
    )
    raise SystemExit(EXIT_INTERNAL_ERROR)


def run_command(command: str, main: Callable[[], int | None]) -> None:
    """Run a command's `main` and exit with its status where it is not 0: the way every
    rlpost command and tool ends. A refusal that reaches here exits 2 (exit_with); any
    other exception is a defect of rlpost's (exit_with_internal_error, 4), never Python's
    raw traceback and status 1. SystemExit (argparse, a refusal already printed) and Ctrl-C
    pass through as they are. Its output outlives its reader (`... | head`: rlpost.streams),
    so a reader that leaves early is no error of the command's."""
    guard_std_streams()
    try:
        status = main()
    except UserError as exc:
        exit_with(exc)
    except Exception as exc:
        exit_with_internal_error(exc, command)
    if status:
        raise SystemExit(status)
