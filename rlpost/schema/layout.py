"""Where a run goes on its hardware: placement, parallelism and engine sizing.

Every field may be left null; the planner then derives a valid value (and says so in the
plan), by fixed rules, or with `search: true` (`layout=auto`) by searching every layout that
fits for the one its cost model rates fastest. Shipped layouts live in
conf/layout/<model>_<hardware>.yaml and are picked automatically for that combination.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from rlpost.schema.base import InvariantError, Section, refuse_unused


class RecomputeConfig(Section):
    granularity: Literal["full", "selective", "none"] | None = Field(
        None, description="null: full on GPUs, none on CPU"
    )
    method: Literal["uniform", "block"] = "uniform"
    num_layers: PositiveInt = 1

    @model_validator(mode="after")
    def check_method_needs_full(self) -> RecomputeConfig:
        if self.granularity != "full":
            what = f"granularity {self.granularity}" if self.granularity else "no granularity"
            for name in ("method", "num_layers"):
                refuse_unused(
                    self,
                    name,
                    why=f"it says which layers full recompute covers, and the recompute has {what}",
                    fix="set granularity: full, or remove it",
                )
        return self


class FsdpLayout(Section):
    """The torch trainer's FSDP2 sharding (trainer.backend=torch only)."""

    cpu_offload: bool = Field(
        False,
        description="FSDP2's CPU offload: sharded parameters, gradients and optimizer state "
        "live in host memory and the optimizer steps on the CPU (apart from the offload "
        "around a colocated rollout, which this does not replace)",
    )
    shard_group_size: PositiveInt | None = Field(
        None,
        description="HSDP: shard within groups of this many ranks, replicate across the "
        "groups (it must divide dp); null: shard over all data-parallel ranks (layout=auto "
        "searches it: all ranks, or each node's GPUs when the ranks span nodes)",
    )
    reshard_after_forward: bool | None = Field(
        None,
        description="whether each decoder layer's gathered parameters are freed after its "
        "forward and gathered again for its backward (true: a layer at a time), or kept from "
        "the forward to the backward (false: one all-gather a micro-batch instead of two, for "
        "the whole model's parameters in the compute dtype on every GPU); null: true on GPUs, "
        "false on CPU, where the model is one FSDP2 unit (layout=auto searches it on GPUs)",
    )


class TrainLayout(Section):
    num_gpus: PositiveInt | None = None
    tp: PositiveInt | None = None
    pp: PositiveInt | None = None
    cp: PositiveInt | None = None
    ep: PositiveInt | None = None
    etp: PositiveInt | None = None
    dp: PositiveInt | None = None
    num_layers_in_first_pipeline_stage: PositiveInt | None = Field(
        None, description="uneven pipelining: layers on the first stage (the rest split evenly)"
    )
    num_layers_in_last_pipeline_stage: PositiveInt | None = Field(
        None, description="uneven pipelining: layers on the last stage"
    )
    sequence_parallel: bool | None = None
    recompute: RecomputeConfig = Field(default_factory=RecomputeConfig)
    fsdp: FsdpLayout = Field(default_factory=FsdpLayout)
    distributed_optimizer: bool = True
    moe_token_dispatcher_type: Literal["allgather", "alltoall", "flex"] | None = None
    moe_enable_deepep: bool = False

    @model_validator(mode="after")
    def check_sequence_parallel_needs_tp(self) -> TrainLayout:
        if self.sequence_parallel and self.tp == 1:
            raise InvariantError(
                "sequence_parallel splits activations across the tensor-parallel group, "
                "which has size tp=1",
                fields=("sequence_parallel",),
                fix="set sequence_parallel: false, or tp >= 2",
            )
        return self

    @model_validator(mode="after")
    def check_token_dispatcher(self) -> TrainLayout:
        dispatcher = self.moe_token_dispatcher_type
        if dispatcher == "allgather":
            raise InvariantError(
                "the allgather token dispatcher needs every micro-batch to have one sequence "
                "length, and rlpost packs samples of varying length: megatron-core refuses it "
                "when the trainers start (variable_seq_lengths)",
                fields=("moe_token_dispatcher_type",),
                fix="use alltoall (the default), or flex with moe_enable_deepep: true",
            )
        if self.moe_enable_deepep and dispatcher != "flex":
            raise InvariantError(
                f"moe_enable_deepep runs DeepEP as a backend of the flex token dispatcher, and "
                f"moe_token_dispatcher_type is {dispatcher or 'unset (alltoall)'}: "
                "megatron-core refuses the pair when the trainers start",
                fields=("moe_token_dispatcher_type",),
                fix="set moe_token_dispatcher_type: flex, or moe_enable_deepep: false",
            )
        return self


class RolloutLayout(Section):
    num_gpus: NonNegativeInt | None = None
    gpus_per_engine: PositiveInt | None = None
    sglang: dict[str, Any] = Field(
        default_factory=dict,
        description="SGLang server options by their own names (mem_fraction_static, ...)",
    )


class LayoutConfig(Section):
    name: str = "derived"
    search: bool = Field(
        False,
        description="search every layout that fits for the fastest (layout=auto): the fields "
        "set here stay fixed, the null ones are searched, and recipe.optim.cpu_offload is "
        "chosen too; false: null fields follow the planner's fixed rules",
    )
    colocate: bool | None = None
    train: TrainLayout = Field(default_factory=TrainLayout)
    rollout: RolloutLayout = Field(default_factory=RolloutLayout)
