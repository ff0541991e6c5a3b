"""A sweep whose first job's run fails runs its next job, lists the failure in its summary
and exits with the failed run's status."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlpost.runtime.launches import read_launches

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "rlpost" / "assets" / "qwen3-tiny"


def test_a_failed_job_does_not_end_the_sweep(tmp_path: Path) -> None:
    # a checkpoint whose tokenizer file is damaged: validation reads the model's config, the
    # run fails when it loads the tokenizer (RunFailed, exit status 3), after Ray has started
    damaged = tmp_path / "damaged"
    shutil.copytree(TINY, damaged)
    (damaged / "tokenizer.json").write_text("{")
    sweep_dir = tmp_path / "sweep"
    done = subprocess.run(
        [
            sys.executable, str(REPO / "launch.py"), "-m",
            f"model.hf_checkpoint={damaged},{TINY}", "recipe.rollout.num_rollout=1",
            # the second job's one rollout is all it needs: no evaluations (two of 128
            # prompts, before and after it) and no TensorBoard
            "recipe.eval.interval=null", "recipe.eval.datasets=[]", "tracking.tensorboard=false",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr[-3000:]
    assert "rlpost: the run failed: JSONDecodeError" in done.stderr
    assert "Traceback" not in done.stderr
    jobs = json.loads((sweep_dir / "summary.json").read_text())
    assert [(j["job"], j["status"], j["rollouts"]) for j in jobs] == [
        (0, "failed", 0), (1, "completed", 1)
    ]  # fmt: skip
    assert jobs[0]["reason"].startswith("JSONDecodeError")
    assert jobs[0]["logs"] == str(sweep_dir / "0" / "logs" / "failures.log")
    assert (sweep_dir / "1" / "metrics.jsonl").is_file()
    # the failure while the run started is the first job's launch's end
    (failure,) = read_launches(sweep_dir / "0")
    assert failure.end is not None and failure.end["what"].startswith("JSONDecodeError")
    assert (failure.end["outcome"], failure.end["exit_status"]) == ("failed", 3)
    assert [x.end["outcome"] for x in read_launches(sweep_dir / "1") if x.end] == ["finished"]
    assert "job 0 failed: JSONDecodeError" in done.stdout
