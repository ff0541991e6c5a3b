"""With the same weights, megatron-core's per-token logprobs equal the HF model's (fp32, CPU).

Each architecture the backend builds: dense Qwen3 (QK norm, GQA, tied and untied
embeddings), dense GLM-4 (qkv bias, post norms, half interleaved RoPE), GLM-4.5-style MoE
(dense first layer, sigmoid router with expert bias, top-k scaling, shared expert) and
GLM-4.7-Flash-style multi-latent attention; and RoPE context extension: Llama 3.1's, YaRN on
rlpost's rotary table (Qwen3) and in megatron-core's multi-latent attention (DeepSeek-V3's
mscales). Megatron runs the samples packed into one row;
HF runs them one by one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
from torch import Tensor
from transformers import AutoModelForCausalLM

from rlpost.backends.megatron.trainer import MegatronTrainer
from rlpost.types import TrainSample

TOLERANCE = 1e-4


def megatron_logprobs(trainer: MegatronTrainer, samples: list[TrainSample]) -> list[Tensor]:
    return trainer.compute_logprobs(samples)


def hf_logprobs(model_dir: str, samples: Sequence[TrainSample]) -> list[Tensor]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for sample in samples:
            ids = torch.tensor([sample.tokens])
            log_probs = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
            targets = ids[0, 1:].unsqueeze(-1)
            out.append(log_probs.gather(-1, targets).squeeze(-1)[-sample.response_length :])
    return out


ARCHITECTURES = ["qwen3", "qwen3_untied", "glm4", "glm4_moe", "glm4_moe_lite"]
SCALED_ROPE = ["llama_llama3_rope", "qwen3_yarn", "glm4_moe_lite_yarn"]


@pytest.mark.parametrize("arch", ARCHITECTURES + SCALED_ROPE)
def test_logprobs_match_hf(
    arch: str, make_setup: Callable[..., Any], make_rollout: Callable[..., list[TrainSample]]
) -> None:
    setup, samples = make_setup(arch), make_rollout(6, seed=3)
    ours = setup.run(megatron_logprobs, samples)
    theirs = hf_logprobs(setup.model.hf_checkpoint, samples)
    worst = max(float((a - b).abs().max()) for a, b in zip(ours, theirs, strict=True))
    assert [len(t) for t in ours] == [s.response_length for s in samples]
    assert worst <= TOLERANCE, f"{arch}: max |logp diff| = {worst:.2e}"
