"""tools/convert_megatron_to_hf.py refuses a --load that is no torch_dist checkpoint with the
argument, the folder and what to give instead, before megatron-core reads it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
TOOL = REPO / "tools" / "convert_megatron_to_hf.py"
TINY = REPO / "rlpost" / "assets" / "qwen3-tiny"


def run_tool(load: Path, out: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(TOOL), "model=qwen3-tiny", "--load", str(load)]
    return subprocess.run(
        [*command, "--out", str(out)], capture_output=True, text=True, timeout=300
    )


def make_load(kind: str, tmp_path: Path) -> Path:
    if kind == "missing":
        return tmp_path / "iter_0000100"
    if kind == "hf folder":
        return TINY
    checkpoint = tmp_path / "run" / "ckpt" / "rollout_4"  # an rlpost run's checkpoint
    (checkpoint / "trainer").mkdir(parents=True)
    (checkpoint / "manifest.json").write_text(json.dumps({"format": 1}))
    return checkpoint


@pytest.mark.parametrize(
    ("kind", "said", "fix"),
    [
        ("missing", "no such folder", "convert_hf_to_megatron.py --save"),
        ("hf folder", "is an HF folder already", "use it as it is"),
        ("run checkpoint", "an rlpost run's checkpoint", "tools/export_hf.py"),
    ],
)
def test_a_load_that_is_no_torch_dist_checkpoint_is_refused(
    kind: str, said: str, fix: str, tmp_path: Path
) -> None:
    load = make_load(kind, tmp_path)
    result = run_tool(load, tmp_path / "out")
    assert result.returncode == 2, result.stderr
    assert f"--load = '{load}'" in result.stderr and said in result.stderr
    assert fix in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()
