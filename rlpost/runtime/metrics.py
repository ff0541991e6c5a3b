"""Per-rollout metrics: metrics.jsonl always, TensorBoard and wandb when enabled."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from rlpost.schema import TrackingConfig

METRICS_FILE = "metrics.jsonl"


class MetricsLogger:
    """Writes one JSON object per rollout; each line is flushed before the next rollout.

    A crash loses at most the rollout being written, never an earlier one.
    """

    def __init__(self, run_dir: Path, tracking: TrackingConfig, run_name: str) -> None:
        self.path = run_dir / METRICS_FILE
        self._file = self.path.open("a", encoding="utf-8")
        self._tb = None
        self._wandb_run = None
        if tracking.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        if tracking.wandb.enabled:
            self._wandb_run = _start_wandb(run_dir, tracking, run_name)

    @property
    def wandb_run_id(self) -> str | None:
        return self._wandb_run.id if self._wandb_run is not None else None

    def log(self, rollout_id: int, metrics: dict[str, Any]) -> None:
        record = {"rollout_id": rollout_id, **{k: _jsonable(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        numeric = {
            k: v for k, v in record.items() if isinstance(v, int | float) and k != "rollout_id"
        }
        if self._tb is not None:
            for key, value in numeric.items():
                self._tb.add_scalar(key, value, global_step=rollout_id)
            self._tb.flush()
        if self._wandb_run is not None:
            self._wandb_run.log(numeric, step=rollout_id)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb_run is not None:
            self._wandb_run.finish()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / METRICS_FILE
    if not path.exists():
        return []
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _start_wandb(run_dir: Path, tracking: TrackingConfig, run_name: str) -> Any:
    import wandb

    cfg = tracking.wandb
    return wandb.init(
        project=cfg.project,
        group=cfg.group,
        name=run_name,
        id=cfg.run_id,
        resume="allow" if cfg.run_id else None,
        mode=cfg.mode,
        dir=str(run_dir),
    )
