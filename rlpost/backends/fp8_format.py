"""The FP8 format of a checkpoint folder, read from its config.json (stdlib only: the plan
reads it with no heavy imports). See rlpost.backends.fp8 for the tensors."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCALE_SUFFIX = "_scale_inv"


class Fp8Error(ValueError):
    """An FP8 checkpoint or setting that cannot be read as it is; the message says why."""


@dataclass(frozen=True)
class Fp8Format:
    """How a checkpoint's FP8 weights are blocked. `block_size` None: one scale per row."""

    block_size: tuple[int, int] | None = (128, 128)

    @property
    def strategy(self) -> str:
        return "channel" if self.block_size is None else "block"

    def blocks(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """Rows and columns of one block of a weight of `shape`."""
        return (1, shape[1]) if self.block_size is None else self.block_size

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, int]:
        rows, cols = self.blocks(shape)
        return (math.ceil(shape[0] / rows), math.ceil(shape[1] / cols))

    def quantization_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
        }
        if self.block_size is not None:
            config["weight_block_size"] = list(self.block_size)
        else:
            config["weight_block_size"] = None
            config["weight_granularity"] = "channel"
        return config

    @classmethod
    def from_quantization_config(cls, config: Mapping[str, Any], where: str) -> Fp8Format:
        method = config.get("quant_method")
        if method != "fp8" or config.get("fmt", "e4m3") != "e4m3":
            raise Fp8Error(
                f"{where}: quantization_config {dict(config)} is not e4m3 FP8; rlpost reads "
                "FP8 checkpoints (quant_method fp8, fmt e4m3) and unquantised ones"
            )
        block = config.get("weight_block_size")
        if block is None:
            if config.get("weight_granularity") == "channel":
                return cls(None)
            raise Fp8Error(
                f"{where}: an FP8 checkpoint with one scale per tensor (no weight_block_size) "
                "is not supported; convert the bf16 checkpoint with tools/convert_hf_to_fp8.py "
                "--strategy block"
            )
        if len(block) != 2 or min(block) < 1:
            raise Fp8Error(f"{where}: weight_block_size {block} is not [rows, columns]")
        return cls((int(block[0]), int(block[1])))


def folder_format(folder: str | Path) -> Fp8Format | None:
    """The FP8 format of an HF folder's weights, from its config.json; None when unquantised."""
    config_file = Path(folder) / "config.json"
    if not config_file.is_file():
        return None
    config = json.loads(config_file.read_text(encoding="utf-8"))
    quant = config.get("quantization_config")
    if not quant:
        return None
    return Fp8Format.from_quantization_config(quant, str(config_file))
