"""model.moe.grouped_gemm: the megatron trainer's experts as grouped GEMMs
(layers.GroupedExperts) compute what SequentialMLP's one-expert-at-a-time GEMMs compute, with
the same parameters; `false` keeps SequentialMLP."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from megatron.core.transformer.moe.experts import SequentialMLP

from rlpost.backends.megatron.layers import GroupedExperts, grouped_linear
from rlpost.backends.megatron.trainer import MegatronTrainer
from rlpost.types import TrainSample


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_linear_is_each_experts_own_product_forward_and_backward(
    dtype: torch.dtype,
) -> None:
    torch.manual_seed(0)
    counts = [3, 0, 7, 1]  # an expert without tokens gets a zero gradient
    x = torch.randn(sum(counts), 16, dtype=dtype, requires_grad=True)
    weights = [torch.randn(24, 16, dtype=dtype, requires_grad=True) for _ in counts]
    ends = torch.cumsum(torch.tensor(counts), 0, dtype=torch.int32)
    grad = torch.randn(sum(counts), 24, dtype=dtype)

    out = grouped_linear(x, ends, weights)
    out.backward(grad)
    got = (out.detach(), x.grad, *(w.grad for w in weights))

    x_ref = x.detach().clone().requires_grad_()
    w_ref = [w.detach().clone().requires_grad_() for w in weights]
    ref = torch.cat([p @ w.T for p, w in zip(x_ref.split(counts), w_ref, strict=True)])
    ref.backward(grad)
    want = (ref.detach(), x_ref.grad, *(w.grad for w in w_ref))

    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 0.1, "rtol": 0.02}
    for a, b in zip(got, want, strict=True):
        assert a is not None and b is not None
        torch.testing.assert_close(a, b, **tol)
    assert weights[1].grad is not None and not weights[1].grad.any()


def _step(trainer: MegatronTrainer, samples: list[TrainSample]) -> dict[str, Any]:
    experts = {type(m) for m in trainer.model.modules() if isinstance(m, SequentialMLP)}
    logprobs = trainer.compute_logprobs(samples)
    metrics = trainer.train_step(samples)
    weights = dict(kv for bucket in trainer.iter_hf_weights() for kv in bucket)
    return {"experts": experts, "logprobs": logprobs, "metrics": metrics, "weights": weights}


def test_grouped_and_sequential_experts_train_alike(
    make_setup: Callable[..., Any], make_rollout: Callable[..., list[TrainSample]]
) -> None:
    setup, samples = make_setup("glm4_moe", 4), make_rollout(4, seed=5)
    assert setup.model.moe.grouped_gemm  # the default, as slime's MoE scripts set it
    grouped = setup.run(_step, samples)
    one_by_one = setup.with_model(
        moe=setup.model.moe.model_copy(update={"grouped_gemm": False})
    ).run(_step, samples)
    assert grouped["experts"] == {GroupedExperts}
    assert one_by_one["experts"] == {SequentialMLP}
    for a, b in zip(grouped["logprobs"], one_by_one["logprobs"], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    for key in ("train/loss", "train/grad_norm"):
        assert grouped["metrics"][key] == pytest.approx(one_by_one["metrics"][key], rel=1e-5)
    assert grouped["weights"].keys() == one_by_one["weights"].keys()
    for name, weight in grouped["weights"].items():
        torch.testing.assert_close(weight, one_by_one["weights"][name], atol=1e-5, rtol=1e-5)
