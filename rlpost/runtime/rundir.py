"""A run's directory: the resolved config and how each launch of the run was made.

<run.dir>/
  config.yaml        the resolved config of the latest launch
  provenance.json    that launch: command line, overrides, git revision, package versions
  launches.jsonl     one line per launch (first start, every resume and restart) as it starts
  launch_ends.jsonl  one line as each ends: how, its exit status (rlpost.runtime.launches)
  metrics.jsonl      one record per rollout        (rlpost.runtime.metrics)
  tensorboard/       the same metrics for TensorBoard
  ckpt/rollout_<n>/  checkpoints after n rollouts  (rlpost.runtime.checkpoint)
  hf/rollout_<n>/    the policy as an HF folder, every save.save_hf_interval rollouts
  logs/              engine and router logs
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from rlpost.config.overrides import TYPED_ARGV
from rlpost.runtime.checkpoint import CKPT_DIR
from rlpost.runtime.redact import redact
from rlpost.schema import RunConfig

TRACKED_PACKAGES = ("rlpost", "torch", "transformers", "ray", "megatron-core", "sglang-router")
CONFIG_FILE = "config.yaml"
PROVENANCE_FILE = "provenance.json"
LAUNCHES_FILE = "launches.jsonl"


LOCK_FILE = ".lock"
_HELD_LOCKS: dict[Path, int] = {}
RUN_MARKERS = (LAUNCHES_FILE, PROVENANCE_FILE, CKPT_DIR)
"""What makes a folder a run directory: every launch writes launches.jsonl and provenance.json
before anything else it writes there (prepare_run_dir), and ckpt/ holds a run's checkpoints
(copied or moved there, too)."""


def foreign_entries(folder: Path) -> list[str]:
    """The entries of `folder` when it is not a run directory and not empty: a folder of
    someone's own, whose config.yaml, provenance.json or metrics.jsonl a launch would write
    over. [] for a run directory (RUN_MARKERS), for a folder that holds nothing or only a lock
    (the launcher claims Hydra's job folder before it validates), and for none."""
    try:
        entries = sorted(p.name for p in folder.iterdir())
    except OSError:
        return []
    if any(marker in entries for marker in RUN_MARKERS):
        return []
    return [name for name in entries if name != LOCK_FILE]


def lock_run_dir(run_dir: Path) -> int | None:
    """Hold the run directory for this process's lifetime (an advisory lock on
    <run_dir>/.lock, released when the process ends, crashes included). Returns this
    process's pid, or None when another process holds it."""
    run_dir = run_dir.resolve()
    if run_dir in _HELD_LOCKS:
        return os.getpid()
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _HELD_LOCKS[run_dir] = fd
    return os.getpid()


def discard_unused(folder: Path) -> bool:
    """Remove `folder` when it holds nothing, or only this process's lock file: what a
    launch that wrote nothing there leaves (Hydra makes the job's output folder, and a
    training launch claims it, before validation runs). Anything else in it, or a lock
    another process holds, keeps it. True when it was removed."""
    folder = folder.resolve()
    try:
        entries = {p.name for p in folder.iterdir()}
    except OSError:
        return False
    fd = _HELD_LOCKS.get(folder)
    if entries - {LOCK_FILE} or (LOCK_FILE in entries and fd is None):
        return False
    if fd is not None:
        (folder / LOCK_FILE).unlink(missing_ok=True)  # while held: no other launch takes it
        os.close(_HELD_LOCKS.pop(folder))
    try:
        folder.rmdir()
    except OSError:
        return False
    return True


def lock_holder(run_dir: Path) -> str:
    """The pid a lock file names, for messages."""
    try:
        return (run_dir / LOCK_FILE).read_text().strip() or "?"
    except OSError:
        return "?"


def run_dir_of(cfg: RunConfig) -> Path:
    assert cfg.run.dir is not None, "the launcher fills run.dir before training starts"
    return Path(cfg.run.dir).resolve()


def prepare_run_dir(cfg: RunConfig, start_rollout: int = 0, restart: int = 0) -> Path:
    """Create the run directory and record the resolved config and provenance in it (and
    in launches.jsonl, one line per launch and per restart of one)."""
    run_dir = run_dir_of(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG_FILE).write_text(config_yaml(cfg), encoding="utf-8")
    record = provenance()
    (run_dir / PROVENANCE_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    launch = {"start_rollout": start_rollout, "resume": cfg.run.resume, **record}
    if restart:
        launch["restart"] = restart
    with (run_dir / LAUNCHES_FILE).open("a", encoding="utf-8") as f:
        f.write(json.dumps(launch) + "\n")
    return run_dir


def config_dict(cfg: RunConfig) -> dict[str, Any]:
    """The resolved config as plain data, secrets redacted (what a run writes of it)."""
    data: dict[str, Any] = redact(cfg.model_dump(mode="json"))
    return data


def config_as_today(data: dict[str, Any]) -> dict[str, Any]:
    """A config another rlpost version wrote, as this version reads it: fields added since
    (at the top or in a list's items, such as an evaluation dataset's) take their defaults, so
    a comparison shows what the run set, not what the schema grew. Data this version's schema
    refuses is returned as written."""
    try:
        return config_dict(RunConfig.model_validate(data))
    except ValidationError:
        return data


def config_yaml(cfg: RunConfig) -> str:
    text: str = yaml.safe_dump(config_dict(cfg), sort_keys=False)
    return text


def provenance() -> dict[str, Any]:
    record: dict[str, Any] = redact(
        {
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            # as typed; `overrides`: as Hydra applied them
            "argv": list(TYPED_ARGV) or sys.argv,
            "overrides": command_line_overrides(),
            "python": platform.python_version(),
            "host": platform.node(),
            "git_revision": git_revision(),
            "packages": {name: _version(name) for name in TRACKED_PACKAGES},
        }
    )
    return record


def command_line_overrides() -> list[str]:
    """This job's own overrides (one job of a sweep has one value per key)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            return list(HydraConfig.get().overrides.task)
    except ImportError:
        pass
    return [arg for arg in sys.argv[1:] if "=" in arg]


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
