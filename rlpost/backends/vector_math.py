"""Intel MKL's vector math (VML), set up on one thread before any parallel use.

torch's CPU kernels for cos, sin, log, erf and their kin call VML, which torch's library
carries inside it (which functions do depends on torch's build; `cos` does in 2.13.0).
VML sets itself up on first use. When that first use is a call made from two threads of
one intra-op parallel region at once (a tensor large enough to be split between threads),
one thread can compute its share of that call with a less accurate kernel: the result
differs in the last bits, and only that one time.

Measured with torch 2.13.0 on two cores, two threads: a fresh process's first `cos` of a
16,192-element RoPE table gave, in 3 of 120 processes, a table whose second half equals
VML's low-accuracy (VML_EP) result bit for bit while its first half is the usual (VML_HA)
one; the second call was always right. `benchmarks/first_call_numerics.py` (19 functions in
turn, 150 processes an arm, one busy loop beside them): 2 cold processes with a first call
that differs, both the first function called (acos), none of the later ones; 0 of 150
after the warm-up. A trainer's first forward is such a first use: its RoPE table, so the
first step's logprobs and gradients, came out different in about 2% of launches, which
broke the equality a deterministic run promises (a resumed or restarted run against an
uninterrupted one).

`warm_vector_math` calls each of these functions first on the calling thread alone (a
tensor far below the size torch splits between threads), so no later call is a first use.
Every process that computes with torch on the CPU (train ranks of both backends, CPU
engines) calls it once at start-up.
"""

from __future__ import annotations

import torch

VML_OPS = (
    "acos", "asin", "atan", "cos", "sin", "tan", "tanh", "exp", "expm1", "log", "log2",
    "log10", "log1p", "sqrt", "rsqrt", "erf", "erfc", "erfinv", "lgamma",
)  # fmt: skip
"""torch functions whose CPU kernels may reach VML (torch/aten's vml.h), on values in (0, 1),
a domain they all accept."""
DTYPES = (torch.float32, torch.float64)
"""VML's single and double precision functions are set up apart; bf16 and fp16 compute in
float32 on the CPU."""
WARM_ELEMENTS = 64
"""Far below the 2,048-element grain under which torch runs a unary op on the calling
thread only."""


def warm_vector_math() -> None:
    """The first call of every VML function torch may use, on this thread only."""
    with torch.no_grad():
        for dtype in DTYPES:
            values = torch.linspace(0.125, 0.875, WARM_ELEMENTS, dtype=dtype)
            for name in VML_OPS:
                getattr(torch, name)(values)
