"""The config commands stay light: none imports torch, ray, transformers, megatron, sglang or
numpy. Runs in a fresh interpreter (this test process may already hold them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = ("torch", "ray", "transformers", "megatron", "sglang", "numpy")

SCRIPT = """
import contextlib, io, json, sys, tempfile
from rlpost.cli.main import main

examples, fixture, out = sys.argv[1], sys.argv[2], tempfile.mkdtemp()
commands = [
    ["ls", "--config-dir", examples],
    ["validate", "--no-local-checks", examples + "/qwen3_8b_a100x4.yaml"],
    ["validate", "model=glm4.7-flash", "recipe=grpo_dapo", "hardware=h100x8",
     "mode=slime_args"],
    ["show", "--config-dir", examples, "model=qwen3-8b", "recipe=my_grpo", "hardware=a100x4"],
    ["new", "model", "--from-hf", fixture, "--name", "my_deepseek", "--config-dir", out],
    ["new", "recipe", "mine", "--from", "grpo_dapo", "optim.lr=3e-6", "--config-dir", out],
    ["validate", "--no-local-checks", "--config-dir", out, "model=my_deepseek", "recipe=mine",
     "hardware=cpu", "plan.memory_check=warn"],
]
run = out + "/run"  # a run directory, as a launch that was killed leaves it
__import__("os").makedirs(run)
open(run + "/launches.jsonl", "w").write('{"start_rollout": 0}\\n')
commands.append(["status", run])
for argv in commands:
    with contextlib.redirect_stdout(io.StringIO()):
        main(argv)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in FORBIDDEN)))
"""


def test_config_commands_import_no_framework() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    script = f"FORBIDDEN = {FORBIDDEN!r}\n{SCRIPT}"
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            str(REPO / "examples" / "my_configs"),
            str(REPO / "tests" / "fixtures" / "hf_configs" / "deepseek-v3"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
