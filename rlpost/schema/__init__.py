"""Typed config sections. Imports nothing heavier than pydantic."""

from rlpost.schema.base import InvariantError, Section
from rlpost.schema.hardware import HardwareConfig
from rlpost.schema.layout import (
    FsdpLayout,
    LayoutConfig,
    RecomputeConfig,
    RolloutLayout,
    TrainLayout,
)
from rlpost.schema.model import (
    GENERIC_FAMILY,
    MLAConfig,
    ModelConfig,
    MoEConfig,
    RopeScalingConfig,
    rope_fields_unread,
)
from rlpost.schema.recipe import (
    AlgoConfig,
    DataConfig,
    EvalConfig,
    EvalDataset,
    LoopConfig,
    OptimConfig,
    RecipeConfig,
    RewardConfig,
    RolloutConfig,
    SaveConfig,
    TrainConfig,
)
from rlpost.schema.run import (
    EngineConfig,
    PlanOptions,
    RunConfig,
    RunOptions,
    TrackingConfig,
    TrainerConfig,
    WandbConfig,
)

__all__ = [
    "GENERIC_FAMILY",
    "AlgoConfig",
    "DataConfig",
    "EngineConfig",
    "EvalConfig",
    "EvalDataset",
    "FsdpLayout",
    "HardwareConfig",
    "InvariantError",
    "LayoutConfig",
    "LoopConfig",
    "MLAConfig",
    "MoEConfig",
    "ModelConfig",
    "OptimConfig",
    "PlanOptions",
    "RecipeConfig",
    "RecomputeConfig",
    "RewardConfig",
    "RolloutConfig",
    "RolloutLayout",
    "RopeScalingConfig",
    "RunConfig",
    "RunOptions",
    "SaveConfig",
    "Section",
    "TrackingConfig",
    "TrainConfig",
    "TrainLayout",
    "TrainerConfig",
    "WandbConfig",
    "rope_fields_unread",
]
