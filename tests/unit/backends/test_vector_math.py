"""The vector-math warm-up: every function it names is torch's, and each takes its input."""

from __future__ import annotations

import torch

from rlpost.backends.vector_math import DTYPES, VML_OPS, WARM_ELEMENTS, warm_vector_math


def test_every_warmed_function_is_torchs_and_finite_on_the_warm_up_values() -> None:
    for dtype in DTYPES:
        values = torch.linspace(0.125, 0.875, WARM_ELEMENTS, dtype=dtype)
        for name in VML_OPS:
            out = getattr(torch, name)(values)
            assert out.dtype == dtype and bool(torch.isfinite(out).all()), name


def test_the_warm_up_stays_on_the_calling_thread_and_keeps_the_thread_count() -> None:
    threads = torch.get_num_threads()
    assert WARM_ELEMENTS < 2048  # torch's grain for unary ops: one thread below it
    warm_vector_math()
    assert torch.get_num_threads() == threads
