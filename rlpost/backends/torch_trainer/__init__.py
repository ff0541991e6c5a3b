"""Trainer backend on plain torch: HF causal LMs, CPU, data parallel over gloo."""

from rlpost.algo.steps import TokenStats
from rlpost.backends.torch_trainer.trainer import TorchTrainer

__all__ = ["TokenStats", "TorchTrainer"]
