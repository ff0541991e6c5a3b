"""What a slime launch script started, read from the commands its evaluation recorded.

The train command is the one whose words name slime's `train.py` or `train_async.py`, run
directly (`python3 train.py ...`) or through Ray (`ray job submit ... -- python3 train.py ...`);
its arguments are what follow the entry point, after bash expanded them. Around it: the job's
environment (the `--runtime-env-json` env_vars, or the exported variables of a direct run), the
Ray head's GPUs (`ray start --head --num-gpus N`) and the worker starts of a multi-node block.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from rlpost.interop.shell import EVALUATION_ENV, Command, Evaluation

ENTRY_POINTS = ("train.py", "train_async.py")
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD")
"""Environment variables whose names hold these are never copied, only named."""


@dataclass(frozen=True)
class Launch:
    script: Path
    entry: str | None  # train.py or train_async.py; None when the script runs neither
    argv: tuple[str, ...]  # the entry point's arguments
    env: dict[str, str]  # the job's environment (secrets left out)
    head_gpus: int | None  # `ray start --head --num-gpus N`
    workers: tuple[str, ...]  # the commands that start Ray on other nodes
    sourced: tuple[str, ...]  # files the script read, in order
    not_run: tuple[str, ...]  # every other command, as bash would have run it
    exit_status: int | None
    echoed: tuple[str, ...]
    cut_after: str | None = None  # a flag that starts the next command: a missing `\`


def is_secret(name: str) -> bool:
    return any(marker in name.upper() for marker in SECRET_MARKERS)


def _entry_index(words: tuple[str, ...]) -> int | None:
    for i, word in enumerate(words):
        if Path(word).name in ENTRY_POINTS:
            return i
    return None


def _runtime_env(words: tuple[str, ...]) -> dict[str, str] | None:
    """`--runtime-env-json JSON` / `--runtime-env-json=JSON` before the entry point."""
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        if name != "--runtime-env-json":
            continue
        text = value if eq else (words[i + 1] if i + 1 < len(words) else "")
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            return None
        env = data.get("env_vars", {}) if isinstance(data, dict) else {}
        return {str(k): str(v) for k, v in env.items()}
    return None


def _head_gpus(words: tuple[str, ...]) -> int | None:
    if words[:2] != ("ray", "start") or "--head" not in words:
        return None
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        if name == "--num-gpus":
            text = value if eq else (words[i + 1] if i + 1 < len(words) else "")
            return int(text) if text.isdigit() else None
    return None


def _text(command: Command) -> str:
    if command.kind in ("path", "write"):
        return f"{command.words[0]} ({'named by path' if command.kind == 'path' else 'a write'})"
    return shlex.join(command.words)


def _redacted(text: str, secrets: set[str]) -> str:
    for secret in secrets:
        if len(secret) >= 4:
            text = text.replace(secret, "<secret>")
    return text


def read_launch(evaluation: Evaluation) -> Launch:
    entry: str | None = None
    argv: tuple[str, ...] = ()
    env: dict[str, str] = {}
    head_gpus: int | None = None
    workers: list[str] = []
    sourced: list[str] = []
    not_run: list[str] = []
    cut_after: str | None = None
    just_after = False
    for command in evaluation.commands:
        if command.kind == "source":
            sourced.append(command.words[0])
            continue
        at = _entry_index(command.words) if command.kind == "run" else None
        if at is not None and entry is None:
            entry, argv = Path(command.words[at]).name, command.words[at + 1 :]
            runtime = _runtime_env(command.words[:at])
            if runtime is None:  # a direct run: the job gets the exported environment
                runtime = {k: v for k, v in (command.env or {}).items() if k not in EVALUATION_ENV}
            env = runtime
            just_after = True
            continue
        if just_after and command.kind == "run" and command.words[0].startswith("--"):
            cut_after = command.words[0]
        just_after = False
        head_gpus = head_gpus or _head_gpus(command.words)
        text = _text(command)
        if "ray start" in text and "--address" in text:
            workers.append(text)
        not_run.append(text)
    secrets = {v for c in evaluation.commands for k, v in (c.env or {}).items() if is_secret(k)}
    not_run = [_redacted(text, secrets) for text in not_run]
    return Launch(
        script=evaluation.script,
        entry=entry,
        argv=argv,
        env={k: v for k, v in env.items() if not is_secret(k)},
        head_gpus=head_gpus,
        workers=tuple(workers),
        sourced=tuple(sourced),
        not_run=tuple(not_run),
        exit_status=evaluation.exit_status,
        echoed=evaluation.echoed,
        cut_after=cut_after,
    )
