"""Each of the layer's kernels against the arithmetic it replaces: megatron-core's RoPE (full and
partial, interleaved or not), megatron-core's unfused SwiGLU, HF's RMSNorm, and torch's unfused
AdamW against the fused one switched on inside megatron-core's optimizer wrappers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

from rlpost.backends import rms_norm
from rlpost.backends.megatron import kernels
from rlpost.backends.megatron.compat import cpu_compat


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("percent", [1.0, 0.5])
def test_rope_table_matches_megatron_rotary_embedding(interleaved: bool, percent: float) -> None:
    head_dim, heads, base = 16, 3, 10000.0
    positions = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2, 7, 5])  # packed samples, CP-style gaps
    x = torch.randn(len(positions), heads, head_dim, dtype=torch.float64)
    rotary = RotaryEmbedding(head_dim, percent, interleaved, rotary_base=int(base),
                             use_cpu_initialization=True)  # fmt: skip
    with cpu_compat():  # get_emb moves inv_freq to CUDA
        freqs = rotary.get_emb(int(positions.max()) + 1)[positions, 0]  # [t, 1, rot]
    # megatron-core's THD path applies the bshd arithmetic to [t, 1, heads, d]
    expected = _apply_rotary_pos_emb_bshd(
        x.unsqueeze(1), freqs.double().unsqueeze(1), rotary_interleaved=interleaved
    ).squeeze(1)
    inv = kernels.inverse_frequencies(head_dim, percent, base)
    assert torch.equal(inv, rotary.inv_freq)
    table = kernels.rope_table(positions, inv, interleaved, torch.float64)
    assert torch.allclose(kernels.apply_rope(x, table, interleaved), expected, atol=1e-6)


def test_swiglu_matches_silu_gate_times_up_and_keeps_only_its_input() -> None:
    x = torch.randn(7, 2 * 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(kernels.swiglu, (x,))
    gate, up = x.detach().chunk(2, dim=-1)
    assert torch.allclose(kernels.swiglu(x), F.silu(gate) * up)
    kept: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        kernels.swiglu(x)
    assert [t.shape for t in kept] == [x.shape]


def test_rms_norm_matches_hf_arithmetic_and_keeps_only_its_input() -> None:
    x = torch.randn(2, 6, 32, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(32, dtype=torch.float64, requires_grad=True)
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert torch.allclose(kernels.rms_norm(x, weight, 1e-6), weight * h, atol=1e-12)
    assert torch.autograd.gradcheck(lambda a, b: kernels.rms_norm(a, b, 1e-6), (x, weight))
    kept: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        kernels.rms_norm(x, weight, 1e-6)
    assert [t.shape for t in kept] == [x.shape, weight.shape]


def _reference_rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The unfused path (what CPUs and torch builds without the fused ops run)."""
    h = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
    return (weight.float() * h).to(x.dtype)


def _rms_norm_step(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Output, input and weight gradients, and the tensors kept for backward."""
    x, weight = x.detach().requires_grad_(), weight.detach().requires_grad_()
    kept: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        out = kernels.rms_norm(x, weight, 1e-6)
    upstream = torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out).to(out.dtype)
    grad_x, grad_w = torch.autograd.grad(out, (x, weight), upstream)
    return out, grad_x, grad_w, *kept


def test_the_fused_rms_norm_path_calls_torchs_ops_as_their_schema_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fused path runs torch's fused ops on CUDA only (no CPU kernel); here their
    reference decompositions stand in for the CUDA kernels, so the call convention (arguments,
    the output mask, what rstd is) is checked against the unfused path on CPU."""
    from torch._decomp import decompositions

    fused = (decompositions._fused_rms_norm, decompositions._fused_rms_norm_backward)
    for dtype, tol in ((torch.float64, 1e-5), (torch.bfloat16, 2e-2)):  # the plain backward: fp32
        x = torch.randn(3, 5, 4, 32, dtype=torch.float64).to(dtype)  # [t, heads, d]: QK-norm
        weight = (1 + 0.1 * torch.randn(32, dtype=torch.float64)).to(dtype)
        plain = _rms_norm_step(x, weight)
        with monkeypatch.context() as patch:
            patch.setattr(rms_norm, "FUSED_RMS_NORM", fused)
            patch.setattr(rms_norm, "FUSED_RMS_NORM_DEVICES", frozenset({"cpu"}))
            out, grad_x, grad_w, *kept = _rms_norm_step(x, weight)
        for ours, theirs in zip((out, grad_x, grad_w), plain[:3], strict=True):
            assert ours.dtype == theirs.dtype
            assert torch.allclose(ours.double(), theirs.double(), rtol=tol, atol=tol)
        assert [t.shape for t in kept] == [x.shape, weight.shape, (3, 5, 4, 1)]
        assert kept[2].dtype == torch.float32 or dtype == torch.float64  # rstd


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_rms_norm_runs_torchs_fused_kernels_on_cuda() -> None:
    assert "cuda" in rms_norm.FUSED_RMS_NORM_DEVICES, torch.__version__
    x = torch.randn(4096, 8, 128, device="cuda", dtype=torch.bfloat16)
    weight = 1 + 0.1 * torch.randn(128, device="cuda", dtype=torch.bfloat16)
    out, grad_x, grad_w, *kept = _rms_norm_step(x, weight)
    assert len(kept) == 3 and kept[2].dtype == torch.float32  # the input, weight and rstd
    assert torch.allclose(out.float(), _reference_rms_norm(x, weight).float(), atol=3e-2)
    ref_x, ref_w = x.double().requires_grad_(), weight.double().requires_grad_()
    ref = _reference_rms_norm(ref_x, ref_w)
    upstream = torch.linspace(-1, 1, ref.numel(), device="cuda").view_as(ref).double()
    want_x, want_w = torch.autograd.grad(ref, (ref_x, ref_w), upstream)
    assert torch.allclose(grad_x.double(), want_x, rtol=3e-2, atol=3e-2)
    assert torch.allclose(grad_w.double(), want_w, rtol=3e-2, atol=0.5)


class _Wrapper:
    """megatron-core's optimizer wrappers hold the torch optimizer as `.optimizer`."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer


def test_fused_adam_takes_the_same_steps() -> None:
    torch.manual_seed(0)
    params = [torch.randn(5, 3), torch.randn(4)]
    runs = []
    for fused in (False, True):
        ps = [p.clone().requires_grad_(True) for p in params]
        opt = torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1)
        if fused:
            assert kernels.fuse_adam(_Wrapper(opt), devices=("cpu",)) == 1
            assert all(g["fused"] for g in opt.param_groups)
        for step in range(3):
            for p in ps:
                p.grad = torch.sin(p.detach() * (step + 1))
            opt.step()
        runs.append([p.detach() for p in ps])
    for plain, fused_p in zip(*runs, strict=True):
        assert torch.allclose(plain, fused_p, atol=1e-6)


def test_fused_adam_leaves_optimizers_off_the_named_devices_alone() -> None:
    opt = torch.optim.AdamW([torch.randn(3, requires_grad=True)])
    assert kernels.fuse_adam(_Wrapper(opt)) == 0  # CPU parameters, CUDA only
    assert not opt.param_groups[0]["fused"]
