"""AdamW with the learning-rate schedule of `OptimConfig`."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from rlpost.schema import OptimConfig

# Decay factor in [0, 1] as a function of decay progress in [0, 1].
DECAY_STYLES: dict[str, Callable[[float], float]] = {
    "constant": lambda progress: 1.0,
    "linear": lambda progress: 1.0 - progress,
    "cosine": lambda progress: 0.5 * (1.0 + math.cos(math.pi * progress)),
}


def check_schedule(optim: OptimConfig) -> None:
    decays = optim.lr_decay_style != "constant"
    if decays and optim.lr_decay_steps is None:
        raise ValueError(
            f"optim.lr_decay_style={optim.lr_decay_style!r} needs optim.lr_decay_steps (the "
            "step at which lr reaches min_lr); set it, or use lr_decay_style: constant"
        )
    if (
        decays
        and optim.lr_decay_steps is not None
        and optim.lr_decay_steps <= optim.lr_warmup_steps
    ):
        raise ValueError(
            f"optim.lr_decay_steps={optim.lr_decay_steps} must exceed "
            f"optim.lr_warmup_steps={optim.lr_warmup_steps}: decay starts after warmup"
        )


def lr_at_step(step: int, optim: OptimConfig) -> float:
    """Learning rate for the optimizer step numbered `step` (0-based).

    Warmup rises linearly so that step 0 already moves (lr * 1/warmup); decay then runs
    from lr to min_lr between the end of warmup and `lr_decay_steps` (counted from 0).
    """
    if step < optim.lr_warmup_steps:
        return optim.lr * (step + 1) / optim.lr_warmup_steps
    if optim.lr_decay_style == "constant" or optim.lr_decay_steps is None:
        return optim.lr
    span = optim.lr_decay_steps - optim.lr_warmup_steps
    progress = min(max((step - optim.lr_warmup_steps) / span, 0.0), 1.0)
    factor = DECAY_STYLES[optim.lr_decay_style](progress)
    return optim.min_lr + (optim.lr - optim.min_lr) * factor


def build_optimizer(model: nn.Module, optim: OptimConfig) -> torch.optim.AdamW:
    """AdamW; norms and biases (1-D parameters) are exempt from weight decay."""
    check_schedule(optim)
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
        foreach=True,
    )


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
