"""A launch script evaluated by bash runs nothing outside the shell, and means what bash means."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlpost.errors import UserError
from rlpost.interop.shell import evaluate_script
from rlpost.interop.slime_launch import read_launch


def run(tmp_path: Path, text: str, **kwargs: object) -> list[tuple[str, ...]]:
    script = tmp_path / "run.sh"
    script.write_text(text)
    return [c.words for c in evaluate_script(script, **kwargs).commands]  # type: ignore[arg-type]


def test_nothing_external_runs(tmp_path: Path) -> None:
    marks = [tmp_path / f"mark{i}" for i in range(6)]
    commands = run(
        tmp_path,
        f"""set -ex
pkill -9 python
touch {marks[0]}
/usr/bin/touch {marks[1]}
echo written > {marks[2]}
command touch {marks[3]}
builtin kill -9 $PPID
kill -9 $PPID
exec /usr/bin/touch {marks[4]}
eval "touch {marks[5]}"
$(which python3) -c 'open("{marks[0]}", "w")'
""",
    )
    assert not any(mark.exists() for mark in marks)
    assert ("pkill", "-9", "python") in commands
    assert ("touch", str(marks[0])) in commands
    # bash's parent is this test: the kill was recorded, and the test goes on
    assert ("kill", "-9", str(os.getpid())) in commands


def test_bash_is_the_parser(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.sh").write_text("MODEL_ARGS=(--num-layers $(( 2 * 18 )))\n")
    commands = run(
        tmp_path,
        """#!/bin/bash
NODES=${ACTOR_NUM_NODES:-8}
SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
source "${SCRIPT_DIR}/models/m.sh"
big() { echo "--lr 1e-6"; }
if [ "$NODES" -gt 4 ]; then MODE=multi; else MODE=single; fi
JSON="{
  \\"env_vars\\": {\\"A\\": \\"1\\"}
}"
ARGS=(--mode $MODE $(big))
for i in 1 2; do ARGS+=(--x$i); done
python3 train.py --actor-num-nodes $NODES "${MODEL_ARGS[@]}" "${ARGS[@]}" \\
   --json "$JSON"
""",
    )
    [train] = [c for c in commands if "train.py" in c]
    assert train[2:] == (
        "--actor-num-nodes", "8", "--num-layers", "36", "--mode", "multi", "--lr", "1e-6",
        "--x1", "--x2", "--json", '{\n  "env_vars": {"A": "1"}\n}',
    )  # fmt: skip


def test_probes_answer_from_the_stated_gpus(tmp_path: Path) -> None:
    text = """NVLINK=$(nvidia-smi topo -m 2>/dev/null | grep -o 'NV[0-9][0-9]*' | wc -l)
GPUS=$(nvidia-smi -L 2>/dev/null | wc -l | tr -d ' ')
if command -v nvidia-smi >/dev/null 2>&1; then SEEN=yes; fi
python3 train.py --gpus $GPUS --nvlink $([ "$NVLINK" -gt 0 ] && echo 1 || echo 0) --seen $SEEN
"""
    [train] = [c for c in run(tmp_path, text, gpus_per_node=4) if c[0] == "python3"]
    assert train[2:] == ("--gpus", "4", "--nvlink", "1", "--seen", "yes")


def test_errexit_does_not_end_the_evaluation_at_a_probe(tmp_path: Path) -> None:
    text = 'set -euo pipefail\n[ "$(nproc)" -gt 0 ]\npython3 train.py $UNSET\n'
    [train] = [c for c in run(tmp_path, text) if c[0] == "python3"]
    assert train == ("python3", "train.py")


def test_a_script_that_never_ends_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("while true; do :; done\n")
    with pytest.raises(UserError, match="did not finish within 2 s"):
        evaluate_script(script, timeout_s=2)


def test_the_job_environment_leaves_secrets_out(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text(
        "export WANDB_API_KEY=abc123secret NCCL_DEBUG=INFO\n"
        "wandb login $WANDB_API_KEY\n"
        "python3 train.py --x 1\n"
    )
    launch = read_launch(evaluate_script(script))
    assert launch.env == {"NCCL_DEBUG": "INFO"}
    assert "abc123secret" not in " ".join(launch.not_run)
    assert launch.argv == ("--x", "1")


def test_a_command_named_through_a_variable_is_not_run(tmp_path: Path) -> None:
    marks = [tmp_path / f"mark{i}" for i in range(6)]
    commands = run(
        tmp_path,
        f"""TOUCH=/usr/bin/touch
"$TOUCH" {marks[0]}
${{TOUCH}} {marks[1]}
${{NOPE:-/usr/bin/touch}} {marks[2]}
PYTHONPATH=/x:/y $TOUCH {marks[3]}
$(echo /usr/bin/touch) {marks[4]}
CMD=(/usr/bin/touch {marks[5]})
"${{CMD[@]}}"
ARGS=( --data /root/data.jsonl --out "/root/a b" )
JSON="{{ \\"a\\": \\"/b\\" }}"
python3 train.py "${{ARGS[@]}}" --json "$JSON"
""",
    )
    assert not any(mark.exists() for mark in marks)
    [train] = [c for c in commands if c[:2] == ("python3", "train.py")]
    assert train[2:] == ("--data", "/root/data.jsonl", "--out", "/root/a b", "--json",
                         '{ "a": "/b" }')  # fmt: skip


def test_variables_that_steer_bash_itself_are_not_taken(tmp_path: Path) -> None:
    mark = tmp_path / "mark"
    (tmp_path / "env.sh").write_text(f"/usr/bin/touch {mark}\n")
    commands = run(
        tmp_path,
        "python3 train.py --x $X\n",
        env={"BASH_ENV": str(tmp_path / "env.sh"), "PATH": "/usr/bin:/bin", "X": "1"},
    )
    assert not mark.exists() and ("python3", "train.py", "--x", "1") in commands
