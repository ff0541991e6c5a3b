"""An installed wheel carries conf/ and the assets: `rlpost plan` works away from the source
tree (the editable install reads them from the tree)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_wheel_plans_without_the_source_tree(tmp_path: Path) -> None:
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*build, "-w", str(tmp_path / "dist"), str(REPO)], check=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("rlpost-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        archive.extractall(site)
    assert "rlpost/conf/model/qwen3-tiny.yaml" in names
    assert "rlpost/assets/qwen3-tiny/config.json" in names
    script = (
        "import rlpost.config.sources as s, sys; "
        "assert s.CONF_DIR.is_relative_to(sys.argv[1]), s.CONF_DIR; "
        "from rlpost.cli.main import main; "
        "main(['plan', 'model=glm4-9b', 'recipe=grpo_dapo', 'hardware=h100x8'])"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(site)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "rlpost plan: model=glm4-9b" in done.stdout
