"""trainer_side's functions as the driver names them: by name, looked up in the train rank's
process when the call runs there, so the driver never loads torch (it would delay the start of
everything else by the seconds torch takes to import)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

TRAINER_SIDE = "rlpost.backends.sglang.trainer_side"


@dataclass(frozen=True)
class TrainerFunction:
    """`trainer_side.<name>`, called in the process it is sent to."""

    name: str

    def __call__(self, trainer: Any, *args: Any) -> Any:
        return getattr(importlib.import_module(TRAINER_SIDE), self.name)(trainer, *args)


class _ByName:
    def __getattr__(self, name: str) -> TrainerFunction:
        if name.startswith("__"):
            raise AttributeError(name)
        return TrainerFunction(name)


trainer_side = _ByName()
"""`trainer_side.open_weight_stream` and so on, for `call_trainer` and `on_trainer`."""
