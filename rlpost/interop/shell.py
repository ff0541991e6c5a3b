"""A launch script evaluated by bash itself, with every command it would run recorded instead.

bash is the parser of bash: default expansions, command substitutions, conditionals, functions
and sourced files all mean what they mean to bash. What the script would do outside the shell
does not happen (stand_ins.bash): the environment is empty but for what the caller states,
PATH names an empty folder so each external command (`python3`, `ray`, `pkill`, `pip`) is
only recorded, builtins that act outside the shell (`kill`, `exec`, `ulimit`) are recorded by
functions of their name, commands named by path and writes to files are skipped by a guard,
and the evaluation runs in a temporary folder under a time limit. `nvidia-smi` answers with
the stated number of GPUs; a few text tools (`wc -l`, `grep -o`, `tr -d`, `dirname`) answer
in bash so that probes read as they would.

    evaluation = evaluate_script(Path("scripts/run-qwen3-4B.sh"), gpus_per_node=8)
    evaluation.commands      # every command, in order, with its expanded words
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rlpost.errors import Issue, UserError

STAND_INS = Path(__file__).with_name("stand_ins.bash")
DEFAULT_GPUS_PER_NODE = 8
"""What `nvidia-smi -L` lists when the caller does not say (an 8-GPU node)."""
DEFAULT_ENV = {"MASTER_ADDR": "127.0.0.1", "NODE_RANK": "0"}
"""The environment a script is evaluated in besides the caller's: the head node of its own
cluster (multi-node scripts refuse to start without MASTER_ADDR)."""
TIMEOUT_S = 20.0
SHELL_CONTROL = frozenset({"BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PATH", "IFS", "PS4"})
"""Variables that change how bash itself starts or finds commands: never taken from the
caller (BASH_ENV would run a file before the stand-ins are in place)."""


@dataclass(frozen=True)
class Command:
    """One command the script ran: `run` (recorded instead of run), `path` (named by path,
    skipped), `write` (a redirection into a file, skipped; these two keep the command's
    text) or `source` (a file read, the path it was read from)."""

    kind: str  # run | path | write | source
    words: tuple[str, ...]
    env: Mapping[str, str] | None = None  # the exported environment, beside a train command


@dataclass(frozen=True)
class Evaluation:
    script: Path
    commands: tuple[Command, ...]
    exit_status: int | None  # None: the evaluation ended without reaching the end
    stderr: str = ""
    echoed: tuple[str, ...] = field(default_factory=tuple)


def evaluate_script(
    path: Path,
    *,
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
    env: Mapping[str, str] | None = None,
    source_dirs: tuple[Path, ...] = (),
    sources: Mapping[str, str] | None = None,
    timeout_s: float = TIMEOUT_S,
) -> Evaluation:
    """Run the script in bash with the stand-ins. A file that a `source` names and that is not
    where the script looks is read by name from `source_dirs`, else from `sources` (name ->
    text)."""
    bash = shutil.which("bash") or "/bin/bash"
    with tempfile.TemporaryDirectory(prefix="rlpost-shell-") as tmp:
        work = Path(tmp)
        (work / "bin").mkdir()
        record = work / "record"
        record.mkdir()
        (work / "sources").mkdir()
        for name, text in (sources or {}).items():
            (work / "sources" / name).write_text(text)
        given = {k: v for k, v in (env or {}).items() if k not in SHELL_CONTROL}
        environment = {
            **DEFAULT_ENV,
            **given,
            "PATH": str(work / "bin"),
            "HOME": str(work),
            "TMPDIR": str(work),
            "RLPOST_RECORD": str(record),
            "RLPOST_GPUS_PER_NODE": str(gpus_per_node),
            "RLPOST_SOURCE_DIRS": " ".join(
                str(d.resolve()) for d in (*source_dirs, work / "sources")
            ),
        }
        prelude = (
            f"builtin source {_quote(STAND_INS)}; "
            "builtin trap '__rlpost_done $?' EXIT; "
            "shopt -s extdebug; builtin set -T; builtin trap __rlpost_guard DEBUG; "
            'builtin source "$0"'
        )
        try:
            done = subprocess.run(
                [bash, "--noprofile", "--norc", "-c", prelude, str(path.resolve())],
                cwd=work,
                env=environment,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise UserError(
                [
                    Issue(
                        "SCRIPT",
                        f"{path} did not finish within {timeout_s:.0f} s with its commands "
                        "recorded instead of run (a loop that waits for something?)",
                        "give the script without the wait, or the train command alone",
                        str(path),
                    )
                ],
                title="import error",
            ) from exc
        commands, status = _read_record(record)
    return Evaluation(path, tuple(commands), status, done.stderr, tuple(done.stdout.splitlines()))


def _quote(path: Path) -> str:
    return "'" + str(path).replace("'", "'\\''") + "'"


def _read_record(folder: Path) -> tuple[list[Command], int | None]:
    """The records in the order they were made (time, then process, then count)."""
    commands: list[Command] = []
    status: int | None = None
    names = sorted(folder.iterdir(), key=lambda p: tuple(int(n) for n in p.name.split(".")))
    for path in names:
        kind, *words = path.read_bytes().decode("utf-8", "replace").split("\0")[:-1]
        if kind == "train":
            count = int(words[0])
            env = dict(w.split("=", 1) for w in words[1 + count :] if "=" in w)
            commands.append(Command("run", tuple(words[1 : 1 + count]), env))
        elif kind == "exit":
            status = int(words[0]) if words else None
        else:
            commands.append(Command(kind, tuple(words)))
    return commands, status


EVALUATION_ENV = frozenset({"HOME", "TMPDIR", *DEFAULT_ENV})
"""Variables the evaluation itself sets (not the script's)."""
