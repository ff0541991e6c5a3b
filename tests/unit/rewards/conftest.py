"""Makes the hook modules in tests/hooks_fixtures importable by dotted path."""

from __future__ import annotations

from pathlib import Path

import pytest

HOOKS_DIR = Path(__file__).resolve().parents[2] / "hooks_fixtures"


@pytest.fixture
def hook_modules(monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(HOOKS_DIR))
    return HOOKS_DIR
