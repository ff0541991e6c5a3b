"""SGLang server options as a typed pass-through (`layout.rollout.sglang`).

Users name any SGLang server option by its own name; the names, types and defaults come
from sglang_options.json, generated from SGLang's ServerArgs by tools/gen_sglang_options.py,
so SGLang itself is never imported here. Options that rlpost derives from the plan for each
engine are refused with the rlpost key that sets them.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlpost.errors import Issue, did_you_mean

OPTIONS_FILE = Path(__file__).with_name("sglang_options.json")
SGLANG_KEY = "layout.rollout.sglang"

# option -> (what sets it in rlpost, the fix)
PLAN_OWNED: dict[str, tuple[str, str]] = {
    "tp_size": (
        "each engine's tensor-parallel size is layout.rollout.gpus_per_engine",
        "set layout.rollout.gpus_per_engine instead",
    ),
    "model_path": (
        "engines load model.hf_checkpoint",
        "set model.hf_checkpoint instead",
    ),
    "host": ("rlpost assigns each engine's address", "remove it"),
    "port": ("rlpost assigns each engine's port", "remove it"),
    "base_gpu_id": (
        "the placement (layout.colocate, layout.rollout.num_gpus) decides each engine's GPUs",
        "remove it; change layout.colocate or layout.rollout.num_gpus to move engines",
    ),
    "nnodes": (
        "an engine spans layout.rollout.gpus_per_engine / hardware.gpus_per_node nodes",
        "set layout.rollout.gpus_per_engine instead",
    ),
    "node_rank": ("rlpost gives each node of a multi-node engine its rank", "remove it"),
    "dist_init_addr": (
        "rlpost picks the first node of each multi-node engine as its rendezvous",
        "remove it",
    ),
}


@dataclass(frozen=True)
class OptionSpec:
    """One SGLang option: accepted kinds ('int', 'list[int]', ...), null, fixed choices."""

    name: str
    kinds: tuple[str, ...]
    nullable: bool
    choices: tuple[Any, ...] | None = None
    default: Any = None

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.nullable
        if not any(_is_kind(value, kind) for kind in self.kinds):
            return False
        return self.choices is None or value in self.choices

    def expected(self) -> str:
        if self.choices is not None:
            text = "one of " + ", ".join(repr(c) for c in self.choices)
        else:
            text = " or ".join(_KIND_WORDS.get(k, k) for k in self.kinds)
        return f"{text}, or null" if self.nullable else text


_KIND_WORDS = {
    "bool": "true or false",
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "dict": "a mapping",
    "any": "any value",
}


def _is_kind(value: Any, kind: str) -> bool:
    if kind == "any":
        return True
    if kind.startswith("list["):
        item = kind[len("list[") : -1]
        return isinstance(value, list) and all(_is_kind(v, item) for v in value)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    if kind == "dict":
        return isinstance(value, dict)
    return False


@dataclass(frozen=True)
class SGLangOptions:
    version: str
    options: Mapping[str, OptionSpec]


@functools.cache
def load_sglang_options(path: Path = OPTIONS_FILE) -> SGLangOptions:
    """The option table shipped with rlpost (read once)."""
    document = json.loads(path.read_text(encoding="utf-8"))
    options = {
        name: OptionSpec(
            name=name,
            kinds=tuple(entry["type"]),
            nullable=bool(entry["nullable"]),
            choices=tuple(entry["choices"]) if "choices" in entry else None,
            default=entry.get("default"),
        )
        for name, entry in document["options"].items()
    }
    return SGLangOptions(version=str(document["sglang_version"]), options=options)


def check_option(name: str, value: Any, table: SGLangOptions) -> Issue | None:
    """The problem with one `layout.rollout.sglang.<name>: <value>`, if any."""
    key = f"{SGLANG_KEY}.{name}"
    if name in PLAN_OWNED:
        why, fix = PLAN_OWNED[name]
        return Issue(key, f"'{name}' is set by rlpost for each engine: {why}", fix, value=value)
    spec = table.options.get(name)
    if spec is None:
        hint = did_you_mean(name, table.options)
        return Issue(
            key,
            f"SGLang {table.version} has no server option '{name}'.{hint}",
            "use SGLang's own option name (ServerArgs field, e.g. mem_fraction_static for "
            "--mem-fraction-static), or remove it",
            value=value,
        )
    if not spec.accepts(value):
        return Issue(
            key,
            f"SGLang option '{name}' takes {spec.expected()}; got {type(value).__name__} {value!r}",
            f"set it to {spec.expected()} (SGLang's default: {spec.default!r})",
            value=value,
        )
    return None


def check_sglang_options(options: Any) -> list[Issue]:
    """Problems with the `layout.rollout.sglang` mapping (resolved, plain values)."""
    if not isinstance(options, Mapping):
        return []  # the schema reports a non-mapping itself
    table = load_sglang_options()
    found = (check_option(str(name), value, table) for name, value in options.items())
    return [issue for issue in found if issue is not None]
