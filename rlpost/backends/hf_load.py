"""Loading a local Hugging Face folder's weights, FP8 checkpoints included.

An FP8 folder (rlpost.backends.fp8) is read as the weights it stands for: every FP8 weight
times its per-block scales, in the dtype asked for. transformers' own FP8 loader needs a
GPU (or accelerate, to dequantise to bf16); this one gives the engine and the trainers the
same dequantised weights in any dtype on CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GenerationConfig,
    PreTrainedConfig,
    PreTrainedModel,
)

from rlpost.backends.fp8 import dequantize_state, folder_format
from rlpost.backends.hf_folder import shard_files


class WeightLoadError(Exception):
    """A checkpoint folder that does not fit the model; the message names what and why."""


def read_safetensors_dir(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of the *.safetensors files in a folder (a single file or shards), as
    stored (an FP8 folder's weights and scales apart: see read_weights)."""
    folder = Path(path)
    if not folder.is_dir():
        raise WeightLoadError(f"model_path '{folder}' is not a directory")
    files = [folder / name for name in shard_files(folder)]
    if not files:
        raise WeightLoadError(
            f"no *.safetensors files in '{folder}'; save the checkpoint with "
            f"save_pretrained(..., safe_serialization=True)"
        )
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file), device="cpu"))
    return state


def read_weights(path: str | Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The folder's weights, FP8 ones dequantised to `dtype`."""
    state = read_safetensors_dir(path)
    fmt = folder_format(path)
    return state if fmt is None else dequantize_state(state, fmt, dtype)


def folder_config(path: str | Path) -> PreTrainedConfig:
    """The folder's config as its model is built: an FP8 folder's `quantization_config` left
    out (its weights are read dequantised, `read_weights`)."""
    folder = Path(path)
    config: PreTrainedConfig = AutoConfig.from_pretrained(folder, local_files_only=True)
    if folder_format(folder) is not None and hasattr(config, "quantization_config"):
        del config.quantization_config
    return config


def build_causal_lm(path: str | Path, dtype: torch.dtype, **kwargs: Any) -> PreTrainedModel:
    """The folder's architecture (`folder_config`) in `dtype` with its generation config, no
    weights read: they are as the model initialises them, or absent when built under
    `torch.device("meta")`."""
    folder = Path(path)
    model: PreTrainedModel = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
        folder_config(folder), dtype=dtype, **kwargs
    )
    if (folder / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(folder, local_files_only=True)
    return model


def load_causal_lm(path: str | Path, dtype: torch.dtype, **kwargs: Any) -> PreTrainedModel:
    """`AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs)`, local files only;
    an FP8 folder is built from its config (`build_causal_lm`) and given its dequantised
    weights."""
    folder = Path(path)
    if folder_format(folder) is None:
        model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
            folder, dtype=dtype, local_files_only=True, **kwargs
        )
        return model
    model = build_causal_lm(folder, dtype, **kwargs)
    state = read_weights(folder, dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or ())  # names (or a name map)
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise WeightLoadError(
            f"FP8 checkpoint '{folder}' does not fit its config: missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}"
        )
    model.tie_weights()
    return model
