"""Loading safetensors weights into a live model, and dropping them to free memory.

Weights are assigned by parameter name. Tied parameters (an embedding shared with the LM
head) are one tensor under several names; a checkpoint may carry any one of the names. A
persistent buffer (DeepSeek-V3's and GLM-4.5's router expert bias, which the megatron trainer
updates) is a checkpoint tensor too and is assigned like a parameter, in its own dtype; a
checkpoint without one leaves it as it is, and a non-persistent buffer (a rotary embedding's
`inv_freq`, which some old checkpoints carry) is never read from one.
Checkpoints and updates come in the checkpoint's layout (per-expert tensors of an MoE layer
that transformers stacks into one): `rlpost.backends.hf_names` converts them to the model's.
"""

from __future__ import annotations

import torch
from torch import nn

from rlpost.backends.hf_load import WeightLoadError, read_safetensors_dir, read_weights
from rlpost.backends.hf_names import merged_names, persistent_buffers, to_model

__all__ = ["ModelWeights", "WeightLoadError", "read_safetensors_dir", "read_weights"]


class ModelWeights:
    """Assigns checkpoint tensors to a model's parameters, remembering their shapes so that
    weights can be released (storage freed) and later assigned again."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        named = list(model.named_parameters(remove_duplicate=False))
        self._groups: dict[int, list[str]] = {}
        self._params: dict[int, nn.Parameter] = {}
        for name, param in named:
            self._groups.setdefault(id(param), []).append(name)
            self._params[id(param)] = param
        self._shapes = {name: tuple(param.shape) for name, param in named}
        self._dtype = next(iter(self._params.values())).dtype
        self._buffers = {name for name, _ in model.named_buffers()}
        self._persistent = persistent_buffers(model)
        self.released = False
        # checkpoint tensors of a bucketed update that wait for the rest of their model tensor
        self._waiting: dict[str, torch.Tensor] = {}
        from transformers import PreTrainedModel

        # an HF model converts from its checkpoint's layout; another is named as it holds them
        self._hf = model if isinstance(model, PreTrainedModel) else None

    def _as_model(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self._hf is None:
            return state
        try:
            return to_model(self._hf, state)
        except ValueError as exc:
            raise WeightLoadError(str(exc)) from None

    def assign(self, state: dict[str, torch.Tensor]) -> None:
        """Replace every parameter with the checkpoint's tensor of the same name (checkpoint
        names and layout, converted to the model's)."""
        state = self._as_model(state)
        unexpected = sorted(k for k in state if k not in self._shapes and k not in self._buffers)
        if unexpected:
            raise WeightLoadError(
                f"checkpoint has {len(unexpected)} tensor(s) the model does not, e.g. "
                f"{unexpected[:3]}; is it a checkpoint of another architecture?"
            )
        chosen: dict[int, str] = {}
        missing: list[str] = []
        for key, names in self._groups.items():
            found = next((n for n in names if n in state), None)
            if found is None:
                missing.append(names[0])
                continue
            shape = tuple(state[found].shape)
            if shape != self._shapes[found]:
                raise WeightLoadError(
                    f"tensor '{found}' has shape {list(shape)} in the checkpoint but "
                    f"{list(self._shapes[found])} in the model"
                )
            chosen[key] = found
        if missing:
            raise WeightLoadError(
                f"checkpoint lacks {len(missing)} parameter(s), e.g. {missing[:3]}"
            )
        buffers = {n: t for n, t in state.items() if n in self._persistent}
        self._check_buffers(buffers, "checkpoint")
        for key, name in chosen.items():
            self._params[key].data = state[name].to(self._dtype).contiguous()
        self._assign_buffers(buffers)
        self.released = False

    def assign_some(self, state: dict[str, torch.Tensor], last: bool = False) -> None:
        """Replace only the named parameters (one bucket of a distributed update, checkpoint
        names and layout). A tensor that is one of several making a model tensor waits for
        the others; the update's `last` bucket (or `finish_update`) assigns them."""
        if self.released:
            raise WeightLoadError("the weights are released; resume them before an update")
        if self._hf is not None:
            merged = merged_names(self._hf, state)
            self._waiting.update((n, state[n]) for n in merged)
            state = self._as_model({n: t for n, t in state.items() if n not in merged})
        self._assign_model_tensors(state)
        if last:
            self.finish_update()

    def finish_update(self) -> None:
        """The end of a bucketed update: the waiting checkpoint tensors, merged into their
        model tensors and assigned; a group with members missing is refused."""
        waiting, self._waiting = self._waiting, {}
        if waiting:
            self._assign_model_tensors(self._as_model(waiting))

    def _check_buffers(self, buffers: dict[str, torch.Tensor], source: str) -> None:
        for name, tensor in buffers.items():
            if tensor.shape != self._persistent[name].shape:
                raise WeightLoadError(
                    f"tensor '{name}' has shape {list(tensor.shape)} in the {source} but "
                    f"{list(self._persistent[name].shape)} in the model"
                )

    def _assign_buffers(self, buffers: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, tensor in buffers.items():
                self._persistent[name].copy_(tensor)

    def _assign_model_tensors(self, state: dict[str, torch.Tensor]) -> None:
        buffers = {n: t for n, t in state.items() if n in self._persistent}
        self._check_buffers(buffers, "update")
        state = {n: t for n, t in state.items() if n not in self._buffers}
        for name, tensor in state.items():
            if name not in self._shapes:
                raise WeightLoadError(f"the model has no parameter '{name}'")
            if tuple(tensor.shape) != self._shapes[name]:
                raise WeightLoadError(
                    f"tensor '{name}' has shape {list(tensor.shape)} in the update but "
                    f"{list(self._shapes[name])} in the model"
                )
        by_name = {n: key for key, names in self._groups.items() for n in names}
        for name, tensor in state.items():
            self._params[by_name[name]].data = tensor.to(self._dtype).contiguous()
        self._assign_buffers(buffers)

    def release(self) -> None:
        """Free every parameter's storage; `assign` must run before the model is used."""
        for param in self._params.values():
            param.data = torch.empty(0, dtype=self._dtype)
        self.released = True
