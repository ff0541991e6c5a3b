"""The save section (recipe.save): checkpoints and Hugging Face exports."""

from __future__ import annotations

from pydantic import PositiveInt

from rlpost.schema.base import Section


class SaveConfig(Section):
    interval: PositiveInt | None = None
    keep_last: PositiveInt = 3
    save_hf_interval: PositiveInt | None = None
    save_optimizer: bool = True
