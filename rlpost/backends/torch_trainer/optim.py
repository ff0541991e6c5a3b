"""AdamW for the torch trainer (the schedule is rlpost.algo.schedule)."""

from __future__ import annotations

import torch
from torch import nn

from rlpost.schema import OptimConfig


def build_optimizer(model: nn.Module, optim: OptimConfig) -> torch.optim.AdamW:
    """AdamW, fused (one kernel a parameter group: on CPU 4-7x faster than the foreach
    kernels on the tiny model, sharded or not); norms and biases (1-D parameters) are
    exempt from weight decay."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": optim.weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        [g for g in groups if g["params"]],
        lr=optim.lr,
        betas=(optim.adam_beta1, optim.adam_beta2),
        eps=optim.adam_eps,
        fused=True,
    )


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
