"""The learning-rate schedule of `OptimConfig`: linear warmup, then constant, linear or cosine
decay to min_lr. Shared by every trainer backend (OptimConfig itself refuses a schedule
that cannot run)."""

from __future__ import annotations

import math
from collections.abc import Callable

from rlpost.schema import OptimConfig

# Decay factor in [0, 1] as a function of decay progress in [0, 1].
DECAY_STYLES: dict[str, Callable[[float], float]] = {
    "constant": lambda progress: 1.0,
    "linear": lambda progress: 1.0 - progress,
    "cosine": lambda progress: 0.5 * (1.0 + math.cos(math.pi * progress)),
}


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
