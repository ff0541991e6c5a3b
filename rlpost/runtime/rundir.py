"""A run's directory: created once, with the resolved config and how it was launched."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import yaml

from rlpost.schema import RunConfig

TRACKED_PACKAGES = ("rlpost", "torch", "transformers", "ray", "megatron-core", "sglang-router")


def prepare_run_dir(cfg: RunConfig) -> Path:
    """Create the run directory and record the resolved config and provenance in it."""
    assert cfg.run.dir is not None, "the launcher fills run.dir before training starts"
    run_dir = Path(cfg.run.dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(
        yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), encoding="utf-8"
    )
    (run_dir / "provenance.json").write_text(
        json.dumps(provenance(), indent=2) + "\n", encoding="utf-8"
    )
    return run_dir


def provenance() -> dict[str, object]:
    return {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "argv": sys.argv,
        "python": platform.python_version(),
        "host": platform.node(),
        "git_revision": git_revision(),
        "packages": {name: _version(name) for name in TRACKED_PACKAGES},
    }


def git_revision() -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
