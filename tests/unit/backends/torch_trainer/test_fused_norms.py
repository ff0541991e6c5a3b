"""transformers' RMSNorm modules routed through rlpost.backends.rms_norm, as the torch trainer
does on CUDA. The fused kernels have no CPU implementation: here torch's reference
decompositions of the fused ops stand in for them (test_activation_memory.fused_on_cpu). The
trainer's steps with them: test_kernels.py."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

from rlpost.backends import rms_norm
from rlpost.backends.torch_trainer.model_io import load_causal_lm


def test_standard_norms_run_rms_norm_with_the_same_output_and_gemmas_stay(
    tiny_model_dir: Path,
) -> None:
    model = load_causal_lm(tiny_model_dir)
    keys = list(model.state_dict())
    ids = torch.tensor([[3, 9, 4, 17, 2, 40]])
    before = model(input_ids=ids).logits
    # two layers of Qwen3: the input, post-attention, query and key norms, and the final one
    assert rms_norm.fuse_rms_norms(model) == 2 * 4 + 1
    assert torch.allclose(model(input_ids=ids).logits, before, rtol=1e-5, atol=1e-5)
    assert list(model.state_dict()) == keys
    assert rms_norm._standard_eps(GemmaRMSNorm(8)) is None  # weight is 1 + its parameter
    assert rms_norm._standard_eps(ScaledRMSNorm(8, config=Scale(2.0))) is None


class Scale:
    def __init__(self, value: float) -> None:
        self.value = value


class ScaledRMSNorm(torch.nn.Module):
    """A norm whose class cannot be built from a width and an epsilon alone (it reads a
    config): the probe fails, and the module keeps its own forward."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, config: Scale | None = None) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps
        self.scale = config.value  # type: ignore[union-attr]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
