"""A short chaos run (benchmarks/chaos.py): a few faults on a seeded, event-tied schedule,
and the oracle: the per-rollout records of a deterministic run equal an unfaulted run's."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
# one train rank and one engine: half the start-up of the default's two of each
SMALL = ("layout.train.num_gpus=1", "hardware.gpus_per_node=1")


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


def test_a_short_chaos_run_survives_every_fault_with_the_unfaulted_metrics(
    tmp_path: Path,
) -> None:
    """An engine server, a grading worker and the driver killed, and the disk filled during
    a save where a tmpfs can be mounted; the run (resumed after the driver's kill) finishes
    with the same records as a run that never faulted and leaves no process behind."""
    chaos = load_chaos()
    # seed 25: the full disk comes last, after the driver's kill and its resume (a refused save
    # followed by a resume: tests/integration/test_resume.py's engine-server test)
    settings = chaos.Settings(
        seed=25,
        per_kind=1,
        kinds=("engine_server", "reward_worker", "driver", "disk_full"),
        rollouts=6,
        overrides=SMALL,
        workdir=tmp_path,
    )
    report = chaos.bench(settings)
    print(report.render())
    assert report.ok, report.render()
    delivered = [o for o in report.outcomes if o.delivered]
    assert delivered and all(o.survived for o in delivered), report.render()
    kinds = {o.fault.kind for o in delivered}
    assert {"engine_server", "reward_worker", "driver"} <= kinds, report.render()
    assert report.launches == 2 and report.run_restarts == 0, report.render()
