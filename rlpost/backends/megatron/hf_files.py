"""Reading and writing HF checkpoint folders tensor by tensor (safetensors, sharded or not)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from rlpost.backends.fp8 import SCALE_SUFFIX, dequantize, folder_format
from rlpost.backends.hf_folder import INDEX_NAMES, copy_side_files, publish_folder, write_index

INDEX_NAME = INDEX_NAMES[0]


class HFCheckpoint:
    """Lazy access to the tensors of a local HF folder; opens each shard once.

    An FP8 folder (config.json's quantization_config, see rlpost.backends.fp8) reads as the
    weights it stands for: each FP8 weight dequantised with its scales (float32), the
    scales themselves not listed. It is never read as plain tensors cast to bf16.
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        if not (self.folder / "config.json").is_file():
            raise FileNotFoundError(
                f"{self.folder} has no config.json; model.hf_checkpoint must be a local HF "
                "checkpoint folder (config.json and *.safetensors)"
            )
        index = self.folder / INDEX_NAME
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            self._file_of = {name: self.folder / file for name, file in weight_map.items()}
        else:
            files = sorted(self.folder.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(
                    f"{self.folder} has no *.safetensors files; save the checkpoint with "
                    "save_pretrained(..., safe_serialization=True)"
                )
            self._file_of = {}
            for file in files:
                with safe_open(str(file), "pt") as handle:
                    self._file_of.update({name: file for name in handle.keys()})  # noqa: SIM118
        self._stack = ExitStack()
        self._open: dict[Path, Any] = {}
        self._scales: dict[str, Path] = {}
        self.fp8 = folder_format(self.folder)
        if self.fp8 is not None:
            self._scales = {n: f for n, f in self._file_of.items() if n.endswith(SCALE_SUFFIX)}
            self._file_of = {n: f for n, f in self._file_of.items() if n not in self._scales}

    @property
    def config(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.folder / "config.json").read_text())
        return data

    def names(self) -> list[str]:
        return list(self._file_of)

    def __contains__(self, name: str) -> bool:
        return name in self._file_of

    def get(self, name: str) -> torch.Tensor:
        if name not in self._file_of:
            raise KeyError(f"{self.folder} has no tensor {name!r}")
        tensor = self._read(name)
        if self.fp8 is not None and name + SCALE_SUFFIX in self._scales:
            return dequantize(tensor, self._read(name + SCALE_SUFFIX), self.fp8, torch.float32)
        return tensor

    def _read(self, name: str) -> torch.Tensor:
        file = self._file_of.get(name) or self._scales[name]
        if file not in self._open:
            self._open[file] = self._stack.enter_context(safe_open(str(file), "pt"))
        tensor: torch.Tensor = self._open[file].get_tensor(name)
        return tensor

    def close(self) -> None:
        self._stack.close()
        self._open.clear()


def write_hf_folder(
    out_dir: str | Path,
    tensors: Iterable[tuple[str, torch.Tensor]],
    src_dir: str | Path,
    shard_bytes: int = 2 << 30,
) -> Path:
    """Write `tensors` as an HF folder beside `src_dir`'s config and tokenizer files.

    The folder appears whole or not at all (`publish_folder`). Shards of at most
    `shard_bytes` (one tensor may exceed it alone).
    """
    src = Path(src_dir)

    def fill(staging: Path) -> None:
        copy_side_files(src, staging)
        write_config(src, staging)
        _write_shards(staging, tensors, shard_bytes)

    return publish_folder(out_dir, fill)


def write_config(src: Path, dst: Path) -> None:
    """`src`'s config.json for the unquantised weights written beside it: an FP8 source's
    quantization_config is dropped (the tensors written are not FP8)."""
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    if config.pop("quantization_config", None) is None:
        shutil.copy2(src / "config.json", dst / "config.json")
        return
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def _write_shards(
    folder: Path, tensors: Iterable[tuple[str, torch.Tensor]], shard_bytes: int
) -> None:
    """Stream tensors into shards, each written as soon as it is full."""
    written: list[tuple[Path, list[str]]] = []
    shard: dict[str, torch.Tensor] = {}
    size = total = 0

    def flush() -> None:
        path = folder / f"part-{len(written):05d}.safetensors"
        save_file(shard, str(path), metadata={"format": "pt"})
        written.append((path, list(shard)))

    for name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if shard and size + nbytes > shard_bytes:
            flush()
            shard, size = {}, 0
        shard[name] = tensor.detach().contiguous().cpu()
        size += nbytes
        total += nbytes
    flush()
    if len(written) == 1:
        os.replace(written[0][0], folder / "model.safetensors")
        return
    weight_map = {}
    for i, (path, names) in enumerate(written, start=1):
        file = f"model-{i:05d}-of-{len(written):05d}.safetensors"
        os.replace(path, folder / file)
        weight_map.update({name: file for name in names})
    write_index(folder, weight_map, total)
