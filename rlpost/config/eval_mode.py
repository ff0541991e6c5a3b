"""mode=eval refuses training settings given on its command line.

An evaluation trains nothing and reads none of rlpost.schema.training_only's keys: one given
on the command line would be ignored, so it is refused with the reason. The same keys set in
a file are kept: a training recipe (or experiment) is reused for evaluation as it is, and the
plan notes what of it goes unread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlpost.config.diagnostics import ABSENT, value_at
from rlpost.config.sources import SourceMap
from rlpost.errors import Issue
from rlpost.schema.training_only import training_only

EVAL_READS_NO_TRAINING = "mode=eval trains nothing and reads no training settings"


def check_eval_training_overrides(data: Mapping[str, Any], sources: SourceMap) -> list[Issue]:
    """One Issue per command-line token that sets a training-only key of a mode=eval run."""
    if data.get("mode") != "eval":
        return []
    issues: dict[str, Issue] = {}
    for key in sources:  # merge order: a section before the keys inside it
        location = sources.get(key)
        token = location.override
        entry = training_only(key)
        if token is None or entry is None or token in issues:
            continue
        value = value_at(data, key)
        shown = None if value is ABSENT or isinstance(value, Mapping | list) else value
        issues[token] = Issue(
            key,
            f"{EVAL_READS_NO_TRAINING}: {key} sets {entry.why}",
            f"drop the override {token} from the command line, or use mode=train to train with it",
            value=shown,
            location=location,
        )
    return list(issues.values())
