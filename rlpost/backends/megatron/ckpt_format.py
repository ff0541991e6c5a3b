"""What a MegatronTrainer checkpoint's record says about its optimizer state (standard library
only: the resume check reads it before anything heavy is imported).

    <ckpt_dir>/rlpost_trainer.json   {"step": 12, "optimizer": true,
                                      "optimizer_format": "fully_reshardable"}
"""

from __future__ import annotations

import json
from pathlib import Path

STATE_FILE = "rlpost_trainer.json"
# Adam state as one tensor per model parameter, keyed by its name: loads under any TP, PP, CP,
# EP, ETP and DP
OPTIMIZER_FORMAT = "fully_reshardable"
# what checkpoints without an "optimizer_format" record hold: loads under the same TP/PP/EP
# and any DP
LEGACY_OPTIMIZER_FORMAT = "dp_reshardable"


def saved_optimizer_format(ckpt_dir: Path) -> str | None:
    """The format of a checkpoint's Adam state; None when it saved none."""
    record = json.loads((ckpt_dir / STATE_FILE).read_text())
    if not record["optimizer"]:
        return None
    return str(record.get("optimizer_format", LEGACY_OPTIMIZER_FORMAT))


def reshardable_keys(ckpt_dir: Path, distributed_optimizer: bool) -> frozenset[str]:
    """The layout.train sizes a checkpoint loads under when they change. The weights load
    under any layout; so does Adam's state in the reshardable format, except that a
    replicated (non-distributed) optimizer keeps its expert grid (EP, ETP), which decides how
    its parameters split into optimizer parts."""
    every = frozenset({"tp", "pp", "cp", "ep", "etp", "dp"})
    fmt = saved_optimizer_format(ckpt_dir)
    if fmt is None:
        return every
    if fmt == LEGACY_OPTIMIZER_FORMAT:
        return frozenset({"dp"})
    return every if distributed_optimizer else every - {"ep", "etp"}
