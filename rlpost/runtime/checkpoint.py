"""Checkpoint directories that are complete or visibly not: staging, manifest, rename.

A save writes every file into `ckpt/tmp-<n>`, syncs it to disk, writes `manifest.json` (each
file's size and sha256) last, then renames the folder to `ckpt/rollout_<n>`: the state after
n rollouts, from which a resumed run continues with rollout id n. A crash mid-save leaves a
`tmp-` folder, never a `rollout_` one. A `rollout_` folder is loaded only when its manifest
parses and every file it lists has the recorded size and hash; anything else is reported as
broken and skipped. Imports nothing heavy (the export tool and the resume check use it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rlpost.runtime.remote_errors import remote_cause

CKPT_DIR = "ckpt"
MANIFEST = "manifest.json"
FORMAT_VERSION = 1
STAGING_PREFIX = "tmp-"
ABANDONED_DIR = "abandoned"
NAME_PATTERN = re.compile(r"^rollout_(\d+)$")
# Without these a checkpoint cannot be resumed from, whatever its manifest says.
REQUIRED_FILES = ("loop.json", "config.yaml")
REQUIRED_DIRS = ("trainer/",)  # the trainer's state, in its backend's own files
HASH_CHUNK_BYTES = 1 << 22


class CheckpointError(Exception):
    """A checkpoint folder that is incomplete, altered or not a checkpoint at all."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem

    def unloaded(self) -> str:
        """What a resume (and `rlpost status`) says of this checkpoint, which it skips."""
        return f"checkpoint {self.path} is broken and will not be loaded: {self.problem}"


def unfinished_save(staging: Path) -> str:
    """What a resume (and `rlpost status`) says of a staging folder a save left."""
    return f"{staging} is a save that did not finish; ignored"


@dataclass(frozen=True)
class Scan:
    """What a run's ckpt/ holds: complete checkpoints newest first, broken ones with why,
    and staging folders of saves that never finished."""

    complete: list[Path] = field(default_factory=list)
    broken: list[CheckpointError] = field(default_factory=list)
    interrupted: list[Path] = field(default_factory=list)

    @property
    def latest(self) -> Path | None:
        return self.complete[0] if self.complete else None


def checkpoint_root(run_dir: Path) -> Path:
    return run_dir / CKPT_DIR


def checkpoint_name(rollouts_done: int) -> str:
    return f"rollout_{rollouts_done}"


def rollouts_done_of(path: Path) -> int | None:
    """n for a folder named rollout_<n>, else None."""
    match = NAME_PATTERN.match(path.name)
    return int(match.group(1)) if match else None


# ---- writing ------------------------------------------------------------------------------


def fsync_file(path: Path) -> None:
    with path.open("rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: Path, data: bytes) -> None:
    """Write a file and force it to disk before returning."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def staging_path(run_dir: Path, rollouts_done: int) -> Path:
    return checkpoint_root(run_dir) / f"{STAGING_PREFIX}{rollouts_done}"


def discard_save(staging: Path) -> None:
    """Remove a save that failed (the disk refused it): never a half checkpoint left."""
    shutil.rmtree(staging, ignore_errors=True)


class SaveError(Exception):
    """A save the disk refused (full, a quota, a file size limit); nothing was left behind
    and the previous checkpoint is still the newest."""


async def save(
    run_dir: Path,
    rollouts_done: int,
    write: Callable[[Path], Awaitable[None]],
    keep_last: int,
) -> Path:
    """Stage, `write(staging)` every file, then commit: the checkpoint after `rollouts_done`
    rollouts, or SaveError (with the staging folder removed) when the disk refuses a write."""
    staging = staging_path(run_dir, rollouts_done)
    try:
        start_save(run_dir, rollouts_done)
        await write(staging)
        return commit_save(staging, keep_last)
    except OSError as exc:
        discard_save(staging)
        cause = remote_cause(exc)  # a train rank's OSError, without Ray's traceback text
        raise SaveError(f"{type(cause).__name__}: {cause}") from exc


def bytes_under(folder: Path) -> int:
    """The size of every file under `folder` (0 where there is none; a file that goes while
    it is counted is left out: a save renames and removes its files as it writes)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, name)).st_size
    return total


def start_save(run_dir: Path, rollouts_done: int) -> Path:
    """An empty staging folder for the checkpoint after `rollouts_done` rollouts.

    One process saves per run, so any other staging folder is a save that was killed: it
    is removed here.
    """
    root = checkpoint_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f"{STAGING_PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)
    staging = staging_path(run_dir, rollouts_done)
    staging.mkdir()
    return staging


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _listed_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def _missing(files: dict[str, Any]) -> list[str]:
    """Required files, and required folders holding no file, absent from `files`."""
    missing = [name for name in REQUIRED_FILES if name not in files]
    return missing + [d for d in REQUIRED_DIRS if not any(f.startswith(d) for f in files)]


def commit_save(staging: Path, keep_last: int) -> Path:
    """Seal a staging folder: sync, manifest last, rename into place, prune to `keep_last`."""
    rollouts_done = int(staging.name.removeprefix(STAGING_PREFIX))
    files = {}
    for path in _listed_files(staging):
        fsync_file(path)
        rel = path.relative_to(staging).as_posix()
        files[rel] = {"size": path.stat().st_size, "sha256": sha256_of(path)}
    missing = _missing(files)
    if missing:
        raise RuntimeError(f"checkpoint {staging} is missing {missing}; not committing it")
    manifest = {
        "format": FORMAT_VERSION,
        "rollouts_done": rollouts_done,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "files": files,
    }
    write_synced(staging / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())
    for folder in sorted({p.parent for p in _listed_files(staging)} | {staging}, reverse=True):
        fsync_dir(folder)
    final = staging.parent / checkpoint_name(rollouts_done)
    if final.exists():  # the same rollout saved before (an abandoned continuation)
        retired = staging.parent / f"{STAGING_PREFIX}retired-{rollouts_done}"
        os.replace(final, retired)
        os.replace(staging, final)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.replace(staging, final)
    fsync_dir(final.parent)
    prune(final.parent, keep_last)
    return final


def prune(root: Path, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` complete-looking checkpoints; returns them."""
    named = sorted(
        (p for p in root.iterdir() if p.is_dir() and rollouts_done_of(p) is not None),
        key=lambda p: rollouts_done_of(p) or 0,
        reverse=True,
    )
    removed = named[keep_last:]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


# ---- reading ------------------------------------------------------------------------------


def read_manifest(path: Path) -> dict[str, Any]:
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(path, "no manifest.json: the save did not finish")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(path, f"manifest.json does not parse ({exc})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(path, "manifest.json has no file list")
    if manifest.get("format") != FORMAT_VERSION:
        raise CheckpointError(
            path, f"manifest format {manifest.get('format')!r}, this rlpost reads {FORMAT_VERSION}"
        )
    return manifest


def verify(path: Path, check_hashes: bool = True) -> dict[str, Any]:
    """The manifest of a checkpoint that is whole; CheckpointError naming the first fault."""
    if not path.is_dir():
        raise CheckpointError(path, "not a directory")
    manifest = read_manifest(path)
    done = rollouts_done_of(path)
    if done is not None and manifest.get("rollouts_done") != done:
        raise CheckpointError(
            path, f"manifest says {manifest.get('rollouts_done')} rollouts, the name says {done}"
        )
    files: dict[str, dict[str, Any]] = manifest["files"]
    for name in _missing(files):
        raise CheckpointError(path, f"manifest does not list {name}")
    for rel, entry in files.items():
        item = path / rel
        if not item.is_file():
            raise CheckpointError(path, f"{rel} is listed in the manifest but missing")
        size = item.stat().st_size
        if size != entry.get("size"):
            expected = entry.get("size")
            raise CheckpointError(path, f"{rel} has {size} bytes, the manifest says {expected}")
        if check_hashes and sha256_of(item) != entry.get("sha256"):
            raise CheckpointError(path, f"{rel} does not match its sha256 in the manifest")
    return manifest


def scan(run_dir: Path, check_hashes: bool = True) -> Scan:
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return Scan()
    named = [p for p in root.iterdir() if p.is_dir() and rollouts_done_of(p) is not None]
    named.sort(key=lambda p: rollouts_done_of(p) or 0, reverse=True)
    complete, broken = [], []
    for path in named:
        try:
            verify(path, check_hashes)
        except CheckpointError as exc:
            broken.append(exc)
        else:
            complete.append(path)
    interrupted = sorted(root.glob(f"{STAGING_PREFIX}*"))
    return Scan(complete, broken, interrupted)


def set_aside(paths: Iterable[Path]) -> list[Path]:
    """Move checkpoints to ckpt/abandoned/ (kept for inspection, never resumed from)."""
    moved = []
    for path in paths:
        target_dir = path.parent / ABANDONED_DIR
        target_dir.mkdir(exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        target = target_dir / f"{path.name}-{stamp}"
        os.replace(path, target)
        moved.append(target)
    return moved
