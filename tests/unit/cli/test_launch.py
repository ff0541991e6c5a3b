"""How a single launch (rlpost.cli.launch.main) ends when something goes wrong before its run
starts: a refusal (exit 2, no traceback) or a defect of rlpost's (exit 4, its traceback once)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import rlpost.plan
from rlpost.cli import launch
from rlpost.errors import EXIT_INTERNAL_ERROR, EXIT_USER_ERROR
from rlpost.schema import RunConfig


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[list[str]], int]]:
    """launch.main on `argv`; its exit status."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    monkeypatch.setattr(sys, "argv", ["launch.py"])

    def run(argv: list[str]) -> int:
        try:
            launch.main(argv)
        except SystemExit as exc:
            return int(exc.code or 0)
        return 0

    yield run
    HydraConfig.instance().cfg = None  # type: ignore[assignment]
    GlobalHydra.instance().clear()


def a_planning_defect(cfg: RunConfig) -> None:
    raise ZeroDivisionError("division by zero in the memory estimate")


@pytest.mark.parametrize("hydra_job", [False, True], ids=["plain overrides", "a Hydra job"])
def test_a_defect_while_planning_is_an_internal_error_with_its_traceback_once(
    launched: Callable[[list[str]], int],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    hydra_job: bool,
) -> None:
    """An exception of rlpost's own while a launch plans (not a refusal) exits 4 with its
    traceback once and a line that calls it a bug, where it ended in Hydra's wrapped report
    (or Python's) and exit status 1, the status of any crash. A launch of plain overrides
    plans without a Hydra job; one with a Hydra override plans in one."""
    monkeypatch.setattr(rlpost.plan, "plan_config", a_planning_defect)
    argv = ["mode=plan", *([f"hydra.run.dir={tmp_path}"] if hydra_job else [])]
    assert launched(argv) == EXIT_INTERNAL_ERROR
    err = capsys.readouterr().err
    assert err.count("Traceback (most recent call last)") == 1, err
    assert "HYDRA_FULL_ERROR" not in err and "Error executing job" not in err
    assert err.endswith(
        "rlpost: internal error before the run started: ZeroDivisionError: division by zero "
        "in the memory estimate\n  rlpost did not expect it: most likely a bug in rlpost, "
        "not a problem with the config; nothing was started. The traceback above says where: "
        "please report it with the command line.\n"
    ), err


def test_a_refusal_stays_a_refusal(
    launched: Callable[[list[str]], int], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert launched(["mode=plan", "recipe.optim.lr=-1", f"hydra.run.dir={tmp_path}"]) == (
        EXIT_USER_ERROR
    )
    err = capsys.readouterr().err
    assert "recipe.optim.lr" in err
    assert "Traceback" not in err and "internal error" not in err


def test_provenance_records_the_command_line_as_typed_and_the_overrides_as_applied(
    launched: Callable[[list[str]], int], tmp_path: Path
) -> None:
    """provenance.json's `argv` is what the user typed, not the launcher's rewriting of it
    for Hydra (schema keys marked '++'); its `overrides` are what Hydra applied."""
    from omegaconf import DictConfig

    from rlpost.runtime.rundir import provenance

    recorded: list[dict[str, object]] = []

    def job(cfg: DictConfig) -> None:
        recorded.append(provenance())

    typed = ["recipe.optim.lr=1e-5", "mode=plan", f"hydra.run.dir={tmp_path}"]
    launch.main(typed, job)  # `launched` set sys.argv[0] and clears Hydra after
    assert recorded[0]["argv"] == ["launch.py", *typed]
    assert "++recipe.optim.lr=1e-5" in recorded[0]["overrides"]  # type: ignore[operator]
