"""What changed between two resolved configs, and which changes a resumed run cannot take.

Configs are compared as flat `dotted.key -> value` maps of the resolved YAML a run writes
(config.yaml in the run and in every checkpoint). Imports nothing heavy: the config_diff tool
and the resume check both use it.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlpost.errors import Issue, UserError

MISSING = "<absent>"

# Architecture fields: saved weights of one value do not load into a model of another.
SHAPE_FIELDS = (
    "model.family",
    "model.hf_architecture",
    "model.num_layers",
    "model.hidden_size",
    "model.ffn_hidden_size",
    "model.num_attention_heads",
    "model.num_query_groups",
    "model.kv_channels",
    "model.vocab_size",
    "model.qk_layernorm",
    "model.add_qkv_bias",
    "model.add_bias_linear",
    "model.post_self_attn_layernorm",
    "model.post_mlp_layernorm",
    "model.tie_word_embeddings",
    "model.activation",
    "model.mtp_num_layers",
    "model.moe",
    "model.mla",
    "recipe.train.mtp_training",  # the trainer's state holds MTP layers (and their Adam) or not
)

# The prompt order's seed: the data position a checkpoint holds is a place in that order.
DATA_SEED = "recipe.data.seed"

# Keys that say how this launch runs, not what the run is.
IGNORED_ON_RESUME = ("run.resume", "run.progress", "mode", "plan.format")

NOTES = {
    "layout.train": "the saved weights and optimizer state are resharded to the new layout",
    "recipe.data": "the prompt order after the resume differs from the original run's",
    "run.seed": "sampling after the resume differs from the original run's",
    "recipe.rollout.num_rollout": "the run now ends at the new count",
    "run.dir": "the run continues in a new directory (a fork of the checkpoint's run)",
}


@dataclass(frozen=True)
class Change:
    key: str
    before: Any
    after: Any

    def render(self) -> str:
        note = note_for(self.key)
        tail = f"   ({note})" if note else ""
        return f"  {self.key}: {_show(self.before)} -> {_show(self.after)}{tail}"


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists stay whole values (a list is one setting)."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{path}."))
        else:
            flat[path] = value
    return flat


def diff_configs(
    before: Mapping[str, Any], after: Mapping[str, Any], paths: Collection[str] = ()
) -> list[Change]:
    """Every leaf that differs, sorted by key; a key on one side only shows as <absent>.

    The keys in `paths` hold files or folders: two spellings of one (`runs/a` and its
    absolute path) are the same value (`same_path`)."""
    a, b = flatten(before), flatten(after)
    return [
        Change(key, a.get(key, MISSING), b.get(key, MISSING))
        for key in sorted(set(a) | set(b))
        if a.get(key, MISSING) != b.get(key, MISSING)
        and not (key in paths and same_path(a.get(key), b.get(key)))
    ]


def same_path(a: Any, b: Any) -> bool:
    """Whether two path values name one existing file or folder (relative ones from the
    working directory). A path that does not exist here (a hub id, a folder on other
    machines) is the same only as itself, written alike."""
    if not (isinstance(a, str) and isinstance(b, str)):
        return False
    try:
        return os.path.samefile(Path(a).expanduser(), Path(b).expanduser())
    except (OSError, ValueError):
        return False


def _matches(key: str, prefixes: Sequence[str]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def note_for(key: str) -> str | None:
    for prefix, note in NOTES.items():
        if _matches(key, (prefix,)):
            return note
    return None


def _show(value: Any) -> str:
    return value if value == MISSING else repr(value)


@dataclass(frozen=True)
class ParallelChange:
    """A change of the saved training grid (tp, pp, ...): `resharded` when loading copes."""

    key: str
    before: int
    after: int
    resharded: bool


def parallel_changes(
    before: Mapping[str, Any], after: Mapping[str, Any], reshards: Collection[str]
) -> list[ParallelChange]:
    """Differences of the plans' parallel grids; the saved state loads under another value of
    the sizes in `reshards`."""
    changes = []
    for key in ("tp", "pp", "cp", "ep", "etp", "dp"):
        old, new = before.get(key), after.get(key)
        if old is not None and new is not None and old != new:
            changes.append(ParallelChange(key, old, new, key in reshards))
    return changes


def check_resume_changes(
    changes: Sequence[Change],
    grid: Sequence[ParallelChange],
    checkpoint: str,
    backends: tuple[str, str] = ("torch", "torch"),
    mode: str = "train",
) -> list[Change]:
    """The reportable changes; UserError (exit 2) for any that would break the run.

    `backends` are the resolved trainer backends (saved, now): each writes its own format.
    `mode`: an evaluation reads the checkpoint's weights only, and its fixes say so.
    """
    reported = [c for c in changes if not _matches(c.key, IGNORED_ON_RESUME)]
    # an evaluation loads the weights only: its way out of a change is another evaluation
    verb, instead = (
        ("evaluate", "evaluate that folder as model.hf_checkpoint (run.resume=null)")
        if mode == "eval"
        else ("resume", "start a new run from it")
    )
    shape_fix = (
        "to evaluate the checkpoint's weights (they are that model's), or remove run.resume "
        "to evaluate this model's own (model.load, else model.hf_checkpoint)"
        if mode == "eval"
        else "to resume, or start a new run in another run.dir (run.resume=null), loading "
        "the exported HF weights as model.hf_checkpoint"
    )
    issues = [
        Issue(
            key=c.key,
            value=c.after,
            message=f"is {_show(c.before)} in checkpoint {checkpoint}: the saved weights "
            "have another shape (or another backend's format) and cannot be loaded",
            fix=f"set {c.key}={_show(c.before)} {shape_fix}",
        )
        for c in reported
        if _matches(c.key, SHAPE_FIELDS)
    ]
    issues += [
        Issue(
            key=f"layout.train.{g.key}",
            value=g.after,
            message=f"the checkpoint was saved with {g.key}={g.before}, and its saved state "
            f"cannot be resharded to {g.key}={g.after} (the torch trainer's state is data "
            "parallel only; a megatron checkpoint written before rlpost saved Adam's state "
            "per parameter keeps its TP/PP/EP; a replicated optimizer keeps its EP/ETP)",
            fix=f"{verb} with {g.key}={g.before} (set layout.train.{g.key}), or export the "
            f"checkpoint to HF (tools/export_hf.py) and {instead}",
        )
        for g in grid
        if not g.resharded
    ]
    issues += [
        Issue(
            key=c.key,
            value=c.after,
            message=f"is {_show(c.before)} in checkpoint {checkpoint}: the saved data "
            "position is a place in the prompt order that seed drew, and the checkpoint's "
            "seed goes on drawing it (another would repeat and skip prompts)",
            fix=f"set {c.key}={_show(c.before)} to resume, or start a new run for another "
            "prompt order",
        )
        for c in reported
        if c.key == DATA_SEED
    ]
    saved, now = backends
    if saved != now:
        issues.append(
            Issue(
                key="trainer.backend",
                value=now,
                message=f"the checkpoint {checkpoint} holds the {saved} trainer's state, in "
                f"that trainer's own format; the {now} trainer cannot load it",
                fix=f"{verb} with trainer.backend={saved}, or export the checkpoint to HF "
                f"(tools/export_hf.py) and {instead}",
            )
        )
    if issues:
        what = "evaluating the checkpoint" if mode == "eval" else "resuming"
        raise UserError(issues, title=f"change that prevents {what}")
    return reported


def render_changes(changes: Sequence[Change]) -> str:
    return "\n".join(c.render() for c in changes)
