"""Tiny dense and MoE models train under TP, PP, DP, CP and EP on 2 CPU ranks (gloo) exactly
as on one: the same logprobs before the step, the same loss at step 1, and after the step the
same weights once gathered back to HF names.

The reference is a single-process run of the same trainer; test_trainer.py ties that to the
torch backend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from rlpost.backends.megatron.trainer import MegatronTrainer
from rlpost.types import TrainSample

LOSS_TOLERANCE = 1e-5
WEIGHT_TOLERANCE = 1e-5
LOGPROB_TOLERANCE = 1e-5


def train_once(trainer: MegatronTrainer, samples: list[TrainSample]) -> dict[str, Any]:
    """Logprobs, one rollout's training step, then the weights in HF names (small buckets)."""
    logprobs = trainer.compute_logprobs(samples)
    metrics = trainer.train_step(samples)
    weights = dict(kv for b in trainer.iter_hf_weights(bucket_bytes=16 << 10) for kv in b)
    return {"logprobs": logprobs, "metrics": metrics, "weights": weights}


# (architecture, layout); MoE with TP needs sequence parallelism, and EP ranks are DP ranks
CASES = {
    "dense-tp2-sp": ("qwen3", {"tp": 2, "sequence_parallel": True}),
    "dense-tp2": ("glm4", {"tp": 2}),
    "dense-pp2": ("qwen3", {"pp": 2}),
    "dense-pp2-recompute": ("qwen3", {"pp": 2, "recompute": "full"}),
    "dense-dp2": ("qwen3", {"dp": 2}),
    "dense-cp2": ("glm4", {"cp": 2}),
    "moe-ep2": ("glm4_moe", {"ep": 2, "dp": 2}),
    "moe-tp2-etp2-sp": ("glm4_moe", {"tp": 2, "etp": 2, "sequence_parallel": True}),
    "moe-tp2-etp2-sp-recompute": (
        "glm4_moe",
        {"tp": 2, "etp": 2, "sequence_parallel": True, "recompute": "full"},
    ),
    "moe-pp2": ("glm4_moe", {"pp": 2}),
    "moe-dp2": ("glm4_moe", {"dp": 2}),
    "mla-ep2": ("glm4_moe_lite", {"ep": 2, "dp": 2}),
    "mla-tp2-ep2-sp": ("glm4_moe_lite", {"tp": 2, "ep": 2, "sequence_parallel": True}),
    "mla-cp2": ("glm4_moe_lite", {"cp": 2}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_two_ranks_match_one(
    case: str,
    make_setup: Callable[..., Any],
    make_rollout: Callable[..., list[TrainSample]],
    reference_and_run: Callable[..., tuple[Any, Any]],
    hf_tensors: Callable[[str], dict[str, torch.Tensor]],
) -> None:
    arch, sizes = CASES[case]
    setup = make_setup(arch, **sizes)
    reference, result = reference_and_run(setup, train_once, make_rollout(8, seed=11))

    logp_diff = max(
        float((a - b).abs().max())
        for a, b in zip(result["logprobs"], reference["logprobs"], strict=True)
    )
    assert logp_diff <= LOGPROB_TOLERANCE
    for key in ("train/loss", "train/pg_loss", "train/entropy", "train/grad_norm"):
        assert abs(result["metrics"][key] - reference["metrics"][key]) <= LOSS_TOLERANCE, key
    assert result["metrics"]["train/grad_norm"] > 1.0  # clipping took part
    assert result["weights"].keys() == reference["weights"].keys()
    worst = max(
        float((result["weights"][n] - w).abs().max()) for n, w in reference["weights"].items()
    )
    assert worst <= WEIGHT_TOLERANCE, f"{case}: max |weight diff| = {worst:.2e}"
    initial = hf_tensors(setup.model.hf_checkpoint)
    moved = max(float((reference["weights"][n] - w).abs().max()) for n, w in initial.items())
    assert moved > 1e-4  # the step changed the weights, so equal weights mean equal steps


def test_expert_ranks_with_unequal_micro_batch_counts(
    make_setup: Callable[..., Any], reference_and_run: Callable[..., tuple[Any, Any]]
) -> None:
    """Balanced over 2 DP ranks, one long sample faces three short ones: the long one's rank
    needs one micro-batch, the other two, and expert all-to-alls need both ranks in step (the
    first rank runs an empty micro-batch)."""
    lengths = [40, 6, 6, 6]
    samples = [
        TrainSample([2 + (7 * i + j) % 90 for j in range(n)], n // 2, float(i % 2), None, None)
        for i, n in enumerate(lengths)
    ]
    train = {"max_tokens_per_gpu": 12, "balance_data": True}
    setup = make_setup("glm4_moe", 4, train=train, ep=2, dp=2)
    single, result = reference_and_run(setup, train_once, samples)
    assert result["metrics"]["train/micro_batches"] == 2  # this rank's, after evening out
    assert abs(result["metrics"]["train/loss"] - single["metrics"]["train/loss"]) <= LOSS_TOLERANCE
    worst = max(float((result["weights"][n] - w).abs().max()) for n, w in single["weights"].items())
    assert worst <= WEIGHT_TOLERANCE
