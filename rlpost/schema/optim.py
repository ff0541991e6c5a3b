"""The optimizer section (recipe.optim): Adam and the learning-rate schedule."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from rlpost.schema.base import InvariantError, Section, refuse_unused
from rlpost.schema.training_only import training_rule


class OptimConfig(Section):
    optimizer: Literal["adam"] = "adam"
    lr: PositiveFloat = 1e-6
    min_lr: NonNegativeFloat = 0.0
    lr_decay_style: Literal["constant", "linear", "cosine"] = "constant"
    lr_warmup_steps: NonNegativeInt = 0
    lr_decay_steps: PositiveInt | None = None
    weight_decay: NonNegativeFloat = 0.0
    adam_beta1: float = Field(0.9, ge=0.0, lt=1.0)
    adam_beta2: float = Field(0.999, ge=0.0, lt=1.0)
    adam_eps: PositiveFloat = 1e-8
    clip_grad: NonNegativeFloat = 1.0
    cpu_offload: bool = False
    overlap_cpu_optimizer_d2h_h2d: bool = False
    precision_aware_optimizer: bool = False

    @model_validator(mode="after")
    @training_rule
    def check_schedule(self) -> OptimConfig:
        if self.lr_decay_style == "constant":
            why = "lr_decay_style is constant"
            for name in ("lr_decay_steps", "min_lr"):
                refuse_unused(
                    self,
                    name,
                    why=why,
                    fix=f"set lr_decay_style: linear or cosine, or remove {name}",
                )
            return self
        if self.lr_decay_steps is None:
            raise InvariantError(
                f"lr_decay_style={self.lr_decay_style} decays the learning rate to min_lr by "
                "step lr_decay_steps, which is not set",
                fields=("lr_decay_steps",),
                fix="set lr_decay_steps (e.g. the run's optimizer steps), or use "
                "lr_decay_style: constant",
            )
        if self.lr_decay_steps <= self.lr_warmup_steps:
            raise InvariantError(
                f"lr_decay_steps={self.lr_decay_steps} must exceed lr_warmup_steps="
                f"{self.lr_warmup_steps}: decay starts when warmup ends",
                fields=("lr_decay_steps",),
                fix=f"set lr_decay_steps above {self.lr_warmup_steps}",
            )
        if self.min_lr > self.lr:
            raise InvariantError(
                f"min_lr={self.min_lr} is above lr={self.lr}: the schedule would raise the "
                "learning rate while it 'decays'",
                fields=("min_lr",),
                fix=f"set min_lr below {self.lr} (e.g. {self.lr / 10:g})",
            )
        return self

    @model_validator(mode="after")
    @training_rule
    def check_offload_options(self) -> OptimConfig:
        if not self.cpu_offload:
            refuse_unused(
                self,
                "overlap_cpu_optimizer_d2h_h2d",
                why="it overlaps the copies of a CPU-offloaded optimizer, and cpu_offload is off",
                fix="set cpu_offload: true, or remove it",
            )
        return self
