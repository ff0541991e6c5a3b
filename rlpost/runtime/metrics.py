"""Per-rollout metrics: metrics.jsonl always, TensorBoard and wandb when enabled.

A run that starts at rollout n (a resume, or a fresh start in a used directory) first drops
every record of rollout n and later from metrics.jsonl, tells TensorBoard to discard its
events from step n on, and continues the same wandb run: no rollout id is ever logged twice.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlpost.schema import TrackingConfig
from rlpost.types import Sample

METRICS_FILE = "metrics.jsonl"
# an evaluation's record: the rollouts trained before it (its step's rollout_id + 1, or the
# rollout it started from for the one before training)
AFTER_ROLLOUT = "eval/after_rollout"
TENSORBOARD_DIR = "tensorboard"


class MetricsLogger:
    """Writes one JSON object per rollout; each line is flushed before the next rollout.

    A crash loses at most the rollout being written, never an earlier one.
    """

    def __init__(
        self,
        run_dir: Path,
        tracking: TrackingConfig,
        run_name: str,
        *,
        start_rollout: int = 0,
        wandb_run_id: str | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        """`config` is the run's (redacted) config, recorded as the wandb run's config."""
        self.path = run_dir / METRICS_FILE
        truncate_metrics(self.path, start_rollout)
        self._file = self.path.open("a", encoding="utf-8")
        self._tb = None
        self._wandb_run = None
        if tracking.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            tb_dir = run_dir / TENSORBOARD_DIR
            # purge_step makes TensorBoard drop earlier files' events at and after it
            purge = start_rollout if tb_dir.is_dir() and any(tb_dir.iterdir()) else None
            self._tb = SummaryWriter(log_dir=str(tb_dir), purge_step=purge)
        if tracking.wandb.enabled:
            self._wandb_run = _start_wandb(run_dir, tracking, run_name, wandb_run_id, config)

    @property
    def wandb_run_id(self) -> str | None:
        return self._wandb_run.id if self._wandb_run is not None else None

    def log(
        self, rollout_id: int, metrics: dict[str, Any], extra: dict[str, Any] | None = None
    ) -> None:
        """One rollout's metrics (numbers: every tracker) and `extra` (any JSON: the jsonl
        file only, e.g. which groups the step trained)."""
        record = {"rollout_id": rollout_id, **{k: jsonable(v) for k, v in metrics.items()}}
        numeric = {
            k: v for k, v in record.items() if isinstance(v, int | float) and k != "rollout_id"
        }
        self._file.write(json.dumps({**record, **(extra or {})}) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
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
    """The records of a run; a last line cut short by a crash is skipped."""
    return _read_records(run_dir / METRICS_FILE)


def _read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    records = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line the writer never finished
    return records


def truncate_metrics(path: Path, start_rollout: int) -> int:
    """Keep only records of rollouts before `start_rollout`; returns how many were dropped."""
    if not path.exists():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = [r for r in _read_records(path) if int(r.get("rollout_id", -1)) < start_rollout]
    dropped = len([line for line in lines if line.strip()]) - len(kept)
    if dropped:
        staging = path.with_name(path.name + ".tmp")
        with staging.open("w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in kept)
            f.flush()
            os.fsync(f.fileno())
        os.replace(staging, path)
    return dropped


def reward_extra_means(samples: Sequence[Sample], prefix: str) -> dict[str, float]:
    """`<prefix>/reward_extra/<key>`: the mean of each number a scorer's dict held beside
    the reward (`Sample.reward_extra`; a bool counts 1 or 0) over the
    samples whose dict had it as a finite number. Under a prefix of their own, no key
    replaces another metric; strings are not averaged (`run.dump_rollouts` writes them)."""
    found: dict[str, list[float]] = {}
    for sample in samples:
        for key, value in (sample.reward_extra or {}).items():
            if isinstance(value, bool | int | float) and math.isfinite(value):
                found.setdefault(key, []).append(float(value))
    return {f"{prefix}/reward_extra/{key}": _mean(found[key]) for key in sorted(found)}


def _mean(values: list[float]) -> float:
    try:
        return statistics.fmean(values)
    except OverflowError:  # finite values whose sum is not
        return math.fsum(v / len(values) for v in values)


def jsonable(value: Any) -> Any:
    """A metric as JSON holds it: a tensor's or NumPy's number as Python's, not finite as null."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _start_wandb(
    run_dir: Path,
    tracking: TrackingConfig,
    run_name: str,
    resumed_id: str | None,
    config: dict[str, Any] | None,
) -> Any:
    import wandb

    cfg = tracking.wandb
    run_id = cfg.run_id or resumed_id  # a run_id set in the config wins
    return wandb.init(
        project=cfg.project,
        group=cfg.group,
        name=run_name,
        id=run_id,
        resume="allow" if run_id else None,
        mode=cfg.mode,
        dir=str(run_dir),
        config=config,
    )
