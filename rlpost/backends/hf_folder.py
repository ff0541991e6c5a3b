"""Writing an exported HF folder beside a base checkpoint's tokenizer and config files.

Shared by every trainer backend that exports weights; stdlib only, so importing it pulls in
neither torch/transformers nor megatron.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from rlpost.errors import Issue, UserError

INDEX_NAMES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
# Files an export writes itself; everything else in the base folder (tokenizer files, chat
# template, generation config) is copied as is.
REWRITTEN = ("config.json", *INDEX_NAMES)


def copy_side_files(src_dir: str | Path, dst_dir: str | Path) -> None:
    """Copy tokenizer, chat template and generation config: all but weights and config."""
    dst = Path(dst_dir)
    for item in Path(src_dir).iterdir():
        if item.is_file() and item.name not in REWRITTEN and item.suffix not in WEIGHT_SUFFIXES:
            shutil.copy2(item, dst / item.name)


def staging_folders(out_dir: str | Path) -> list[Path]:
    """The folders `publish_folder` fills before they become `out_dir` (one while an export
    runs; more only when a killed export left its own behind)."""
    out = Path(out_dir)
    return sorted(out.parent.glob(f".{glob.escape(out.name)}.*"))


def check_replaceable(out_dir: str | Path, key: str) -> None:
    """Refuse an output folder that writing an HF folder there would destroy.

    `publish_folder` replaces `out_dir` whole, which is right for an earlier export (an HF
    folder: it has a config.json) and harmless for an empty folder; any other folder (a run
    directory, a checkpoint, a home folder given by mistake) would be deleted with all it
    holds. `key` names the argument that gave the folder.
    """
    out = Path(out_dir)
    if not out.exists() or (out.is_dir() and (out / "config.json").is_file()):
        return
    if out.is_dir() and not any(out.iterdir()):
        return
    if out.is_dir():
        held = sorted(p.name for p in out.iterdir())
        shown = ", ".join(held[:5]) + (f", ... ({len(held)} entries)" if len(held) > 5 else "")
        what = f"is a folder that is not an HF model folder (no config.json; it holds {shown})"
    else:
        what = "is a file, not a folder"
    raise UserError(
        [
            Issue(
                key,
                f"{what}: the export replaces the folder it writes whole, so everything in "
                "it would be deleted",
                "give a new folder (or an empty one, or an earlier export to replace)",
                value=str(out_dir),
            )
        ],
        title="output folder error",
    )


def publish_folder(out_dir: str | Path, fill: Callable[[Path], None]) -> Path:
    """Call `fill(staging)` on a sibling temp folder, then rename it to `out_dir`.

    Readers (engines reloading weights from disk) never see a half-written folder; an existing
    `out_dir` is replaced, and a failed `fill` leaves it untouched. Staging folders of an
    export that was killed are removed first.
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in staging_folders(out):  # left by a killed export
        shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    os.chmod(staging, 0o755)
    try:
        fill(staging)
        if out.exists():
            retired = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, retired)
            os.replace(staging, out)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def shard_files(folder: str | Path) -> list[str]:
    """The folder's safetensors shard names: those its index lists, else the files present
    (empty when there are none)."""
    path = Path(folder)
    index = path / INDEX_NAMES[0]
    if index.is_file():
        return sorted(set(json.loads(index.read_text())["weight_map"].values()))
    return sorted(p.name for p in path.glob("*.safetensors"))


def write_index(folder: str | Path, weight_map: dict[str, str], total_size: int) -> None:
    """A safetensors index: which shard holds each tensor, and the tensors' total bytes."""
    index = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
    (Path(folder) / INDEX_NAMES[0]).write_text(json.dumps(index, indent=2) + "\n")
