"""One MoE layer's experts, forward and backward, as the megatron trainer computes them under
`model.moe.grouped_gemm`: true, two grouped GEMMs over all local experts
(rlpost.backends.megatron.layers.grouped_linear) around the SwiGLU; false, each expert's two
GEMMs in turn, as megatron-core's SequentialMLP does (its split of the tokens by the counts,
read on the host, included; its per-module Python is not, so the loop is timed at its
cheapest). Shapes from a model YAML: the local experts of `--ep` ranks, the tokens of a
micro-batch routed top-k at random (uneven counts, some experts without tokens).

    python benchmarks/moe_experts.py --model qwen3-30b-a3b --ep 8      # on a CUDA GPU (bf16)
    python benchmarks/moe_experts.py --tiny                            # anywhere (float32)

Per variant: milliseconds per layer (forward + backward; the median of --repeats after a
warm-up), and the grouped path's speed-up over the loop.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlpost.backends.megatron import silence_known_warnings
from rlpost.backends.swiglu import swiglu
from rlpost.config.loader import compose_run_config

silence_known_warnings()
from rlpost.backends.megatron.layers import grouped_linear  # noqa: E402


def shapes(args: argparse.Namespace) -> tuple[int, int, int, int]:
    """(local experts, hidden, expert FFN, top_k)."""
    if args.tiny:
        return 8, 64, 32, 2
    moe_model = compose_run_config([f"model={args.model}", "hardware=cpu"])[0].model
    if moe_model.moe is None:
        raise SystemExit(f"{args.model} is a dense model: no experts to time")
    moe = moe_model.moe
    return moe.num_experts // args.ep, moe_model.hidden_size, moe.expert_ffn_hidden_size, moe.top_k


def routed_counts(tokens: int, experts: int, top_k: int, device: torch.device) -> torch.Tensor:
    """Tokens per local expert when `tokens` tokens each pick top_k of the experts at random."""
    picks = torch.rand(tokens, experts).topk(top_k, dim=1).indices.flatten()
    return torch.bincount(picks, minlength=experts).to(device)


def grouped(
    x: torch.Tensor, counts: torch.Tensor, fc1: list[torch.Tensor], fc2: list[torch.Tensor]
) -> torch.Tensor:
    ends = torch.cumsum(counts, 0, dtype=torch.int32)
    return grouped_linear(swiglu(grouped_linear(x, ends, fc1)), ends, fc2)


def one_by_one(
    x: torch.Tensor, counts: torch.Tensor, fc1: list[torch.Tensor], fc2: list[torch.Tensor]
) -> torch.Tensor:
    parts = torch.split(x, counts.tolist())
    return torch.cat([swiglu(p @ w1.T) @ w2.T for p, w1, w2 in zip(parts, fc1, fc2, strict=True)])


def timed(fn: Callable[[], None], repeats: int, device: torch.device) -> float:
    """Milliseconds per call: the median of `repeats` after one warm-up call."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen3-30b-a3b", help="a conf/model MoE model")
    parser.add_argument("--ep", type=int, default=8, help="expert-parallel ranks")
    parser.add_argument("--tokens", type=int, default=8192, help="tokens of a micro-batch")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="small shapes, for a CPU")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    experts, hidden, ffn, top_k = shapes(args)
    tokens = 64 if args.tiny else args.tokens
    torch.manual_seed(0)
    counts = routed_counts(tokens, experts, top_k, device)

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, device=device, dtype=dtype)

    x = randn(int(counts.sum()), hidden).requires_grad_()
    fc1 = [(randn(2 * ffn, hidden) * hidden**-0.5).requires_grad_() for _ in range(experts)]
    fc2 = [(randn(hidden, ffn) * ffn**-0.5).requires_grad_() for _ in range(experts)]
    grad = randn(x.shape[0], hidden)

    def step(forward: Callable[..., torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            torch.autograd.backward(forward(x, counts, fc1, fc2), grad)
            for t in (x, *fc1, *fc2):
                t.grad = None

        return run

    print(f"{device.type} {dtype}: {experts} local experts, hidden {hidden}, FFN {ffn}, "
          f"{x.shape[0]} routed tokens ({tokens} x top {top_k}), "
          f"{int((counts == 0).sum())} experts without tokens")  # fmt: skip
    loop_ms = timed(step(one_by_one), args.repeats, device)
    grouped_ms = timed(step(grouped), args.repeats, device)
    print(f"{'experts one at a time':28} {loop_ms:10.3f} ms a layer (forward + backward)")
    print(f"{'grouped GEMMs':28} {grouped_ms:10.3f} ms a layer (forward + backward)")
    print(f"grouped / one at a time speed: {loop_ms / grouped_ms:.2f}x")


if __name__ == "__main__":
    main()
