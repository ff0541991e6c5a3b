"""Typed config sections. Imports nothing heavier than pydantic."""

from rlpost.schema.algo import AlgoConfig
from rlpost.schema.base import InvariantError, Section
from rlpost.schema.data import DataConfig
from rlpost.schema.evaluation import EvalConfig, EvalDataset
from rlpost.schema.hardware import HardwareConfig
from rlpost.schema.layout import (
    FsdpLayout,
    LayoutConfig,
    RecomputeConfig,
    RolloutLayout,
    TrainLayout,
)
from rlpost.schema.loop import LoopConfig
from rlpost.schema.model import (
    GENERIC_FAMILY,
    MLAConfig,
    ModelConfig,
    MoEConfig,
    RopeScalingConfig,
    rope_fields_unread,
)
from rlpost.schema.optim import OptimConfig
from rlpost.schema.recipe import RecipeConfig
from rlpost.schema.reward import RewardConfig
from rlpost.schema.rollout import RolloutConfig
from rlpost.schema.run import (
    EngineConfig,
    PlanOptions,
    RunConfig,
    RunOptions,
    TrackingConfig,
    TrainerConfig,
    WandbConfig,
)
from rlpost.schema.save import SaveConfig
from rlpost.schema.train import TrainConfig

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
