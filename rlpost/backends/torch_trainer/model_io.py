"""Loading a local HF causal LM (or building its architecture alone, on the meta device),
finding its decoder layers (the units FSDP2 shards and activation checkpointing recomputes),
and writing the policy back as an HF folder."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import torch
from torch import Tensor, nn
from torch.distributed._composable import checkpoint  # type: ignore[attr-defined]
from transformers import PreTrainedModel

from rlpost.backends.hf_folder import copy_side_files, publish_folder
from rlpost.backends.hf_load import build_causal_lm as build_hf_causal_lm
from rlpost.backends.hf_load import load_causal_lm as load_hf_causal_lm
from rlpost.backends.torch_trainer.attention import PACKED_SDPA
from rlpost.config.hf_fields import EXPERT_KEYS, MISSING, hf_value

ModuleT = TypeVar("ModuleT", bound=nn.Module)


def load_causal_lm(
    model_dir: str | Path,
    attn_implementation: str = PACKED_SDPA,
    grouped_gemm: bool | None = None,
) -> PreTrainedModel:
    """fp32 weights on CPU, eval mode (no dropout: losses must be deterministic).
    `grouped_gemm` (model.moe.grouped_gemm; None: a dense model, or transformers' default):
    whether an MoE model's experts run as grouped matrix multiplies or one expert at a
    time (`experts_implementation`)."""
    path = _model_folder(model_dir)
    # an FP8 folder is dequantised (weight x scale per block), never read as plain tensors
    with _experts_supported(path, grouped_gemm):
        model = load_hf_causal_lm(
            path, torch.float32, attn_implementation=attn_implementation,
            **_experts(grouped_gemm),
        )  # fmt: skip
    model.train(False)
    return model


def build_causal_lm(
    model_dir: str | Path,
    attn_implementation: str = PACKED_SDPA,
    grouped_gemm: bool | None = None,
) -> PreTrainedModel:
    """The model `load_causal_lm` gives (the same config, fp32, attention, experts,
    generation config, eval mode, tied weights tied) with every parameter and buffer on the
    meta device: no storage, and nothing read from the folder but its config files."""
    path = _model_folder(model_dir)
    with torch.device("meta"), _experts_supported(path, grouped_gemm):
        model = build_hf_causal_lm(
            path, torch.float32, attn_implementation=attn_implementation,
            **_experts(grouped_gemm),
        )  # fmt: skip
    model.train(False)
    return model


GROUPED_EXPERTS = "grouped_mm"
"""transformers' experts implementation for `grouped_gemm: true`: the tokens sorted by expert
and each projection one grouped matrix multiply over all experts (torch's grouped_mm on
CUDA)."""
EXPERT_LOOP = "eager"
"""...and for `grouped_gemm: false`: a loop over the experts that received tokens."""


def _experts(grouped_gemm: bool | None) -> dict[str, str]:
    if grouped_gemm is None:
        return {}
    return {"experts_implementation": GROUPED_EXPERTS if grouped_gemm else EXPERT_LOOP}


@contextmanager
def _experts_supported(path: Path, grouped_gemm: bool | None) -> Iterator[None]:
    """transformers' refusal of grouped experts for a model class without them, in the
    config's words."""
    try:
        yield
    except ValueError as err:
        if not grouped_gemm or "experts implementation" not in str(err):
            raise
        raise ValueError(
            f"model.moe.grouped_gemm: true, but the model class of {str(path)!r} runs its "
            f"experts only one at a time ({err}); fix: model.moe.grouped_gemm=false"
        ) from None


def _model_folder(model_dir: str | Path) -> Path:
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"model folder {str(path)!r} has no config.json; point the model path at a local "
            "HF checkpoint folder (config.json, *.safetensors, tokenizer files)"
        )
    return path


def freeze(model: ModuleT) -> ModuleT:
    for p in model.parameters():
        p.requires_grad_(False)
    model.train(False)
    return model


def decoder_layers(model: PreTrainedModel) -> list[nn.Module]:
    """The model's repeated blocks: the modules transformers never splits across devices
    (`_no_split_modules`, e.g. Qwen3DecoderLayer)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    # by the class's ancestry: FSDP2 swaps a sharded module's class for a subclass
    layers = [m for m in model.modules() if names & {c.__name__ for c in type(m).__mro__}]
    if not layers:
        raise ValueError(
            f"{type(model).__name__} names no decoder layer class (_no_split_modules="
            f"{sorted(names)}): the torch trainer shards and recomputes per decoder layer"
        )
    return layers


def router_modules(model: PreTrainedModel) -> list[nn.Module]:
    """The MoE layers' routers: each module whose one parameter is a [num_experts, hidden]
    weight (the gate's linear map), found by shape, since each architecture names and writes
    its own (Qwen3-MoE's computes in the layer's dtype; GLM-4.5's and DeepSeek-V3's upcast to
    float32 themselves). None for a dense model."""
    config = model.config.to_dict()
    counts = [hf_value(config, key) for key in EXPERT_KEYS]
    experts = next((n for n in counts if n is not MISSING and n), None)
    if experts is None:
        return []
    shape = (int(experts), int(hf_value(config, "hidden_size")))
    routers = []
    for module in model.modules():
        own = dict(module.named_parameters(recurse=False))
        weight = own.get("weight")
        if len(own) == 1 and weight is not None and tuple(weight.shape) == shape:
            routers.append(module)
    return routers


def checkpoint_layers(
    model: PreTrainedModel, granularity: str, method: str = "uniform", num_layers: int = 1
) -> int:
    """Activation checkpointing (layout.train.recompute) per decoder layer: `full` keeps
    only each checkpointed layer's input and recomputes the rest in the backward; with
    method `block`, the first `num_layers` layers only (uniform: every layer). `none`: no
    recompute. Returns how many layers recompute. Validation refuses what this does not
    express (selective; uniform over groups of layers)."""
    if granularity == "none":
        return 0
    if granularity != "full" or (method == "uniform" and num_layers != 1):
        raise ValueError(
            f"the torch trainer recomputes whole decoder layers: recompute {granularity} "
            f"(method {method}, num_layers {num_layers}) is not one of its choices"
        )
    layers = decoder_layers(model)
    chosen = layers[:num_layers] if method == "block" else layers
    for layer in chosen:
        checkpoint(layer)
    return len(chosen)


def export_hf(
    model: PreTrainedModel,
    src_dir: str | Path,
    out_dir: str | Path,
    weights: Mapping[str, Tensor] | None = None,
) -> Path:
    """Write `model` (its config, and `weights` when given: whole tensors, in place of its
    own) as an HF folder at `out_dir` beside `src_dir`'s tokenizer files, replacing it
    atomically (`publish_folder`)."""

    def fill(staging: Path) -> None:
        copy_side_files(src_dir, staging)
        model.save_pretrained(staging, state_dict=None if weights is None else dict(weights))

    return publish_folder(out_dir, fill)
