"""The train section (recipe.train): the optimizer step's batch and its micro-batches."""

from __future__ import annotations

from pydantic import (
    Field,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from rlpost.schema.base import InvariantError, Section, refuse_unused
from rlpost.schema.training_only import training_rule


class TrainConfig(Section):
    global_batch_size: PositiveInt
    micro_batch_size: PositiveInt = 1
    use_dynamic_batch_size: bool = False
    max_tokens_per_gpu: PositiveInt | None = None
    balance_data: bool = False
    mtp_training: bool = Field(
        False,
        description="train the model's multi-token-prediction layers (model.mtp_num_layers) "
        "beside the policy, so a speculative decoder that drafts with them keeps up with it",
    )
    mtp_loss_scaling_factor: PositiveFloat = Field(
        0.2, description="weight of the MTP loss (mean over MTP layers) beside the policy loss"
    )

    @model_validator(mode="after")
    @training_rule
    def check_batching_settings_used(self) -> TrainConfig:
        if self.use_dynamic_batch_size:
            refuse_unused(
                self,
                "micro_batch_size",
                why="use_dynamic_batch_size packs micro-batches by max_tokens_per_gpu, not by "
                "a sample count",
                fix="remove micro_batch_size (or set it to 1), or use_dynamic_batch_size: false",
            )
        else:
            refuse_unused(
                self,
                "max_tokens_per_gpu",
                why="micro-batches hold micro_batch_size samples each when "
                "use_dynamic_batch_size is false",
                fix="set use_dynamic_batch_size: true to pack by tokens, or "
                "max_tokens_per_gpu: null",
            )
        return self

    @model_validator(mode="after")
    @training_rule
    def check_mtp_settings_used(self) -> TrainConfig:
        if not self.mtp_training:
            refuse_unused(
                self,
                "mtp_loss_scaling_factor",
                why="it weighs the multi-token-prediction loss, and mtp_training is off",
                fix="set mtp_training: true, or remove mtp_loss_scaling_factor",
            )
        return self

    @model_validator(mode="after")
    @training_rule
    def check_dynamic_batch_has_cap(self) -> TrainConfig:
        if self.use_dynamic_batch_size and self.max_tokens_per_gpu is None:
            raise InvariantError(
                "use_dynamic_batch_size packs samples into micro-batches up to "
                "max_tokens_per_gpu, which is not set",
                fields=("max_tokens_per_gpu",),
                fix="set max_tokens_per_gpu (the seeds use 4608-16384 on H100), "
                "or use_dynamic_batch_size: false",
            )
        return self
