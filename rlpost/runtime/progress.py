"""A progress bar per rollout: reward, KL, step time and rollout tokens/s at a glance."""

from __future__ import annotations

import logging
import sys
from typing import Any

from tqdm import tqdm

SHOWN = (
    ("reward", "rollout/reward_mean", "{:.3f}"),
    ("kl", "train/kl", "{:.2e}"),
    ("step", "perf/step_time_s", "{:.2f}s"),
    ("tok/s", "perf/rollout_tokens_per_s", "{:.0f}"),
)


class Progress:
    def __init__(self, total: int, initial: int = 0, enabled: bool = True) -> None:
        self.bar = tqdm(
            total=total,
            initial=initial,
            desc="rollouts",
            unit="rollout",
            disable=not enabled,
            file=sys.stdout,
            dynamic_ncols=True,
        )

    def update(self, metrics: dict[str, Any]) -> None:
        shown = {
            label: fmt.format(metrics[key])
            for label, key, fmt in SHOWN
            if isinstance(metrics.get(key), int | float)
        }
        self.bar.set_postfix(shown, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def status(message: str) -> None:
    """One line about what the run is doing, for the person watching it."""
    print(f"[rlpost] {message}", flush=True)


def trainer_notes_to_stderr() -> None:
    """rlpost's INFO records (and above) of this process on stderr, as `[rlpost] name: ...`:
    in a train rank, the once-a-process notes of what runs where (the torch trainer's layers on
    rlpost's kernels, the megatron trainer's measured attention path, cuDNN's plan budget), which
    Ray's workers, whose root logger stays at WARNING, would drop. Idempotent."""
    logger = logging.getLogger("rlpost")
    if any(getattr(h, "rlpost_notes", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[rlpost] %(name)s: %(message)s"))
    handler.rlpost_notes = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
