"""On a CUDA machine the CPU layer stays off and the same trainer runs in bf16 over NCCL.

Skipped without CUDA (the CPU tests cover the logic); run on a GPU machine with
`pytest -m gpu tests/unit/backends/megatron`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from rlpost.backends.megatron.compat import needs_cpu_compat
from rlpost.backends.megatron.trainer import MegatronTrainer
from rlpost.types import TrainSample

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


BF16 = {"params_dtype": "bf16"}


def one_step(trainer: MegatronTrainer, samples: list[TrainSample]) -> dict[str, Any]:
    before = {n: w.clone() for b in trainer.iter_hf_weights() for n, w in b}
    metrics = trainer.train_step(samples)
    after = {n: w.clone() for b in trainer.iter_hf_weights() for n, w in b}
    moved = max(float((after[n].float() - w.float()).abs().max()) for n, w in before.items())
    return {"metrics": metrics, "moved": moved, "compat": needs_cpu_compat()}


def test_trains_on_cuda_in_bf16(
    make_setup: Callable[..., Any], make_rollout: Callable[..., list[TrainSample]]
) -> None:
    result = make_setup("qwen3").with_model(**BF16).run(one_step, make_rollout(8))
    assert not result["compat"]
    assert math.isfinite(result["metrics"]["train/loss"]) and result["moved"] > 0


def offload_round_trip(trainer: MegatronTrainer, samples: list[TrainSample]) -> dict[str, Any]:
    """Step, offload (as around a colocated rollout), onload, step: the second step must see
    the weights and Adam state the first one left."""
    trainer.train_step(samples)
    before = {n: w.clone() for b in trainer.iter_hf_weights() for n, w in b}
    held = torch.cuda.memory_allocated()
    freed = trainer.offload()
    released = held - torch.cuda.memory_allocated()
    trainer.onload()
    after = {n: w.clone() for b in trainer.iter_hf_weights() for n, w in b}
    second = trainer.train_step(samples)
    same = all(torch.equal(before[n], after[n]) for n in before)
    return {"freed": freed, "released": released, "same": same, "loss": second["train/loss"]}


def test_offload_frees_gpu_memory_and_onload_restores_the_state(
    make_setup: Callable[..., Any], make_rollout: Callable[..., list[TrainSample]]
) -> None:
    result = make_setup("qwen3").with_model(**BF16).run(offload_round_trip, make_rollout(8))
    assert result["freed"] > 0 and result["released"] >= result["freed"]
    assert result["same"] and math.isfinite(result["loss"])


def test_grouped_experts_run_torchs_grouped_kernel_in_bf16() -> None:
    """model.moe.grouped_gemm on CUDA: torch's CUTLASS grouped GEMM (bf16), whose products
    and gradients are each expert's own, an expert without tokens included."""
    from rlpost.backends.megatron.layers import grouped_linear

    torch.manual_seed(0)
    counts = [64, 0, 200, 8]
    kw = {"device": "cuda", "dtype": torch.bfloat16}
    x = torch.randn(sum(counts), 256, **kw, requires_grad=True)
    weights = [torch.randn(512, 256, **kw, requires_grad=True) for _ in counts]
    ends = torch.cumsum(torch.tensor(counts, device="cuda"), 0, dtype=torch.int32)
    grad = torch.randn(sum(counts), 512, **kw)
    out = grouped_linear(x, ends, weights)
    out.backward(grad)
    x_ref = x.detach().float().requires_grad_()
    w_ref = [w.detach().float().requires_grad_() for w in weights]
    ref = torch.cat([p @ w.T for p, w in zip(x_ref.split(counts), w_ref, strict=True)])
    ref.backward(grad.float())
    torch.testing.assert_close(out.float(), ref, atol=0.5, rtol=0.02)
    assert x.grad is not None and x_ref.grad is not None
    torch.testing.assert_close(x.grad.float(), x_ref.grad, atol=0.5, rtol=0.02)
    for w, r in zip(weights, w_ref, strict=True):
        assert w.grad is not None and r.grad is not None
        torch.testing.assert_close(w.grad.float(), r.grad, atol=0.5, rtol=0.02)
