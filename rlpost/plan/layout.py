"""The resolved shapes a plan is built from: GPU counts, training parallelism, engines."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlpost.backends.fp8_format import Fp8Format

if TYPE_CHECKING:
    from rlpost.schema.layout import TrainLayout

RECOMPUTE_NONE = "none"
MAX_PP = 16
"""The most pipeline stages the layout search and the memory remedies try."""
MAX_CP = 8
"""The largest context-parallel size the layout search and the memory remedies try."""
SELECTIVE_RECOMPUTE_MODULES = ("core_attn",)
"""What `recompute: selective` recomputes, in megatron-core's recompute_modules names: core
attention (RoPE, the per-sample gathers and SDPA), whose saved tensors the plan's memory
estimate then leaves out (rlpost.plan.memory)."""

PADDED_ROWS_LIMIT = 1.25
"""Both trainers' padded attention pads each group of samples of similar lengths to its
longest, with at most this many rows over the group's tokens (rlpost.algo.packing.
padded_groups); the plan's memory estimate counts what it keeps at this many rows per token."""


@dataclass(frozen=True)
class Sizes:
    """How many accelerators train and how many generate (the same ones when colocated)."""

    colocate: bool
    total_gpus: int
    train_gpus: int
    rollout_gpus: int


@dataclass(frozen=True)
class ParallelLayout:
    """Megatron's training grid: world = tp x pp x cp x dp; experts on an ep x etp grid."""

    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    dp: int
    sequence_parallel: bool
    recompute: str
    recompute_method: str
    recompute_num_layers: int
    distributed_optimizer: bool
    moe_token_dispatcher_type: str | None = None
    moe_enable_deepep: bool = False
    num_layers_in_first_pipeline_stage: int | None = None
    num_layers_in_last_pipeline_stage: int | None = None

    @classmethod
    def single_process(cls, **changes: Any) -> ParallelLayout:
        """One rank, no parallelism, no recompute, unless `changes` say otherwise."""
        base: dict[str, Any] = {
            "tp": 1,
            "pp": 1,
            "cp": 1,
            "ep": 1,
            "etp": 1,
            "dp": 1,
            "sequence_parallel": False,
            "recompute": RECOMPUTE_NONE,
            "recompute_method": "uniform",
            "recompute_num_layers": 1,
            "distributed_optimizer": False,
        }
        return cls(**(base | changes))

    @classmethod
    def from_train(
        cls,
        train: TrainLayout,
        *,
        tp: int,
        pp: int,
        cp: int,
        ep: int,
        etp: int,
        dp: int,
        sequence_parallel: bool,
        recompute: str,
        dispatcher: str | None,
        stages: tuple[int | None, int | None] | None = None,
    ) -> ParallelLayout:
        """The grid a caller picks (sizes, sequence parallel, recompute granularity) with the
        rest as layout.train sets it: the recompute method and group, the optimizer, the MoE
        token dispatcher (`dispatcher` where it is unset), DeepEP, and the first and last
        pipeline stages' layers (`stages` where the caller picks them instead)."""
        first, last = (
            (train.num_layers_in_first_pipeline_stage, train.num_layers_in_last_pipeline_stage)
            if stages is None
            else stages
        )
        return cls(
            tp=tp,
            pp=pp,
            cp=cp,
            ep=ep,
            etp=etp,
            dp=dp,
            sequence_parallel=sequence_parallel,
            recompute=recompute,
            recompute_method=train.recompute.method,
            recompute_num_layers=train.recompute.num_layers,
            distributed_optimizer=train.distributed_optimizer,
            moe_token_dispatcher_type=train.moe_token_dispatcher_type or dispatcher,
            moe_enable_deepep=train.moe_enable_deepep,
            num_layers_in_first_pipeline_stage=first,
            num_layers_in_last_pipeline_stage=last,
        )

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def expert_dp(self) -> int:
        """Replicas of each expert shard: megatron-core's world / (etp x ep x pp)."""
        return max(1, self.world // (self.etp * self.ep * self.pp))

    @property
    def optimizer_shards(self) -> int:
        """The distributed optimizer shards dense state over the DP x CP group."""
        return self.dp * self.cp if self.distributed_optimizer else 1

    @property
    def expert_optimizer_shards(self) -> int:
        return self.expert_dp if self.distributed_optimizer else 1


@dataclass(frozen=True)
class EngineLayout:
    """SGLang engines: each a server of `gpus_per_engine` GPUs (its tp_size)."""

    gpus_per_engine: int
    num_engines: int
    mem_fraction_static: float
    dp_size: int
    ep_size: int
    sglang: tuple[tuple[str, Any], ...]
    # the FP8 format of the checkpoint the engines serve (model.hf_checkpoint's
    # quantization_config, read once per plan); None for unquantised weights
    fp8: Fp8Format | None = None

    @property
    def attention_tp(self) -> int:
        """With dp-attention, attention runs TP over tp/dp GPUs, each group its own batch."""
        return max(1, self.gpus_per_engine // self.dp_size)

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.sglang)

    def option(self, name: str, default: Any = None) -> Any:
        return self.options.get(name, default)
