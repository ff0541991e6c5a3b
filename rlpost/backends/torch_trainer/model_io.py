"""Loading a local HF causal LM and writing the policy back as an HF folder."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TypeVar

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel

from rlpost.backends.torch_trainer.attention import PACKED_SDPA

ModuleT = TypeVar("ModuleT", bound=nn.Module)

# Files the trainer rewrites; everything else in the source folder (tokenizer files, chat
# template, generation config) is copied as is.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
WEIGHT_NAMES = ("config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json")


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
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation=attn_implementation
    )
    model.train(False)
    return model


def freeze(model: ModuleT) -> ModuleT:
    for p in model.parameters():
        p.requires_grad_(False)
    model.train(False)
    return model


def copy_side_files(src_dir: Path, dst_dir: Path) -> None:
    for item in src_dir.iterdir():
        if not item.is_file() or item.name in WEIGHT_NAMES or item.suffix in WEIGHT_SUFFIXES:
            continue
        shutil.copy2(item, dst_dir / item.name)


def export_hf(model: PreTrainedModel, src_dir: str | Path, out_dir: str | Path) -> Path:
    """Write `model` as an HF folder at `out_dir`, replacing it atomically.

    Readers (engines reloading weights from disk) never see a half-written folder: the
    export lands in a sibling temp folder that is renamed into place.
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    os.chmod(staging, 0o755)
    try:
        copy_side_files(Path(src_dir), staging)
        model.save_pretrained(staging)
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
