"""The loop section (recipe.loop): how rollout and training interleave."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    NonNegativeInt,
    PositiveInt,
    model_validator,
)

from rlpost.schema.base import Section, refuse_unused
from rlpost.schema.training_only import training_rule

LoopMode = Literal["sync", "async", "fully_async"]
DEFAULT_MAX_STALENESS = 4
"""fully_async's max_staleness when it is unset."""


class LoopConfig(Section):
    """How rollout and training interleave: one pipeline (a producer of rewarded groups, a
    bounded queue, the trainer) whose bounds each mode sets.

    - sync: rollout N is generated with the weights after N train steps.
    - async (slime's train_async.py): rollout N+1 is generated while rollout N trains; samples
      are at most `update_weights_interval` policy versions old.
    - fully_async: a producer generates continuously into a queue of `max_buffered_groups`
      groups; the trainer takes a batch as soon as one is there; a group whose oldest token
      would be more than `max_staleness` versions behind the trained version is dropped or
      regenerated (`stale_groups`). Weight updates interrupt generation: requests are
      paused, the weights swapped, and generation continues under the new version.
    """

    mode: LoopMode = "sync"
    update_weights_interval: PositiveInt = Field(
        1,
        description="rollouts between weight updates to the engines (slime's "
        "--update-weights-interval); an evaluation updates them too",
    )
    max_staleness: NonNegativeInt | None = Field(
        None,
        description="fully_async: policy versions a trained token may lag behind the trained "
        "version (null: 4); sync and async derive it (interval - 1, interval)",
    )
    max_buffered_groups: PositiveInt | None = Field(
        None,
        description="fully_async: a draw of prompts starts while fewer groups than this are "
        "generated or generating ahead of the trainer, and starts whole, so filtered or stale "
        "groups let up to one draw less one more wait (the plan sizes the queue's memory for "
        "that); slime's --async-buffer-size; null: two rollouts' worth; async derives it",
    )
    stale_groups: Literal["drop", "regenerate"] = Field(
        "regenerate",
        description="fully_async: a group past max_staleness is dropped, or its prompt is "
        "generated again under the current weights (both counted)",
    )

    @model_validator(mode="after")
    @training_rule
    def check_bounds_belong_to_fully_async(self) -> LoopConfig:
        if self.mode != "fully_async":
            for name in ("max_staleness", "max_buffered_groups", "stale_groups"):
                refuse_unused(
                    self,
                    name,
                    why=f"loop.mode {self.mode} sets the pipeline's bounds itself (sync: "
                    "generation waits for the weights; async: one rollout ahead, at most "
                    "update_weights_interval versions old)",
                    fix=f"set mode: fully_async, or remove {name}",
                )
        # that the bound spans the steps between two weight pushes:
        # RecipeConfig.check_staleness_spans_the_pushes (an evaluation pushes too)
        return self
