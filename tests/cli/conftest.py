"""`rlpost ARGV` run in the test process: (exit status, stdout, stderr)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rlpost.cli.main import main

Rlpost = Callable[[list[str]], tuple[int, str, str]]


@pytest.fixture
def rlpost(capsys: pytest.CaptureFixture[str]) -> Rlpost:
    def run(argv: list[str]) -> tuple[int, str, str]:
        try:
            main(argv)
            status = 0
        except SystemExit as exc:
            status = int(exc.code or 0)
        out, err = capsys.readouterr()
        return status, out, err

    return run
