"""A Hugging Face model's tensors under its checkpoint's names and layout, and back.

transformers 5 builds some architectures in another layout than their checkpoints store:
a mixture-of-experts layer's experts as one stacked tensor per projection
(`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`) where the checkpoint holds one tensor
per expert and projection (`mlp.experts.0.gate_proj.weight`), and Mixtral's
`block_sparse_moe` as `mlp`. `from_pretrained` converts on load and `save_pretrained` back on
save. Weights that travel between a trainer and the engines (an update, an HF export) travel
in the checkpoint's layout, the one SGLang loads and the megatron trainer writes, so the torch
trainer sends `to_checkpoint` of its tensors and the CPU engine takes `to_model` of what it
receives. A model transformers loads as stored (Qwen3, Llama, Mistral...) passes through both
unchanged.

An update arrives bucket by bucket, and the tensors one model tensor is made of (every
expert's gate and up projection of a layer) may arrive in different buckets: `merged_names` says
which checkpoint tensors must wait for the rest of their group before `to_model`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from transformers import PreTrainedModel
from transformers.conversion_mapping import get_model_conversion_mapping
from transformers.core_model_loading import (
    PrefixChange,
    WeightConverter,
    WeightRenaming,
    dot_natural_key,
    rename_source_key,
    revert_weight_conversion,
)

__all__ = ["merged_names", "persistent_buffers", "to_checkpoint", "to_model"]


def persistent_buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The buffers a checkpoint of `model` holds beside its parameters, by the model's names:
    the persistent ones (a DeepSeek-V3 or GLM-4.5 router's `e_score_correction_bias`), not a
    rotary embedding's `inv_freq`."""
    found: dict[str, torch.Tensor] = {}
    for prefix, module in model.named_modules():
        for name, buffer in module.named_buffers(recurse=False):
            if name not in module._non_persistent_buffers_set:
                found[f"{prefix}.{name}" if prefix else name] = buffer
    return found


def _transforms(model: PreTrainedModel) -> list[Any]:
    """The conversions `from_pretrained` applied to this model (or, for a model built from
    its config, the ones it would have applied), as `revert_weight_conversion` finds them."""
    found = getattr(model, "_weight_conversions", None)
    if found is None:
        found = [
            t
            for t in get_model_conversion_mapping(model, add_legacy=False)
            if not isinstance(t, PrefixChange)
        ]
    return list(found or [])


def _split(model: PreTrainedModel) -> tuple[list[WeightRenaming], list[WeightConverter]]:
    transforms = _transforms(model)
    return (
        [t for t in transforms if isinstance(t, WeightRenaming)],
        [t for t in transforms if isinstance(t, WeightConverter)],
    )


def to_checkpoint(
    model: PreTrainedModel, state: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """`state` (the model's names and layout) as its checkpoint stores it. A model tensor
    that stands for several checkpoint tensors (stacked experts) gives all of them, so a
    bucket of whole model tensors converts on its own."""
    if not _transforms(model):
        return dict(state)
    reverted = revert_weight_conversion(model, dict(state))
    return {name: tensor.contiguous() for name, tensor in reverted.items()}  # views of a stack


def merged_names(model: PreTrainedModel, names: Iterable[str]) -> set[str]:
    """Those of the checkpoint tensors `names` that are one of several making one model
    tensor (every expert's gate projection of a layer, for one)."""
    renamings, converters = _split(model)
    if not converters:
        return set()
    return {n for n in names if rename_source_key(n, renamings, converters)[1] is not None}


def to_model(model: PreTrainedModel, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` (checkpoint names and layout) as the model holds it: renamed, and each group
    of checkpoint tensors merged into its model tensor. A group must be whole (`merged_names`):
    one with members missing merges into a tensor of the wrong shape, which loading refuses
    (`ModelWeights`)."""
    renamings, converters = _split(model)
    if not renamings and not converters:
        return dict(state)
    by_pattern = {p: c for c in converters for p in c.source_patterns}
    merged: dict[str, WeightConverter] = {}
    out: dict[str, torch.Tensor] = {}
    for name, tensor in sorted(state.items(), key=lambda kv: dot_natural_key(kv[0])):
        target, pattern = rename_source_key(name, renamings, converters)
        if pattern is None:
            out[target] = tensor
            continue
        if target not in merged:  # each model tensor gets a converter of its own
            merged[target] = copy.deepcopy(by_pattern[pattern])
        merged[target].add_tensor(target, name, pattern, tensor)  # type: ignore[arg-type]  # a tensor, as transformers passes it when it reverts
    for target, converter in merged.items():
        try:
            result = converter.convert(target, model=model, config=model.config)
        except Exception as exc:  # transformers' ops raise what torch raises on a short list
            raise ValueError(f"cannot build model tensor {target!r}: {exc}") from exc
        for key, value in result.items():
            out[key] = value[0] if isinstance(value, list) else value
    return out
