"""benchmarks/step_profile.py's device time by kind of kernel: the names CUDA kernels of a
train step carry (cuBLAS, flash and cuDNN attention, torch's fused RMSNorm, Inductor's
kernels by what they fuse, copies), and the sum over the profiler's averages, kernels only."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from torch.autograd import DeviceType

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import step_profile

NAMES = {
    "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT": "matmuls",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64": "matmuls",
    "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<...>": "attention",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3": "attention",
    "triton_poi_fused_cat_mul_silu_silu_backward_split_0": "compiled: swiglu",
    "triton_poi_fused_add_cat_mul_neg_split_0": "compiled: rope",
    "triton_red_fused_div_exp_max_sub_sum_0": "compiled: other",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<...>": "rms_norm",
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>": (
        "copies and conversions"
    ),
    "Memcpy DtoD (Device -> Device)": "copies and conversions",
    "void at::native::reduce_kernel<512, 1, ...>": "reductions",
    "void at::native::indexing_backward_kernel<...>": "indexing",
    "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>": (
        "other elementwise"
    ),
    "void multi_tensor_apply_kernel<FusedAdamMathFunctor<...>>": "optimizer",
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL": "communication",
    "void at::native::radixSortKVInPlace<...>": "other",
}


@pytest.mark.parametrize("name", sorted(NAMES))
def test_each_kernel_name_has_its_kind(name: str) -> None:
    assert step_profile.kernel_kind(name) == NAMES[name]


def test_device_time_sums_kernels_by_kind_and_leaves_the_ops_that_launched_them() -> None:
    def entry(key: str, device: DeviceType, us: float) -> SimpleNamespace:
        return SimpleNamespace(key=key, device_type=device, self_device_time_total=us)

    averages = [
        entry("aten::mm", DeviceType.CPU, 9000.0),  # the op: its kernels are counted instead
        entry("nvjet_sm90_tst_256x128", DeviceType.CUDA, 3000.0),
        entry("sm90_xmma_gemm_bf16", DeviceType.CUDA, 1000.0),
        entry("triton_poi_fused_cat_mul_silu_0", DeviceType.CUDA, 500.0),
    ]
    kinds = step_profile.device_time_by_kind(averages)
    assert kinds == {"matmuls": 4.0, "compiled: swiglu": 0.5}
    table = step_profile.kinds_table(kinds, wall_ms=9.0)
    assert "4 ms of kernels, 0.50 of it" in table.splitlines()[0]
    assert [line.split()[0] for line in table.splitlines()[1:]] == ["matmuls", "compiled:"]
