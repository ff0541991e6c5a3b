"""Size-bounded weight buckets, and (on a GPU) the CUDA IPC handles buckets travel as."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from rlpost.backends.sglang import trainer_side
from rlpost.backends.sglang.buckets import WeightInfo, plan_buckets, to_dtype, weight_infos

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def info(name: str, numel: int, dtype: str = "float32") -> WeightInfo:
    return WeightInfo(name, dtype, (numel,))


def test_buckets_stay_under_the_bound_and_keep_order() -> None:
    weights = [info(f"w{i}", n) for i, n in enumerate([10, 20, 25, 5, 40, 1])]  # x 4 bytes
    buckets = plan_buckets(weights, max_bytes=120)
    assert [[w.name for w in b] for b in buckets] == [["w0", "w1"], ["w2", "w3"], ["w4"], ["w5"]]
    assert all(sum(w.nbytes for w in b) <= 120 for b in buckets if len(b) > 1)
    assert [w for b in buckets for w in b] == weights


def test_an_oversized_weight_travels_alone() -> None:
    buckets = plan_buckets([info("small", 2), info("huge", 1000), info("tail", 2)], 100)
    assert [[w.name for w in b] for b in buckets] == [["small"], ["huge"], ["tail"]]


def test_each_bucket_holds_one_dtype() -> None:
    weights = [info("a", 4), info("b", 4, "bfloat16"), info("c", 4), info("d", 4, "bfloat16")]
    buckets = plan_buckets(weights, max_bytes=1 << 20)
    assert [[w.name for w in b] for b in buckets] == [["a", "c"], ["b", "d"]]
    assert info("x", 3, "bfloat16").nbytes == 6


def test_weight_infos_name_dtypes_as_sglang_requests_do() -> None:
    named = [("a", torch.zeros(2, 3, dtype=torch.bfloat16)), ("b", torch.zeros(4))]
    assert weight_infos(named) == [
        WeightInfo("a", "bfloat16", (2, 3)),
        WeightInfo("b", "float32", (4,)),
    ]
    assert to_dtype("bfloat16") is torch.bfloat16
    with pytest.raises(ValueError, match="not a torch dtype"):
        to_dtype("floaty")
    with pytest.raises(ValueError, match="max_bytes"):
        plan_buckets([info("a", 1)], 0)


@pytest.mark.gpu
@requires_cuda
def test_ipc_handle_maps_the_same_gpu_memory_in_another_process() -> None:
    tensor = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    payload = trainer_side.ipc_handle_payload(tensor)
    reader = textwrap.dedent(
        f"""
        import sys, torch
        from rlpost.backends.sglang.trainer_side import tensor_from_payload
        t = tensor_from_payload({payload!r})
        assert t.is_cuda and t.numel() == {tensor.numel()}
        print(float(t.sum()))
        t.mul_(2)  # the same memory: the owner sees it
        torch.cuda.synchronize()
        """
    )
    done = subprocess.run([sys.executable, "-c", reader], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.strip()) == float(torch.arange(1 << 20, dtype=torch.float64).sum())
    torch.cuda.synchronize()
    assert float(tensor[-1]) == 2.0 * ((1 << 20) - 1)
