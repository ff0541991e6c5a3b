"""The run directory's lock, and what a refused launch leaves of it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rlpost.runtime.rundir import LOCK_FILE, discard_unused, lock_run_dir


def test_a_claimed_folder_that_holds_only_its_lock_is_discarded(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "12-00-00"
    assert lock_run_dir(run_dir) is not None
    assert discard_unused(run_dir)
    assert not run_dir.exists() and (tmp_path / "runs").is_dir()
    assert lock_run_dir(run_dir) is not None  # free again: the same launch may claim it
    assert discard_unused(run_dir)


def test_an_empty_folder_goes_and_one_with_anything_else_stays(tmp_path: Path) -> None:
    empty, used = tmp_path / "empty", tmp_path / "used"
    empty.mkdir()
    assert lock_run_dir(used) is not None
    (used / "config.yaml").write_text("x: 1\n")
    assert discard_unused(empty) and not empty.exists()
    assert not discard_unused(used)
    assert (used / LOCK_FILE).is_file() and lock_run_dir(used) is not None  # still held
    assert not discard_unused(tmp_path / "missing")


def test_a_lock_another_process_holds_keeps_the_folder(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable, "-c",
            "import sys, time; from pathlib import Path; "
            "from rlpost.runtime.rundir import lock_run_dir; "
            "lock_run_dir(Path(sys.argv[1])); print('held', flush=True); time.sleep(60)",
            str(run_dir),
        ],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert not discard_unused(run_dir)
        assert (run_dir / LOCK_FILE).is_file()
    finally:
        holder.kill()
        holder.wait()
