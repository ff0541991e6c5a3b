"""Sharded data parallelism with FSDP2: one code path for CPU (gloo) and CUDA (NCCL).

Parameters, gradients and optimizer state are sharded over the data-parallel ranks; with
`shard_group_size` (HSDP) they are sharded within groups of that many ranks and replicated
across the groups, over a 2-D device mesh (replicate, shard). On CUDA the layers compute in
model.params_dtype, bf16 (or fp32), from float32 sharded master weights and reduce gradients
in float32; on CPU everything is float32.

FSDP2's units: on CUDA each decoder layer is one (`fully_shard` per layer, then at the root),
so a GPU holds one or two gathered layers at a time and a layer's collectives overlap the
next one's compute. On CPU the whole model is one unit: one all-gather before the forward and
one reduce-scatter after the backward. There the ranks share the host's cores and memory,
nothing overlaps, and every collective is a meeting of the ranks: per-layer units take the
CPU default's step to 1.14x (two ranks on two cores, benchmarks/torch_dp_step.py) and keep
nothing off the host that one unit keeps on it, since on CPU the gathered layers stay until
the backward either way. `per_layer=True` builds the CUDA structure on CPU (the tests check
both).

Losses are divided by step-wide denominators, so the full-batch gradient is the SUM of the
ranks' gradients: FSDP2 averages by default, and `shard_model` sets its divide factor to 1
with plain SUM collectives (gloo has no PREMUL_SUM).

FSDP2's all-gathers and reduce-scatters are collectives: every rank must run the same number
of forwards and backwards (the trainer evens micro-batch counts out, rlpost.algo.steps).

One rank runs the same path over a one-rank process group (an in-memory store, no port to
listen on): the same DTensor state, clipping, weight export and checkpoint code as many
ranks, and on one GPU FSDP2's CPU offload and float32 master weights are what let a model
fit. The cost is a copy per layer where the all-gather would be (checked by the CPU default's
step time).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed import HashStore  # type: ignore[attr-defined]
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter
from torch.distributed.tensor import DTensor, Shard

from rlpost.backends.stores import Rendezvous, process_group_store

ALL_GATHER_SINGLE: Any = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
"""One tensor gathered from every rank into one: `all_gather_single` where torch has it (2.13,
which deprecates the older name with a warning in every rank's log), else the older name."""


@dataclass(frozen=True)
class DataParallel:
    """This process's place in the data-parallel group."""

    rank: int = 0
    world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    timeout_s: float = 600.0
    init_method: str | None = None  # default: tcp://master_addr:master_port
    device_type: str = "cpu"  # "cuda": NCCL, the GPU this process sees first

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def device(self) -> torch.device:
        if self.device_type == "cuda":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def init(self) -> bool:
        """Join (or, on one rank, make) the process group; True when this call created it."""
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank={self.rank} is outside world_size={self.world_size}")
        if dist.is_initialized():
            if dist.get_world_size() != self.world_size:
                raise RuntimeError(
                    f"a process group of {dist.get_world_size()} ranks already exists in this "
                    f"process; the trainer needs {self.world_size}"
                )
            return False
        timeout = timedelta(seconds=self.timeout_s)
        rendezvous: Rendezvous = (
            process_group_store(
                self.init_method,
                self.master_addr,
                self.master_port,
                self.rank,
                self.world_size,
                timeout,
            )
            if self.enabled
            else {"store": HashStore()}  # one rank: nothing to meet, no port to take
        )
        dist.init_process_group(
            # on CUDA, gloo still carries host tensors (metric sums, counts)
            backend="cpu:gloo,cuda:nccl" if self.device_type == "cuda" else "gloo",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timeout,
            **rendezvous,
        )
        return True

    def mesh(self, shard_group_size: int | None = None) -> DeviceMesh:
        """The ranks as FSDP sees them: one shard dimension, or (replicate, shard) for HSDP."""
        shard = shard_group_size or self.world_size
        if self.world_size % shard:
            raise ValueError(
                f"shard_group_size={shard} does not divide the {self.world_size} data-parallel "
                "ranks"
            )
        if shard == self.world_size:
            return init_device_mesh(self.device_type, (shard,), mesh_dim_names=("shard",))
        return init_device_mesh(
            self.device_type,
            (self.world_size // shard, shard),
            mesh_dim_names=("replicate", "shard"),
        )

    def sum(self, tensor: Tensor) -> Tensor:
        """All-reduce SUM in place (identity on one rank); returns the tensor."""
        if self.enabled:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def max_counts(self, counts: list[int]) -> list[int]:
        """Each entry's largest value over the ranks."""
        if not self.enabled:
            return counts
        tensor = torch.tensor(counts, dtype=torch.long, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return [int(n) for n in tensor.tolist()]

    def broadcast_ints(self, values: list[int]) -> list[int]:
        """Rank 0's values on every rank."""
        if not self.enabled:
            return values
        tensor = torch.tensor(values, dtype=torch.long, device=self.device)
        dist.broadcast(tensor, src=0)
        return [int(n) for n in tensor.tolist()]

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def shard_model(
    root: nn.Module,
    layers: Iterable[nn.Module],
    mesh: DeviceMesh,
    cpu_offload: bool = False,
    per_layer: bool | None = None,
    reshard_after_forward: bool | None = None,
    compute_dtype: str = "bf16",
    routers: Sequence[nn.Module] = (),
    router_dtype: str = "fp32",
) -> None:
    """`fully_shard` each of `layers`, then `root` (what no layer holds: embeddings, the final
    norm, the output layer), or with `per_layer` False `root` alone (None: per layer on CUDA
    or where each layer reshards after its forward, else not); each layer freed after its
    forward and gathered again for its backward with `reshard_after_forward` (None: on CUDA),
    else kept gathered until its backward; gradients summed over the ranks, not averaged;
    layers computing in `compute_dtype` on CUDA (`mixed_precision`). The MoE `routers`
    (`model_io.router_modules`) compute in `router_dtype` (model.moe.router_dtype): where
    that differs from the layers' precision, each is a unit of its own whose parameters are
    gathered, and inputs cast, in it (float32 routing from the float32 master weights)."""
    cuda = mesh.device_type == "cuda"
    reshard = cuda if reshard_after_forward is None else reshard_after_forward
    if per_layer is None:
        per_layer = cuda or reshard
    if reshard and not per_layer:
        raise ValueError(
            "reshard_after_forward frees each layer after its forward, and per_layer=False "
            "makes the whole model one FSDP2 unit: pass per_layer=True or None"
        )
    if not per_layer:
        layers = ()
    mixed = mixed_precision(mesh.device_type, compute_dtype)
    offload = CPUOffloadPolicy(pin_memory=cuda) if cpu_offload else OffloadPolicy()
    routing = router_precision(mesh.device_type, compute_dtype, router_dtype)
    if routing is not None:
        for router in routers:  # inside its layer's unit: sharded first
            fully_shard(
                router,
                mesh=mesh,
                reshard_after_forward=reshard,
                mp_policy=routing,
                offload_policy=offload,
            )
    # On CPU the gathered layers stay until the backward by default: host memory is plentiful
    # there, and a gloo all-gather per layer costs more than the layer's compute in small models.
    for layer in layers:
        fully_shard(
            layer,
            mesh=mesh,
            reshard_after_forward=reshard,
            mp_policy=mixed,
            offload_policy=offload,
        )
    fully_shard(root, mesh=mesh, mp_policy=mixed, offload_policy=offload)
    for module in root.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
            if not cuda:
                module.set_custom_reduce_scatter(AllReduceScatter())


COMPUTE_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
"""model.params_dtype -> what the torch trainer's layers compute in on CUDA (fp16 is refused
by validation: it needs a loss scale, rlpost.plan.checks.torch_dtype_issues)."""


def mixed_precision(device_type: str, compute_dtype: str) -> MixedPrecisionPolicy:
    """FSDP2's precision for the shards (always float32, the master weights): on CUDA the
    gathered parameters cast to `compute_dtype` (model.params_dtype) and the gradients
    reduced in float32; on CPU float32 throughout, whatever `compute_dtype` says (the plan
    notes it)."""
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(
            f"the torch trainer computes in {' or '.join(COMPUTE_DTYPES)}, not {compute_dtype}"
        )
    dtype = COMPUTE_DTYPES[compute_dtype]
    if device_type != "cuda" or dtype == torch.float32:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def router_precision(
    device_type: str, compute_dtype: str, router_dtype: str
) -> MixedPrecisionPolicy | None:
    """FSDP2's precision for an MoE router computing in `router_dtype` while its layer
    computes in `compute_dtype`: None where the two agree (on CPU always: float32), else its
    parameters gathered in `router_dtype` and its inputs cast to it."""
    if router_dtype not in COMPUTE_DTYPES:
        raise ValueError(f"routers compute in {' or '.join(COMPUTE_DTYPES)}, not {router_dtype}")
    if device_type != "cuda" or router_dtype == compute_dtype:
        return None
    return MixedPrecisionPolicy(COMPUTE_DTYPES[router_dtype], torch.float32)


class AllReduceScatter(ReduceScatter):
    """FSDP2's reduce-scatter as an all-reduce of which each rank keeps its chunk, for gloo:
    its reduce-scatter costs more than its all-reduce of the same tensor though it moves
    half the bytes (two ranks on one 2-core host, torch 2.13: 10-13 against 7-8.5 ms for
    12.6 MB, 3.4 against 0.6 ms for 0.8 MB). The input is reduced in place (FSDP2 frees it
    afterwards)."""

    def allocate(
        self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device
    ) -> Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self,
        output_tensor: Tensor,
        input_tensor: Tensor,
        group: dist.ProcessGroup,
        op: Any,
        async_op: bool = False,
    ) -> dist.Work | None:
        dist.all_reduce(input_tensor, op=op, group=group)
        chunk = output_tensor.numel()
        start = dist.get_rank(group) * chunk
        output_tensor.copy_(input_tensor.view(-1)[start : start + chunk].view_as(output_tensor))
        return None


def broadcast_buffers(root: nn.Module, device: torch.device) -> None:
    """Every buffer of `root` (persistent or not: a rotary embedding's `inv_freq` is in no
    state dict) moved to `device` and given rank 0's values. FSDP2 leaves buffers whole on
    every rank, so each is one broadcast. Collective."""
    for module in root.modules():
        for name, buffer in module.named_buffers(recurse=False):
            if buffer.device != device:
                buffer = buffer.to(device)
                setattr(module, name, buffer)
            dist.broadcast(buffer, src=0)


def reshard(root: nn.Module) -> None:
    """Free every gathered layer of `root` (on CPU they outlive a no-grad forward), so that
    the next forward gathers the shards as they are now: after a load, say."""
    for module in root.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def gather_full(tensors: Sequence[Tensor]) -> list[Tensor]:
    """Whole tensors from FSDP2's shards (dim 0 over one mesh dimension, any others
    replicated) in one all-gather for all of them: each rank's shards, padded to the even
    chunk, travel as one flat buffer, and each tensor is copied out of the gathered one
    (for a moment the gathered buffer and the copies both live: twice the tensors' bytes).
    Anything else gathers tensor by tensor. Collective."""
    shards = [_dim0_shard(t) for t in tensors]
    if not tensors or any(s is None for s in shards):
        return [full_tensor(t) for t in tensors]
    dims = {cast(int, s) for s in shards}
    if len(dims) != 1 or len({t.dtype for t in tensors}) != 1:
        return [full_tensor(t) for t in tensors]
    dtensors = [cast(DTensor, t) for t in tensors]
    group = dtensors[0].device_mesh.get_group(dims.pop())
    world = dist.get_world_size(group)
    rows = [-(-t.shape[0] // world) for t in dtensors]  # the even chunk, as FSDP2 cuts it
    chunks = [r * math.prod(t.shape[1:]) for r, t in zip(rows, dtensors, strict=True)]
    local = torch.zeros(sum(chunks), dtype=dtensors[0].dtype, device=dtensors[0].to_local().device)
    offset = 0
    for size, t in zip(chunks, dtensors, strict=True):
        piece = t.to_local().reshape(-1)
        local[offset : offset + piece.numel()] = piece
        offset += size
    gathered = torch.empty(world * local.numel(), dtype=local.dtype, device=local.device)
    ALL_GATHER_SINGLE(gathered, local, group=group)
    del local
    by_rank = gathered.view(world, -1)
    out, offset = [], 0
    for size, r, t in zip(chunks, rows, dtensors, strict=True):
        whole = by_rank[:, offset : offset + size].reshape(world * r, *t.shape[1:])
        out.append(whole[: t.shape[0]].clone())
        offset += size
    return out


def _dim0_shard(tensor: Tensor) -> int | None:
    """The mesh dimension a DTensor is sharded over on dim 0, if that is its only shard."""
    if not isinstance(tensor, DTensor):
        return None
    sharded = [i for i, p in enumerate(tensor.placements) if not p.is_replicate()]
    if len(sharded) != 1 or tensor.placements[sharded[0]] != Shard(0):
        return None
    return sharded[0]


def full_tensor(tensor: Tensor) -> Tensor:
    """The whole tensor from its shards (collective over its mesh); a plain tensor as it is."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def local_shard(tensor: Tensor) -> Tensor:
    """This rank's shard of a DTensor (the tensor itself otherwise)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def clip_grad_norm(
    params: Iterable[nn.Parameter], max_norm: float, dp: DataParallel, sums: Tensor | None = None
) -> float:
    """The gradients' global L2 norm over every shard; scaled down to `max_norm` when above.

    Each rank squares its own shards and one all-reduce over all ranks adds them up, carrying
    `sums` (float64, summed in place over the ranks) with it: the step's metrics need no
    collective of their own. Under HSDP only the first replica counts its shards (the others
    hold the same gradients). Collective."""
    with_grads = [p for p in params if p.grad is not None]
    grads = [cast(Tensor, p.grad) for p in with_grads]
    local = [_counted_shard(g, dp.rank) for g in grads]
    carried = sums if sums is not None else torch.zeros(0, dtype=torch.float64)
    if any(t is None for t in local):  # a layout this sum cannot read: DTensor's own norm
        dp.sum(carried)
        total = full_tensor(torch.nn.utils.get_total_norm(grads, 2.0, foreach=True))
        norm = float(total)
    else:
        squares = torch.zeros(1, dtype=torch.float64)
        present = [t for t in local if t is not None and t.numel()]
        if present:
            norms = torch._foreach_norm(present, 2.0)
            squares += torch.stack(norms).double().square().sum().cpu()
        reduced = dp.sum(torch.cat([squares, carried.reshape(-1)]))
        carried.copy_(reduced[1:].view_as(carried))
        norm = math.sqrt(float(reduced[0]))
    if grads and max_norm < float("inf"):
        coef = max_norm / (norm + 1e-6)
        if coef < 1.0:
            torch._foreach_mul_([local_shard(g) for g in grads], coef)
    return norm


def _counted_shard(grad: Tensor, rank: int) -> Tensor | None:
    """What of `grad` this rank adds to the global norm: its shard, empty when it is a
    replica other than the first one; None for a placement other than shard or replicate."""
    if not isinstance(grad, DTensor):
        return grad if rank == 0 or not dist.is_initialized() else None
    mesh = grad.device_mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        return None
    for dim, placement in enumerate(grad.placements):
        if placement.is_replicate():
            if coordinate[dim] != 0:
                return grad.to_local()[:0]
        elif not placement.is_shard():
            return None
    return grad.to_local()
