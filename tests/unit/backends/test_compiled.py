"""The compiled elementwise functions: every one traces into a single graph with dynamic shapes
(the `aot_eager` backend: the graph Inductor would compile, run by aten) and gives what the eager
function gives, at two token counts; a compiler failure leaves the function eager, once
warned; and on a GPU, Inductor's kernels against the eager arithmetic in bf16."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch

from rlpost import switches
from rlpost.backends import compiled, logprobs, rms_norm, rope, swiglu
from rlpost.backends.compiled import Compiled, compile_devices
from rlpost.backends.megatron import kernels

torch.manual_seed(0)


def _rope_args(t: int, interleaved: bool, rot: int = 8, dtype: torch.dtype = torch.float32):
    positions = torch.arange(t) % 5
    inv = kernels.inverse_frequencies(rot, 1.0, 10000.0)
    table = kernels.rope_table(positions, inv, interleaved, dtype)
    return torch.randn(t, 3, 12, dtype=dtype), table.cos, table.sin, interleaved


def _chunk_args(rows: int, entropy: bool, dtype: torch.dtype = torch.float32):
    """A chunk of 11 columns; targets in it, before it (negative slots) and after it."""
    hidden, weight = torch.randn(rows, 6, dtype=dtype), torch.randn(11, 6, dtype=dtype)
    slot = torch.randint(-4, 15, (rows,))
    running = torch.stack((torch.randn(rows), torch.rand(rows) + 1, torch.randn(rows),
                           torch.randn(rows)))  # fmt: skip
    running[0, ::3] = -1e30  # tokens with no column seen yet
    return hidden, weight, slot, running, torch.tensor(0.7), entropy


def _grad_args(rows: int, entropy: bool, dtype: torch.dtype = torch.float32):
    hidden, weight, slot, _, temperature, _ = _chunk_args(rows, entropy, dtype)
    lse = torch.logsumexp((hidden @ weight.t()).float() / temperature, -1) + torch.rand(rows)
    mean_logit = torch.randn(rows)
    grad_logp = torch.randn(rows)
    grad_entropy = torch.randn(rows) if entropy else None
    return hidden, weight, lse, mean_logit, slot, grad_logp, grad_entropy, temperature


CASES: dict[str, tuple[Compiled[..., Any], Callable[..., tuple[Any, ...]]]] = {
    "rope_forward": (rope._rope, lambda t: (*_rope_args(t, False), False)),
    "rope_forward_interleaved": (rope._rope, lambda t: (*_rope_args(t, True), False)),
    "rope_forward_partial": (rope._rope, lambda t: (*_rope_args(t, False, rot=4), False)),
    "rope_backward": (rope._rope, lambda t: (*_rope_args(t, False), True)),
    "rope_backward_interleaved_partial": (
        rope._rope, lambda t: (*_rope_args(t, True, rot=4), True)
    ),
    "swiglu_forward": (swiglu._swiglu_forward, lambda t: (torch.randn(t, 10),)),
    "swiglu_backward": (
        swiglu._swiglu_backward, lambda t: (torch.randn(t, 5), torch.randn(t, 10))
    ),
    "swiglu_pair_forward": (swiglu._pair_forward, lambda t: (torch.randn(t, 5), torch.randn(t, 5))),
    "swiglu_pair_backward": (
        swiglu._pair_backward, lambda t: (torch.randn(t, 5), torch.randn(t, 5), torch.randn(t, 5))
    ),
    "rms_norm_forward": (
        rms_norm._forward, lambda t: (torch.randn(t, 4, 16), torch.rand(16) + 0.5, 1e-6)
    ),
    "rms_norm_backward": (
        rms_norm._backward,
        lambda t: (torch.randn(t, 16), torch.randn(t, 16), torch.rand(16) + 0.5, 1e-6),
    ),
    "chunk_stats": (logprobs._chunk_stats, lambda t: _chunk_args(t, False)),
    "chunk_stats_entropy": (logprobs._chunk_stats, lambda t: _chunk_args(t, True)),
    "chunk_grad": (logprobs._chunk_grad, lambda t: _grad_args(t, False)),
    "chunk_grad_entropy": (logprobs._chunk_grad, lambda t: _grad_args(t, True)),
}  # fmt: skip


def _tensors(result: torch.Tensor | tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return result if isinstance(result, tuple) else (result,)


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_compiled_function_traces_whole_and_matches_eager(name: str) -> None:
    function, make_args = CASES[name]
    torch._dynamo.reset()
    traced = Compiled(function.fn, devices={"cpu"}, backend="aot_eager")
    for tokens in (7, 13):  # a second token count runs the same dynamic graph
        args = make_args(tokens)
        got = traced(*args)
        assert traced.failed is None, traced.failed
        for ours, eager in zip(_tensors(got), _tensors(function.fn(*args)), strict=True):
            assert torch.allclose(ours, eager, rtol=1e-6, atol=1e-6)


def _reference_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool):
    """The rotation written out: each pair (a, b) -> (a cos - b sin, b cos + a sin)."""
    rot = cos.shape[-1]
    head, tail = x[..., :rot], x[..., rot:]
    if interleaved:
        a, b = head[..., 0::2], head[..., 1::2]
        c, s = cos[..., 0::2], sin[..., 0::2]
        out = torch.stack((a * c - b * s, b * c + a * s), -1).flatten(-2)
    else:
        a, b = head.chunk(2, -1)
        c, s = cos[..., : rot // 2], sin[..., : rot // 2]
        out = torch.cat((a * c - b * s, b * c + a * s), -1)
    return torch.cat((out, tail), -1)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rot", [12, 4])
def test_rope_backward_is_the_transpose_of_its_forward(interleaved: bool, rot: int) -> None:
    x, cos, sin, _ = _rope_args(5, interleaved, rot=rot, dtype=torch.float64)
    table = kernels.RopeTable(cos, sin)
    x.requires_grad_(True)
    assert torch.allclose(
        kernels.apply_rope(x, table, interleaved), _reference_rope(x, cos, sin, interleaved)
    )
    assert torch.autograd.gradcheck(lambda v: kernels.apply_rope(v, table, interleaved), (x,))


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_backward_is_exact_for_any_table(interleaved: bool) -> None:
    """Not only for a table whose pairs share an angle (rope_table's, transformers'): the
    backward rotates grad x sin, not grad alone."""
    x = torch.randn(5, 3, 12, dtype=torch.float64, requires_grad=True)
    cos, sin = torch.randn(5, 1, 8, dtype=torch.float64), torch.randn(5, 1, 8, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda v: rope.rope(v, cos, sin, interleaved), (x,))


def test_swiglu_pair_keeps_gate_and_up_and_matches_autograd() -> None:
    gate = torch.randn(2, 6, 5, dtype=torch.float64, requires_grad=True)
    up = torch.randn(2, 6, 5, dtype=torch.float64, requires_grad=True)
    kept: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        out = swiglu.swiglu_pair(gate, up)
    assert out.shape == gate.shape and len(kept) == 2  # gate and up, not silu(gate)
    assert torch.allclose(out, torch.nn.functional.silu(gate) * up)
    assert torch.autograd.gradcheck(swiglu.swiglu_pair, (gate, up))


def test_a_compiler_failure_leaves_the_function_eager_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken_backend(graph: Any, example_inputs: Any) -> Any:
        raise RuntimeError("no compiler here")

    torch._dynamo.reset()
    function = Compiled(swiglu._swiglu_forward.fn, devices={"cpu"}, backend=broken_backend)  # type: ignore[arg-type]
    x = torch.randn(4, 10)
    with caplog.at_level(logging.WARNING, logger=compiled.__name__):
        first, second = function(x), function(x)
    assert torch.equal(first, swiglu._swiglu_forward.fn(x)) and torch.equal(first, second)
    assert function.failed is not None and not function.applies(x)
    warnings = [r for r in caplog.records if "torch.compile failed" in r.getMessage()]
    assert len(warnings) == 1 and "RLPOST_COMPILE=0" in warnings[0].getMessage()


def test_only_cuda_inputs_are_compiled_and_the_switch_turns_it_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compile_devices.cache_clear()
    try:
        assert compile_devices() <= {"cuda"}
        if not torch.cuda.is_available():
            assert compile_devices() == frozenset()
        assert not swiglu._swiglu_forward.applies(torch.randn(2, 4))  # a CPU tensor
        monkeypatch.setenv(switches.COMPILE.name, "0")
        compile_devices.cache_clear()
        assert compile_devices() == frozenset()
    finally:
        monkeypatch.delenv(switches.COMPILE.name)
        compile_devices.cache_clear()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", sorted(CASES))
def test_inductor_kernels_match_the_eager_arithmetic_on_cuda(name: str) -> None:
    function, make_args = CASES[name]
    assert "cuda" in compile_devices()
    for tokens in (300, 517):
        args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in make_args(tokens)]
        args = [a.bfloat16() if isinstance(a, torch.Tensor) and a.dtype == torch.float32
                and a.dim() > 1 else a for a in args]  # fmt: skip
        got = function(*args)
        assert function.failed is None, function.failed
        for ours, eager in zip(_tensors(got), _tensors(function.fn(*args)), strict=True):
            assert ours.dtype == eager.dtype
            assert torch.allclose(ours.float(), eager.float(), rtol=2e-2, atol=2e-2), name
