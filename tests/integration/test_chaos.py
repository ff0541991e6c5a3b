"""benchmarks/chaos.py's schedule: a few faults on a seeded, event-tied schedule. The short
chaos run itself is tests/integration/test_resume.py's, compared with its reference run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def load_chaos() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chaos", ROOT / "benchmarks" / "chaos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_schedule_replays_from_its_seed() -> None:
    chaos = load_chaos()
    first = chaos.schedule(7, chaos.KINDS, 3)
    assert first == chaos.schedule(7, chaos.KINDS, 3) != chaos.schedule(8, chaos.KINDS, 3)
    assert sorted(f.kind for f in first) == sorted(chaos.KINDS * 3)
    assert all(f.after_records >= 1 for f in first if f.kind == "disk_full")


def test_a_reference_made_before_is_compared_with_and_named(tmp_path: Path) -> None:
    """Given an unfaulted run's directory, the report names it where it would give the time
    lost against one it launched; a folder that holds no run, or a mode whose oracle is not
    a comparison, is refused before anything starts."""
    chaos = load_chaos()
    with pytest.raises(ValueError, match="not the run directory of a finished launch"):
        chaos.bench(chaos.Settings(reference=tmp_path, workdir=tmp_path))
    with pytest.raises(ValueError, match="--mode async checks its sample accounting"):
        chaos.bench(chaos.Settings(mode="async", reference=tmp_path, workdir=tmp_path))
    report = chaos.Report(
        outcomes=[], exit_code=0, launches=1, run_restarts=0, engine_restarts=0, wall_s=9.0,
        reference_wall_s=None, reference=tmp_path,
    )  # fmt: skip
    assert f"wall: 9.0 s, its records compared with {tmp_path} (launched before" in report.render()
    assert not list(tmp_path.iterdir())  # nothing mounted, nothing launched
