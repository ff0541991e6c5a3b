"""The learning-rate schedule of `OptimConfig`: linear warmup, then constant, linear or cosine
decay to min_lr. Shared by every trainer backend."""

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
