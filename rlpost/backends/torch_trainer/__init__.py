"""Trainer backend on plain torch: HF causal LMs, CPU, data parallel over gloo."""

from rlpost.backends.torch_trainer.trainer import TokenStats, TorchTrainer

__all__ = ["TokenStats", "TorchTrainer"]
