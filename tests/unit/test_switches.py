"""rlpost's environment switches: a value a switch does not take is refused, by the launch's
preflight before anything starts (exit 2, the switch, its value and the fix, no run
directory) and by the code that reads it, never taken for the default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlpost import switches
from rlpost.preflight.environment import check_switches

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("switch", switches.SWITCHES, ids=lambda s: s.name)
def test_each_switch_takes_its_values_and_refuses_others(
    switch: switches.Switch, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(switch.name, raising=False)
    assert switch.value() == switch.default and switches.bad_switches() == []
    for value in switch.choices:
        monkeypatch.setenv(switch.name, value)
        assert switch.value() == value
    monkeypatch.setenv(switch.name, "off")
    with pytest.raises(ValueError, match=f"{switch.name}='off'"):
        switch.value()
    [issue] = check_switches(None, None)  # type: ignore[arg-type]  # reads neither
    assert (issue.key, issue.value) == (switch.name, "off")
    assert all(choice in issue.fix for choice in switch.choices)


def test_a_launch_with_a_bad_switch_stops_before_anything_starts(tmp_path: Path) -> None:
    env = dict(os.environ, RLPOST_PACKED_ATTENTION="padded")
    done = subprocess.run(
        [sys.executable, "launch.py", f"run.dir={tmp_path / 'run'}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "RLPOST_PACKED_ATTENTION = 'padded'" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()
