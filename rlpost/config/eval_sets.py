"""A command line that sets how evaluation sets are sampled, while none is named, is refused.

recipe.eval's n_samples_per_prompt, max_response_len, temperature, top_p, top_k and
skip_before_train are read only by the evaluation of recipe.eval.datasets: with no set named,
one given on the command line would be ignored, so it is refused with the reason. The same
keys set in a file are kept (a recipe's own values stay when a run turns its evaluation off
with recipe.eval.datasets: [] and recipe.eval.interval: null), and the plan notes them as
unread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlpost.config.diagnostics import ABSENT, value_at
from rlpost.config.sources import SourceMap
from rlpost.errors import Issue
from rlpost.schema.evaluation import SET_SETTINGS, EvalConfig

EVAL = "recipe.eval"


def check_eval_set_overrides(data: Mapping[str, Any], sources: SourceMap) -> list[Issue]:
    """One Issue per command-line token that sets one of SET_SETTINGS (to another value than
    its default) while recipe.eval.datasets names no set."""
    if value_at(data, f"{EVAL}.datasets") not in (ABSENT, None, []):
        return []
    fields = EvalConfig.model_fields
    issues: dict[str, Issue] = {}
    for name in SET_SETTINGS:
        key = f"{EVAL}.{name}"
        location = sources.get(key)
        token = location.override
        value = value_at(data, key)
        if token is None or token in issues or value in (ABSENT, fields[name].get_default()):
            continue
        issues[token] = Issue(
            key,
            f"{key} sets how the evaluation sets are evaluated, and {EVAL}.datasets names "
            "none: no evaluation runs, so nothing reads it",
            f"name the sets in {EVAL}.datasets (e.g. {EVAL}.datasets=[{{name: aime, path: "
            f"/data/aime.jsonl}}] with {EVAL}.interval), or drop the override {token} from "
            "the command line",
            value=value,
            location=location,
        )
    return list(issues.values())
