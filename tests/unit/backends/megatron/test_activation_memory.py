"""The plan's per-layer activation memory against the bytes a layer really keeps for backward.

One train step on CPU with a saved-tensors hook: every tensor autograd keeps during the forward
pass (up to the loss, so before backward starts), counted once per storage and leaving out the
parameters. A model of one layer more minus the model without it is one layer's share; each
family and recompute mode is measured at two token counts, so a constant that happened to fit
one count would not pass. The plan's term (rlpost.plan.memory) must be within 10%.

Not covered here: multi-latent attention, whose query and value head sizes differ, so torch's
CPU SDPA falls back to its math kernel and keeps the attention matrix, which the flash and
memory-efficient kernels on a GPU do not.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import Qwen3ForCausalLM

from rlpost.backends.megatron.trainer import MegatronTrainer
from rlpost.plan.memory import layer_activation_bytes, layer_input_bytes
from rlpost.schema import ModelConfig
from rlpost.types import TrainSample

from . import tiny_checkpoints as tiny
from .conftest import Setup, configs, layout

SAMPLES = 4


def wide_qwen3(path: Path, *, layers: int) -> ModelConfig:
    """Qwen3 whose attention is twice the hidden size wide (as Qwen3-0.6B's is)."""
    hf = {"num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 96,
          "rope_theta": 1000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True}  # fmt: skip
    return tiny._build(path, Qwen3ForCausalLM, layers, 0, hf, family="qwen3",
                       num_query_groups=2, kv_channels=32, ffn_hidden_size=96,
                       rotary_base=1000.0, norm_epsilon=1e-6, qk_layernorm=True,
                       tie_word_embeddings=True)  # fmt: skip


FAMILIES: dict[str, tuple[Callable[..., ModelConfig], int]] = {
    # builder, layers of the smaller model (its extra layer is the one measured)
    "qwen3": (wide_qwen3, 1),
    "glm4": (tiny.glm4, 1),
    "glm4_moe": (tiny.glm4_moe, 1),  # the first layer is dense, the measured one MoE
}


def kept_for_backward(trainer: MegatronTrainer, samples: list[TrainSample]) -> int:
    parameters = {p.untyped_storage().data_ptr() for p in trainer.model.parameters()}
    seen: dict[int, int] = {}
    forward = {"done": False}
    loss = trainer._train_loss

    def loss_marks_the_end(*args: Any, **kwargs: Any) -> Any:
        forward["done"] = True
        return loss(*args, **kwargs)

    trainer._train_loss = loss_marks_the_end  # type: ignore[method-assign]

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if not forward["done"] and storage.data_ptr() not in parameters:
            seen.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        metrics = trainer.train_step(samples)
    assert metrics["train/micro_batches"] == 1
    return sum(seen.values())


def equal_samples(length: int) -> list[TrainSample]:
    rng = random.Random(length)
    return [TrainSample([rng.randrange(2, tiny.VOCAB) for _ in range(length)], length // 2,
                        rng.choice([-1.0, 1.0])) for _ in range(SAMPLES)]  # fmt: skip


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_plan_counts_what_a_layer_keeps_for_backward(
    family: str, recompute: str, tmp_path: Path
) -> None:
    build, base = FAMILIES[family]
    models = {n: build(tmp_path / f"layers{n}", layers=n) for n in (base, base + 1)}
    for length in (32, 96):
        tokens = SAMPLES * length
        kept = {}
        for n, model in models.items():
            setup = Setup(model, configs(SAMPLES, train={"max_tokens_per_gpu": tokens}),
                          layout(recompute=recompute))  # fmt: skip
            kept[n] = setup.run(kept_for_backward, equal_samples(length))
        measured = kept[base + 1] - kept[base]
        model, par = models[base + 1], layout(recompute=recompute)
        if recompute == "full":
            planned = layer_input_bytes(model, tokens, par)
        else:
            planned = layer_activation_bytes(model, base, tokens, par, recompute)
        assert 0.9 <= measured / planned <= 1.1, (family, recompute, tokens, measured, planned)
