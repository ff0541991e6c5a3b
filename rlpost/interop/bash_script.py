"""Enough of bash to read a slime launch script: what its `train.py` command is called with.

Read, in order: line continuations, comments, scalar assignments (`X=...`, `export X=...`),
arrays (`ARGS=( ... )` over several lines, `ARGS+=( ... )`), `source FILE` / `. FILE` (read
in turn, through a resolver the caller gives), and the command that runs `train.py` or
`train_async.py` (`python3 train.py ${ARGS[@]} ...`, often after `ray job submit ... --`).
Words expand `$X`, `${X}` and `${ARR[@]}` (an array splices its items); `SCRIPT_DIR` set from
`$(dirname ${BASH_SOURCE[0]})` is the script's folder. Anything else (other commands, command
substitutions, conditionals) is not run; each is reported, never guessed.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ENTRY_POINTS = ("train.py", "train_async.py")
_ASSIGN = re.compile(r"^(?:export\s+|declare\s+-a\s+|local\s+)?([A-Za-z_]\w*)(\+?)=(.*)$", re.S)
_ARRAY_REF = re.compile(r"^\$\{([A-Za-z_]\w*)\[@\]\}$")
_SCALAR_REF = re.compile(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)")

# Resolves a `source` target (as written, expanded) to the file's text, or None.
Resolver = Callable[[str], str | None]


@dataclass
class Script:
    """What a script leaves behind: its variables, arrays, and the entry point's argv."""

    path: Path
    variables: dict[str, str] = field(default_factory=dict)
    arrays: dict[str, list[str]] = field(default_factory=dict)
    entry: str | None = None
    argv: list[str] = field(default_factory=list)
    sourced: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # statements not run, with the reason


def statements(text: str) -> list[str]:
    """Logical statements: continuations joined, an array assignment kept whole."""
    lines = text.replace("\\\r\n", " ").replace("\\\n", " ").splitlines()
    out: list[str] = []
    pending: list[str] = []
    for line in lines:
        body = line.strip()
        if not pending and (not body or body.startswith("#")):
            continue
        pending.append(line)
        joined = "\n".join(pending)
        if _opens_array(joined) and not _closes_array(joined):
            continue
        out.append(joined.strip())
        pending = []
    if pending:
        out.append("\n".join(pending).strip())
    return out


def _opens_array(text: str) -> bool:
    match = _ASSIGN.match(text.strip())
    return bool(match) and match.group(3).lstrip().startswith("(")


def _closes_array(text: str) -> bool:
    """The array's closing parenthesis: the last non-comment character of some line."""
    body = _ASSIGN.match(text.strip())
    assert body is not None
    inner = body.group(3).lstrip()[1:]
    depth = 1
    try:
        lexer = shlex.shlex(inner, posix=True, punctuation_chars="()")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        for token in lexer:
            depth += token.count("(") - token.count(")")
            if depth <= 0:
                return True
    except ValueError:  # an unterminated quote: the array goes on
        return False
    return False


class _Reader:
    def __init__(self, script: Script, resolve: Resolver) -> None:
        self.script = script
        self.resolve = resolve

    def expand(self, words: list[str]) -> list[str]:
        out: list[str] = []
        for word in words:
            ref = _ARRAY_REF.match(word)
            if ref:
                out += self.script.arrays.get(ref.group(1), [])
                continue
            out.append(_SCALAR_REF.sub(self._scalar, word))
        return out

    def _scalar(self, match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name in self.script.variables:
            return self.script.variables[name]
        if name in self.script.arrays:  # $ARR is its first item in bash
            items = self.script.arrays[name]
            return items[0] if items else ""
        return match.group(0)

    def run(self, text: str) -> None:
        for statement in statements(text):
            self.statement(statement)

    def statement(self, text: str) -> None:
        assign = _ASSIGN.match(text)
        if assign and " " not in text.split("=", 1)[0].strip().split()[-1]:
            name, append, value = assign.groups()
            if value.lstrip().startswith("("):
                self.array(name, bool(append), value.lstrip()[1:].rstrip().removesuffix(")"))
                return
            if "$(" in value or "`" in value:
                if "BASH_SOURCE" in value or "dirname" in value:
                    self.script.variables[name] = str(self.script.path.parent)
                else:
                    self.script.skipped.append(f"{text}: a command substitution is not run")
                return
            words = self.expand(shlex.split(value, comments=True) or [""])
            current = self.script.variables.get(name, "") if append else ""
            self.script.variables[name] = current + " ".join(words)
            return
        try:
            words = shlex.split(text, comments=True)
        except ValueError as exc:
            self.script.skipped.append(f"{text[:60]}: {exc}")
            return
        if not words:
            return
        if words[0] in ("source", ".") and len(words) > 1:
            self.source(self.expand(words[1:2])[0])
            return
        entry = next((i for i, w in enumerate(words) if Path(w).name in ENTRY_POINTS), None)
        if entry is not None:
            self.script.entry = Path(words[entry]).name
            self.script.argv = self.expand(words[entry + 1 :])
            return
        self.script.skipped.append(f"{' '.join(words)[:80]}: not part of the train command")

    def array(self, name: str, append: bool, inner: str) -> None:
        items = self.expand(shlex.split(inner, comments=True))
        self.script.arrays[name] = (self.script.arrays.get(name, []) if append else []) + items

    def source(self, target: str) -> None:
        text = self.resolve(target)
        if text is None:
            self.script.skipped.append(f"source {target}: not found")
            return
        self.script.sourced.append(target)
        self.run(text)


def read_script(path: Path, resolve: Resolver, text: str | None = None) -> Script:
    """The script's state after running the statements this module reads."""
    script = Script(path)
    _Reader(script, resolve).run(path.read_text() if text is None else text)
    return script
