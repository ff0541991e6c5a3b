"""The trainer's models as FSDP2 shards, the checkpoint read by one rank only.

With several data-parallel ranks, rank 0 alone reads the folder (fp32 on the host, an FP8
folder dequantised, `model_io.load_causal_lm`). Every other rank builds the same architecture
on the meta device from the folder's config files (`model_io.build_causal_lm`), shards it as
rank 0 does, gives its shards storage, and receives rank 0's whole tensors one by one
(torch.distributed.checkpoint's `broadcast_from_rank0`), keeping its own part of each. So
rank 0's host holds one whole fp32 copy while the model loads and every other rank only its
shards, where each rank would otherwise hold a whole copy of its own.

Buffers are in no sharding: each rank gets rank 0's, persistent or not (a rotary embedding's
`inv_freq` is in no state dict). Tied weights stay one parameter (FSDP2 shards it once).

One rank loads the folder and shards it over its one-rank group, as before.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from transformers import PreTrainedModel

from rlpost.backends.torch_trainer import kernels
from rlpost.backends.torch_trainer.distributed import (
    DataParallel,
    broadcast_buffers,
    local_shard,
    shard_model,
)
from rlpost.backends.torch_trainer.forward import TokenForward
from rlpost.backends.torch_trainer.model_io import (
    build_causal_lm,
    checkpoint_layers,
    decoder_layers,
    freeze,
    load_causal_lm,
    router_modules,
)
from rlpost.plan.layout import ParallelLayout

log = logging.getLogger(__name__)


def load_sharded_lm(
    model_dir: str | Path,
    attn_implementation: str,
    dp: DataParallel,
    mesh: DeviceMesh,
    *,
    cpu_offload: bool = False,
    layout: ParallelLayout | None = None,
    frozen: bool = False,
    per_layer: bool | None = None,
    reshard_after_forward: bool | None = None,
    compute_dtype: str = "bf16",
    router_dtype: str = "fp32",
    grouped_gemm: bool | None = None,
) -> TokenForward:
    """The folder's causal LM behind `TokenForward`, sharded over `mesh` (`shard_model`, its
    `per_layer`, `reshard_after_forward`, `compute_dtype`; its MoE routers computing in
    `router_dtype`, its experts as `grouped_gemm` says: `model_io.load_causal_lm`), each
    decoder layer checkpointed as
    `layout.recompute` says (None: none); `frozen`: no gradients (a reference model). On
    CUDA its standard RMSNorm, MLP and rotary embedding run rlpost's kernels
    (torch_trainer.kernels.fuse_kernels). The HF model is the result's `lm`.
    Collective."""
    reads = dp.rank == 0
    model = (load_causal_lm if reads else build_causal_lm)(
        model_dir, attn_implementation, grouped_gemm
    )
    fused = kernels.fuse_kernels(model, mesh.device_type)  # CUDA: norms, MLPs and RoPE
    if mesh.device_type in kernels.KERNEL_DEVICES:
        log.info(
            "%s on rlpost's kernels: %d RMSNorm modules, %d MLPs, the rotary embedding %s",
            type(model).__name__, fused.norms, fused.mlps,
            "too" if fused.rotary else "not (transformers' own)",
        )  # fmt: skip
    if frozen:
        freeze(model)
    if layout is not None:
        checkpoint_layers(
            model, layout.recompute, layout.recompute_method, layout.recompute_num_layers
        )
    forward = TokenForward(model)
    # rank 0's whole tensors: sharding swaps the parameters for shards, these stay whole
    whole = forward.state_dict() if reads and dp.enabled else {}
    shard_model(
        forward, decoder_layers(model), mesh, cpu_offload, per_layer, reshard_after_forward,
        compute_dtype, routers=router_modules(model), router_dtype=router_dtype,
    )  # fmt: skip
    if not dp.enabled:
        return forward
    if not reads:
        # storage where FSDP2 keeps the shards: on the host under its CPU offload
        forward.to_empty(device=torch.device("cpu") if cpu_offload else dp.device)
    set_model_state_dict(
        forward,
        whole,
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
    )
    del whole
    broadcast_buffers(forward, dp.device)  # where FSDP2 moved rank 0's, CPU offload or not
    _check_materialised(forward.lm)
    return forward


def _check_materialised(model: PreTrainedModel) -> None:
    """Every tensor the model holds has storage: a tensor kept as a plain attribute (neither
    a parameter nor a buffer) would have stayed on the meta device on ranks other than 0."""
    for name, module in model.named_modules():
        for attr, value in vars(module).items():
            if isinstance(value, torch.Tensor) and value.is_meta:
                raise RuntimeError(
                    f"{type(model).__name__}: {name or 'the model'}.{attr} is a tensor held "
                    "outside its parameters and buffers, so only rank 0 (which reads the "
                    "folder) has its values; this model cannot be loaded by rank 0 alone"
                )
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if local_shard(tensor).is_meta:
            raise RuntimeError(f"{type(model).__name__}: {name} was not materialised")
