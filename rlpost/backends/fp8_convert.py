"""An HF folder converted to FP8 (rlpost.backends.fp8), shard by shard.

Each shard is read tensor by tensor (safetensors maps the file, nothing else is loaded) and
its converted tensors are written as one shard of the same name, so a worker holds at most
one converted shard; `max_workers` shards convert at once in separate processes. Peak
memory is therefore a few shards, never the model. The index, config.json (with
`quantization_config`) and every other file (tokenizer, generation config, chat template)
follow.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import json
import multiprocessing
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlpost.backends.fp8 import Fp8Error, Fp8Format, quantize_named
from rlpost.backends.hf_folder import (
    INDEX_NAMES,
    copy_side_files,
    publish_folder,
    shard_files,
    write_index,
)

INDEX = INDEX_NAMES[0]


def return_freed_memory() -> None:
    """Make freed tensors go back to the OS in this process (glibc).

    glibc raises its mmap threshold each time a mapped block is freed (up to 32 MiB), so
    after the first tensor, tensors below that come from the heap, which keeps what they
    freed (measured on 16 MiB shards: 84 MiB more resident memory for the rest of the run).
    A fixed threshold keeps every allocation over 1 MiB in a mapping of its own, unmapped
    when freed. Set in the converter's own processes only: a trainer would pay a page fault
    per large allocation.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return
    libc.mallopt(M_MMAP_THRESHOLD, 1 << 20)


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def convert_shard(
    src: str, dst: str, block_size: tuple[int, int] | None, own_process: bool = False
) -> dict[str, int]:
    """One shard converted; returns {tensor name: bytes} of what it wrote."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    if own_process:
        return_freed_memory()
        torch.set_num_threads(1)
    fmt = Fp8Format(block_size)
    with safe_open(src, "pt") as handle:
        names = list(handle.keys())
        for name in names:
            if handle.get_slice(name).get_dtype() == "F8_E4M3":
                raise Fp8Error(f"{src} already holds FP8 weights ('{name}'); nothing to convert")
        out = dict(quantize_named(((n, handle.get_tensor(n)) for n in names), fmt))
    save_file(out, dst, metadata={"format": "pt"})
    os.chmod(dst, 0o644)
    return {name: t.numel() * t.element_size() for name, t in out.items()}


def _unquantised_config(folder: Path) -> dict[str, Any]:
    """The folder's config.json, refused when the folder is no model or already quantised."""
    if not (folder / "config.json").is_file():
        raise Fp8Error(f"{folder} is not a Hugging Face model folder (no config.json)")
    config: dict[str, Any] = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if "quantization_config" in config:
        raise Fp8Error(
            f"{folder} is already quantised (config.json has a quantization_config); point "
            "--model-dir at the bf16 checkpoint"
        )
    return config


def convert_folder(
    model_dir: str | Path,
    save_dir: str | Path,
    fmt: Fp8Format,
    max_workers: int = 1,
    progress: Callable[[int], None] | None = None,
) -> Path:
    """Write `model_dir` converted to FP8 at `save_dir` (atomically: the folder appears
    whole or not at all). `progress(1)` is called as each shard is done."""
    src = Path(model_dir)
    config = _unquantised_config(src)
    shards = shard_files(src)
    if not shards:
        raise Fp8Error(f"{src} has no *.safetensors files (and no {INDEX})")

    def fill(staging: Path) -> None:
        copy_side_files(src, staging)
        sizes = _convert_shards(src, staging, shards, fmt, max_workers, progress)
        quantised = {**config, "quantization_config": fmt.quantization_config()}
        (staging / "config.json").write_text(json.dumps(quantised, indent=2) + "\n")
        _write_index(staging, sizes)

    return publish_folder(save_dir, fill)


def _convert_shards(
    src: Path,
    dst: Path,
    shards: list[str],
    fmt: Fp8Format,
    max_workers: int,
    progress: Callable[[int], None] | None,
) -> dict[str, dict[str, int]]:
    jobs = [(str(src / s), str(dst / s), fmt.block_size) for s in shards]
    done: dict[str, dict[str, int]] = {}
    if max_workers <= 1:
        for shard, job in zip(shards, jobs, strict=True):
            done[shard] = convert_shard(*job)
            if progress is not None:
                progress(1)
        return done
    # spawn: each worker imports torch afresh (fork after torch's threads started can hang)
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers, mp_context=context) as pool:
        futures = {
            pool.submit(convert_shard, *job, True): shard
            for shard, job in zip(shards, jobs, strict=True)
        }
        for future in concurrent.futures.as_completed(futures):
            done[futures[future]] = future.result()
            if progress is not None:
                progress(1)
    return done


def _write_index(folder: Path, sizes: dict[str, dict[str, int]]) -> None:
    weight_map = {name: shard for shard, tensors in sizes.items() for name in tensors}
    total = sum(n for tensors in sizes.values() for n in tensors.values())
    write_index(folder, dict(sorted(weight_map.items())), total)
