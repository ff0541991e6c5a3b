"""Loading a local HF causal LM and writing the policy back as an HF folder."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import torch
from torch import nn
from transformers import PreTrainedModel

from rlpost.backends.hf_folder import copy_side_files, publish_folder
from rlpost.backends.hf_load import load_causal_lm as load_hf_causal_lm
from rlpost.backends.torch_trainer.attention import PACKED_SDPA

ModuleT = TypeVar("ModuleT", bound=nn.Module)


def load_causal_lm(
    model_dir: str | Path, attn_implementation: str = PACKED_SDPA
) -> PreTrainedModel:
    """fp32 weights on CPU, eval mode (no dropout: losses must be deterministic)."""
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"model folder {str(path)!r} has no config.json; point the model path at a local "
            "HF checkpoint folder (config.json, *.safetensors, tokenizer files)"
        )
    # an FP8 folder is dequantised (weight x scale per block), never read as plain tensors
    model = load_hf_causal_lm(path, torch.float32, attn_implementation=attn_implementation)
    model.train(False)
    return model


def freeze(model: ModuleT) -> ModuleT:
    for p in model.parameters():
        p.requires_grad_(False)
    model.train(False)
    return model


def export_hf(model: PreTrainedModel, src_dir: str | Path, out_dir: str | Path) -> Path:
    """Write `model` as an HF folder at `out_dir` beside `src_dir`'s tokenizer files,
    replacing it atomically (`publish_folder`)."""

    def fill(staging: Path) -> None:
        copy_side_files(src_dir, staging)
        model.save_pretrained(staging)

    return publish_folder(out_dir, fill)
