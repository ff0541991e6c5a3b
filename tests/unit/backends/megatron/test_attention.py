"""Attention over packed samples (kernels.packed_attention): the boundaries the packer carries,
the selection rule between torch's varlen flash kernel and padded SDPA (where the varlen kernel
applies, the padded path for micro-batches it measured faster on, with their padding counted),
and, on a CUDA GPU, the varlen kernel against the padded path in bf16 (forward and the q, k, v
gradients) with GQA."""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from rlpost import switches
from rlpost.backends import sdpa
from rlpost.backends.megatron import kernels
from rlpost.backends.megatron.batches import build_micro_batch
from rlpost.backends.megatron.packed import AttentionIndex
from rlpost.backends.megatron.trainer import MegatronTrainer
from rlpost.types import TrainSample

from . import tiny_checkpoints as tiny
from .conftest import Setup, configs, layout
from .test_activation_memory import use_cpu_varlen

LENGTHS = (1, 37, 200, 64, 5, 130)  # ragged: one padded batch would be 6 x 200 for 437 tokens
HEADS, GROUPS, HEAD_DIM = 8, 2, 64  # GQA: four query heads per key/value head


def ragged_samples(lengths: tuple[int, ...] = LENGTHS) -> list[TrainSample]:
    return [TrainSample([2 + i % 50 for i in range(n)], n // 2, 1.0) for n in lengths]


def packed_index(lengths: tuple[int, ...] = LENGTHS, **layout: int) -> AttentionIndex:
    samples = ragged_samples(lengths)
    index = build_micro_batch(samples, list(range(len(samples))), **layout).packed.attention
    assert index is not None
    return index


def qkv(tokens: int, dtype: torch.dtype, device: str = "cpu") -> list[torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(0)
    return [
        torch.randn(tokens, heads, HEAD_DIM, generator=gen, device=device).to(dtype)
        for heads in (HEADS, GROUPS, GROUPS)
    ]


def test_packer_carries_each_samples_contiguous_rows_without_cp() -> None:
    index = packed_index()
    assert index.cu_seqlens is not None and index.cu_seqlens.dtype == torch.int32
    assert index.cu_seqlens.diff().tolist() == list(LENGTHS)
    assert index.max_seqlen == max(LENGTHS) == index.groups[0].rows.shape[1]
    # the padded path's groups (padded_groups: 200 with 130, then one each) hold the same runs
    groups = [[2, 5], [3], [1], [4], [0]]
    assert [tuple(g.rows.shape) for g in index.groups] == [
        (2, 200),
        (1, 64),
        (1, 37),
        (1, 5),
        (1, 1),
    ]
    for members, group in zip(groups, index.groups, strict=True):
        for entry, s in enumerate(members):
            start, n = int(index.cu_seqlens[s]), LENGTHS[s]
            assert group.rows[entry, :n].tolist() == list(range(start, start + n))
    # sequence parallelism over 4 ranks appends a pad sample: it is a run of its own
    sp = packed_index(tp_size=4, sequence_parallel=True)
    assert sp.cu_seqlens is not None
    pad = -sum(LENGTHS) % 4
    assert sp.cu_seqlens.diff().tolist() == [*LENGTHS, pad] and sp.max_seqlen == max(LENGTHS)
    # under context parallelism a rank holds two chunks of each sample and attends to keys
    # gathered from the group: no boundaries, so the padded path with its mask
    for rank in (0, 1):
        cp = packed_index(cp_rank=rank, cp_size=2)
        assert cp.cu_seqlens is None and cp.max_seqlen == 0 and cp.gathered_keys
        assert all(g.mask is not None and g.keys is not None for g in cp.groups)


def test_selection_rule_takes_the_padded_path_on_cpu() -> None:
    index = packed_index()
    for dtype in (torch.bfloat16, torch.float32):
        q, k, v = qkv(sum(LENGTHS), dtype)
        assert not kernels.varlen_applies(q, k, v, index, dropout_p=0.0)
        out = kernels.packed_attention(q, k, v, index, scale=HEAD_DIM**-0.5)
        assert torch.equal(out, kernels.padded_attention(q, k, v, index, scale=HEAD_DIM**-0.5))
    # the padded path is causal attention within each sample, with GQA
    q, k, v = qkv(sum(LENGTHS), torch.float64)
    out = kernels.packed_attention(q, k, v, index, scale=HEAD_DIM**-0.5)
    expected = []
    cu = index.cu_seqlens.tolist()
    for start, end in itertools.pairwise(cu):
        part = [t[start:end].transpose(0, 1) for t in (q, k, v)]
        each = F.scaled_dot_product_attention(*part, is_causal=True, enable_gqa=True)
        expected.append(each.transpose(0, 1).flatten(1))
    torch.testing.assert_close(out, torch.cat(expected))
    # the varlen kernel refuses a micro-batch without boundaries, naming the fallback
    cp = packed_index(cp_rank=0, cp_size=2)
    with pytest.raises(ValueError, match="padded path"):
        kernels.varlen_attention(q, k, v, cp, scale=1.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_varlen_matches_the_padded_path_on_cuda_in_bf16() -> None:
    """Both bf16 paths against the padded path in float32: the varlen kernel's error in the
    output and in each gradient is at most twice the padded bf16 path's plus 1% of the largest
    value, and the two bf16 paths agree within 4% of it (bf16 keeps 8 bits of mantissa; the
    padded path's own error in dv, summed over 200 queries, is about 1% on CPU)."""
    device = torch.device("cuda")
    samples = ragged_samples()
    index = build_micro_batch(samples, list(range(len(samples)))).to(device).packed.attention
    assert index is not None and index.cu_seqlens is not None and index.cu_seqlens.is_cuda
    tokens, scale = sum(LENGTHS), 1.0 / math.sqrt(HEAD_DIM)
    inputs = qkv(tokens, torch.float32, "cuda")
    grad = torch.randn(tokens, HEADS * HEAD_DIM, device=device)

    def run(attention: Callable[..., torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
        q, k, v = (t.to(dtype, copy=True).requires_grad_() for t in inputs)
        out = attention(q, k, v, index, scale=scale)
        out.backward(grad.to(dtype))
        return [t.detach().float() for t in (out, q.grad, k.grad, v.grad)]

    bf16 = [t.to(torch.bfloat16) for t in inputs]
    assert kernels.varlen_applies(*bf16, index, dropout_p=0.0)
    assert not kernels.varlen_applies(*bf16, index, dropout_p=0.1)
    assert not kernels.varlen_applies(*inputs, index, dropout_p=0.0)  # float32
    varlen = run(kernels.packed_attention, torch.bfloat16)
    padded = run(kernels.padded_attention, torch.bfloat16)
    exact = run(kernels.padded_attention, torch.float32)
    for name, fast, slow, ref in zip(("out", "dq", "dk", "dv"), varlen, padded, exact, strict=True):
        assert torch.isfinite(fast).all(), name
        top = float(ref.abs().max())
        fast_err, slow_err = float((fast - ref).abs().max()), float((slow - ref).abs().max())
        assert fast_err <= 2 * slow_err + 1e-2 * top, (name, fast_err, slow_err, top)
        torch.testing.assert_close(fast, slow, atol=4e-2 * top, rtol=0, msg=name)


def test_padded_work_is_the_padded_batchs_attention_over_the_samples() -> None:
    assert packed_index((64, 64, 64)).padded_work == 1.0
    ragged = packed_index()
    # the groups (200 with 130, then one each) pad only 130 to 200
    padded = 2 * 200**2 + sum(n * n for n in (64, 37, 5, 1))
    assert ragged.padded_work == pytest.approx(padded / sum(n * n for n in LENGTHS))
    assert packed_index(cp_rank=0, cp_size=2).padded_work == 0.0  # CP: the padded path anyway


@pytest.fixture
def on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """packed_attention as on a GPU where the varlen kernel applies: the kernel stood in for by
    the padded path (the same function), each call of either recorded; no speed measured yet."""
    calls: list[str] = []
    padded = kernels.padded_attention

    def varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, index: AttentionIndex,
               *, scale: float) -> torch.Tensor:  # fmt: skip
        calls.append("varlen")
        return padded(q, k, v, index, scale=scale)

    def recorded(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append("padded")
        return padded(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(kernels, "varlen_applies", lambda *args: True)
    monkeypatch.setattr(kernels, "varlen_attention", varlen)
    monkeypatch.setattr(kernels, "padded_attention", recorded)
    monkeypatch.setattr(kernels, "_padded_speedups", {})
    monkeypatch.setattr(kernels, "MEASURE_MIN_TOKENS", 100)
    monkeypatch.delenv(switches.PACKED_ATTENTION.name, raising=False)
    return calls


@pytest.mark.parametrize("speedup", [0.8, 1.2, 2.5])
def test_a_micro_batch_takes_the_padded_path_when_its_padding_costs_less_than_it_gains(
    speedup: float, on_a_gpu: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    measured: list[float] = []

    def measure(*args: object, **kwargs: object) -> float:
        measured.append(speedup)
        return speedup

    monkeypatch.setattr(kernels, "measure_padded_speedup", measure)
    small = packed_index((30, 20))  # under MEASURE_MIN_TOKENS (100 here): not measured on
    q, k, v = qkv(50, torch.float32)
    kernels.packed_attention(q, k, v, small, scale=HEAD_DIM**-0.5)
    assert on_a_gpu == ["varlen"] and measured == []
    equal, ragged = packed_index((64, 64, 64)), packed_index()  # work 1.0 and 1.37
    for index in (equal, ragged, equal):
        q, k, v = qkv(int(index.slots.shape[0]), torch.float32)
        on_a_gpu.clear()
        out = kernels.packed_attention(q, k, v, index, scale=HEAD_DIM**-0.5)
        pays = index.padded_work < kernels.PADDED_MARGIN * speedup
        assert on_a_gpu == ["padded" if pays else "varlen"]
        assert out.shape == (q.shape[0], HEADS * HEAD_DIM)
    assert measured == [speedup]  # once per GPU, head shape and dtype
    q, k, v = qkv(int(equal.slots.shape[0]), torch.bfloat16)
    kernels.packed_attention(q, k, v, equal, scale=HEAD_DIM**-0.5)
    assert len(measured) == 2  # another dtype: measured again


def test_past_its_plans_cudnn_takes_no_new_shape_and_the_micro_batch_takes_the_varlen_kernel(
    on_a_gpu: list[str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """On a GPU that asks cuDNN first, each new padded shape costs cuDNN a plan build: past
    CUDNN_PLANS shapes a micro-batch whose groups bring a new shape takes the varlen kernel,
    however fast the padded path measured, while the shapes already planned keep the padded
    path; SDPA calls of a new shape (the torch trainer's) take SDPA's own order."""
    monkeypatch.setattr(sdpa, "cudnn_device", lambda query: True)
    monkeypatch.setattr(sdpa, "_cudnn_shapes", set())
    monkeypatch.setattr(sdpa, "_refused", False)
    monkeypatch.setattr(sdpa, "CUDNN_PLANS", 2)
    monkeypatch.setattr(kernels, "measure_padded_speedup", lambda *args, **kwargs: 10.0)
    first, second, third = (packed_index(n) for n in ((64, 64, 64), (50, 50), (80, 80)))
    with caplog.at_level(logging.INFO, logger=sdpa.__name__):
        for index, path in ((first, "padded"), (second, "padded"), (third, "varlen"),
                            (first, "padded"), (third, "varlen")):  # fmt: skip
            q, k, v = qkv(int(index.slots.shape[0]), torch.float32)
            on_a_gpu.clear()
            kernels.packed_attention(q, k, v, index, scale=HEAD_DIM**-0.5)
            assert on_a_gpu == [path], (index.groups[0].rows.shape, on_a_gpu)
    assert sdpa.cudnn_plans() == (2, True)  # two shapes planned, a new one refused
    assert [r.getMessage() for r in caplog.records].count(
        "padded attention: 2 input shapes asked for cuDNN's attention first, which builds a plan "
        "for each new shape; new shapes no longer do (the megatron trainer takes its varlen "
        "kernel for them, the torch trainer SDPA's own order)"
    ) == 1
    q, k = torch.randn(3, HEADS, 64, HEAD_DIM), torch.randn(3, GROUPS, 64, HEAD_DIM)  # first's
    assert not isinstance(sdpa.preferred_backends(q, k), contextlib.nullcontext)
    q, k = torch.randn(2, HEADS, 80, HEAD_DIM), torch.randn(2, GROUPS, 80, HEAD_DIM)  # third's
    assert isinstance(sdpa.preferred_backends(q, k), contextlib.nullcontext)


def test_under_torchs_ragged_plans_lengths_in_one_power_of_two_share_a_plan(
    on_a_gpu: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1 cuDNN keys its plans by the batch and the rows
    rounded up to a power of two: the budget counts those keys, so groups of 50 and of 60 rows
    share the plan of 64 (exact shapes would have refused the second), while 80 rows (128) is a
    new plan past the budget; a call with a mask (under CP) or off the BSHD layout keeps its
    exact shape, as torch's key does."""
    monkeypatch.setattr(sdpa, "cudnn_device", lambda query: True)
    monkeypatch.setattr(sdpa, "_cudnn_shapes", set())
    monkeypatch.setattr(sdpa, "_refused", False)
    monkeypatch.setattr(sdpa, "CUDNN_PLANS", 2)
    monkeypatch.setattr(kernels, "measure_padded_speedup", lambda *args, **kwargs: 10.0)
    monkeypatch.setenv(sdpa.RAGGED_PLANS_ENV, "1")
    sdpa.ragged_plans.cache_clear()
    try:
        assert [sdpa.power_of_two(n) for n in (0, 1, 2, 3, 50, 64, 65)] == [1, 1, 2, 4, 64, 64, 128]
        indexes = [packed_index(n) for n in ((64, 64, 64), (50, 50), (60, 60), (80, 80))]
        for index, path in zip(indexes, ("padded", "padded", "padded", "varlen"), strict=True):
            q, k, v = qkv(int(index.slots.shape[0]), torch.float32)
            on_a_gpu.clear()
            kernels.packed_attention(q, k, v, index, scale=HEAD_DIM**-0.5)
            assert on_a_gpu == [path], (index.groups[0].rows.shape, on_a_gpu)
        assert sdpa.cudnn_plans() == (2, True)
        bshd = torch.randn(2, 60, HEADS, HEAD_DIM).transpose(1, 2)
        assert sdpa.is_bshd(bshd) and not sdpa.is_bshd(bshd.contiguous())
        rounded = sdpa.shape_of(bshd, bshd.shape, bshd.shape)
        assert rounded[2] == (2, HEADS, 64, HEAD_DIM)
        assert sdpa.shape_of(bshd, bshd.shape, bshd.shape, masked=True)[2][2] == 60
        assert sdpa.shape_of(bshd, bshd.shape, bshd.shape, bshd=False)[2][2] == 60
    finally:
        monkeypatch.delenv(sdpa.RAGGED_PLANS_ENV)
        sdpa.ragged_plans.cache_clear()


def test_the_switch_or_a_failed_measurement_leaves_the_varlen_kernel(
    on_a_gpu: list[str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: object, **kwargs: object) -> float:
        raise RuntimeError("no cuDNN here")

    monkeypatch.setattr(kernels, "measure_padded_speedup", broken)
    index = packed_index((64, 64, 64))
    q, k, v = qkv(192, torch.float32)
    monkeypatch.setenv(switches.PACKED_ATTENTION.name, "varlen")
    kernels.packed_attention(q, k, v, index, scale=1.0)
    assert on_a_gpu == ["varlen"] and not kernels._padded_speedups  # nothing measured
    monkeypatch.delenv(switches.PACKED_ATTENTION.name)
    with caplog.at_level("WARNING", logger=kernels.__name__):
        kernels.packed_attention(q, k, v, index, scale=1.0)
        kernels.packed_attention(q, k, v, index, scale=1.0)
    assert on_a_gpu == ["varlen"] * 3
    assert [r.getMessage() for r in caplog.records if "failed" in r.getMessage()] == [
        "packed attention: measuring the padded path failed (RuntimeError: no cuDNN here); "
        "the varlen kernel stays"
    ]


def test_measuring_runs_each_path_forward_and_backward_on_copies(on_a_gpu: list[str]) -> None:
    index = packed_index()
    q, k, v = qkv(sum(LENGTHS), torch.float32)
    syncs: list[int] = []
    with torch.no_grad():  # as in a recompute's first forward
        speedup = kernels.measure_padded_speedup(
            q, k, v, index, HEAD_DIM**-0.5, repeats=2, synchronize=lambda: syncs.append(1)
        )
    assert math.isfinite(speedup) and speedup > 0
    assert on_a_gpu == ["varlen"] * 3 + ["padded"] * 3  # a warm-up and two timed runs each
    assert len(syncs) == 12 and not q.requires_grad and q.grad is None


def test_sdpa_preference_puts_cudnn_first_and_keeps_only_enabled_backends() -> None:
    """The padded path's backend order on Hopper: cuDNN, then SDPA's own order, without the
    backends switched off globally; SDPA accepts it as a priority (here on CPU, where it changes
    nothing) and the padded path on CPU tensors takes no preference at all."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    everything = sdpa.sdpa_preference()
    assert everything == [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                          SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]  # fmt: skip
    torch.backends.cuda.enable_flash_sdp(False)
    try:
        assert SDPBackend.FLASH_ATTENTION not in sdpa.sdpa_preference()
    finally:
        torch.backends.cuda.enable_flash_sdp(True)
    q, k, v = (torch.randn(2, HEADS, 16, HEAD_DIM) for _ in range(3))
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with sdpa_kernel(everything, set_priority=True):
        got = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(got, want)
    assert isinstance(sdpa.preferred_backends(q, k), contextlib.nullcontext)


def first_step(trainer: MegatronTrainer, samples: list[TrainSample], mode: str) -> Any:
    """In a rank: the varlen op on CPU (test_activation_memory.use_cpu_varlen), the choice
    `mode`, one train step; its loss and gradient norm and the speeds measured."""
    use_cpu_varlen()
    os.environ[switches.PACKED_ATTENTION.name] = mode
    kernels.MEASURE_MIN_TOKENS = 0  # this rank's micro-batch has 112
    before = kernels.ATTENTION_PATHS.copy()
    metrics = trainer.train_step(samples)
    paths = kernels.ATTENTION_PATHS - before
    share = paths["padded"] / paths.total()
    return metrics["train/loss"], metrics["train/grad_norm"], dict(kernels._padded_speedups), share


def test_the_trainer_measures_the_padded_path_inside_its_step_and_trains_the_same(
    tmp_path: Path,
) -> None:
    """The measurement runs where it runs on a GPU, in the first layer's forward of a real
    step (megatron-core's synchronisation is a no-op on CPU, so its timings are real), whatever
    path it then picks: the step equals the varlen kernel's alone."""
    model = tiny.qwen3(tmp_path / "qwen3", layers=2)
    samples = [TrainSample([2 + (7 * i + n) % 50 for i in range(n)], n // 2, (-1.0) ** n)
               for n in (30, 30, 12, 40)]  # fmt: skip
    setup = Setup(model, configs(4, train={"max_tokens_per_gpu": 256}), layout())
    loss, norm, measured, share = setup.run(first_step, samples, "varlen")
    assert measured == {} and share == 0.0
    auto_loss, auto_norm, auto_measured, auto_share = setup.run(first_step, samples, "auto")
    [speedup] = auto_measured.values()  # one head shape and dtype: measured once
    assert math.isfinite(speedup) and speedup > 0
    # one micro-batch of the four samples: every attention call took the path its padding chose
    work = build_micro_batch(samples, [0, 1, 2, 3]).packed.attention.padded_work  # type: ignore[union-attr]
    assert auto_share == float(work < kernels.PADDED_MARGIN * speedup)
    assert auto_loss == pytest.approx(loss, rel=1e-6, abs=1e-9)
    assert auto_norm == pytest.approx(norm, rel=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_only_half_precision_calls_ask_cudnn_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """cuDNN's attention computes in bf16 or fp16: a float32 call (model.params_dtype=fp32)
    neither asks for it nor spends a plan of the budget."""
    monkeypatch.delenv(switches.CUDNN_ATTENTION.name, raising=False)
    hopper = torch.cuda.get_device_capability() in sdpa.CUDNN_FIRST_CAPABILITIES
    for dtype, asks in ((torch.bfloat16, hopper), (torch.float16, hopper), (torch.float32, False)):
        query = torch.zeros(2, HEADS, 16, HEAD_DIM, device="cuda", dtype=dtype)
        assert sdpa.cudnn_device(query) is asks
