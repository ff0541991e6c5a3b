"""The key paths a run config accepts, read from the pydantic schema itself.

Sections are walked field by field; a `dict[...]` field (SGLang options, chat-template
kwargs) accepts any sub-key, a `list[...]` field takes an index. Used to check command-line
overrides before Hydra runs and to turn pydantic error locations into key paths.
"""

from __future__ import annotations

import difflib
import functools
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import annotated_types
from pydantic.fields import FieldInfo

from rlpost.config.sglang_options import SGLANG_KEY, load_sglang_options
from rlpost.errors import did_you_mean
from rlpost.schema import RunConfig, Section

NodeKind = Literal["section", "dict", "list", "leaf"]


@dataclass(frozen=True)
class KeyNode:
    """What sits at a key path: a section, a free mapping, a list, or a value."""

    kind: NodeKind
    section: type[Section] | None = None
    item: KeyNode | None = None


def _members(annotation: Any) -> list[Any]:
    """The non-None members of a (possibly Optional/Annotated) annotation."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _members(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        members: list[Any] = []
        for arg in typing.get_args(annotation):
            if arg is not type(None):
                members.extend(_members(arg))
        return members
    return [annotation]


def node_for(annotation: Any) -> KeyNode:
    """The KeyNode of a field annotation."""
    for member in _members(annotation):
        if isinstance(member, type) and issubclass(member, Section):
            return KeyNode("section", section=member)
    for member in _members(annotation):
        origin = typing.get_origin(member) or member
        if origin is dict:
            return KeyNode("dict")
        if origin in (list, tuple):
            args = typing.get_args(member)
            return KeyNode("list", item=node_for(args[0]) if args else KeyNode("leaf"))
    return KeyNode("leaf")


ROOT = KeyNode("section", section=RunConfig)


# Other frameworks' names for rlpost's keys, which a close spelling would point elsewhere
# (TRL's max_new_tokens is closest to max_turns): name -> (key, whose name it is, and what
# differs, after a semicolon). slime's, one per flag its import reads, are added from the
# import's table (peer_names).
PEER_NAMES: dict[str, tuple[str, str]] = {
    "max_new_tokens": ("recipe.rollout.max_response_len", "SGLang's and HF generate's"),
    "max_tokens": ("recipe.rollout.max_response_len", "vLLM's"),
    "max_completion_length": ("recipe.rollout.max_response_len", "TRL's"),
    "max_response_length": ("recipe.rollout.max_response_len", "verl's"),
    "response_length": ("recipe.rollout.max_response_len", "verl's rollout"),
    "max_prompt_length": ("recipe.data.max_prompt_len", "verl's and TRL's"),
    "num_generations": ("recipe.rollout.n_samples_per_prompt", "TRL's"),
    "n": ("recipe.rollout.n_samples_per_prompt", "verl's rollout"),
    "rollout_n": ("recipe.rollout.n_samples_per_prompt", "verl's"),
    "n_samples": ("recipe.rollout.n_samples_per_prompt", "OpenRLHF's"),
    "learning_rate": ("recipe.optim.lr", "TRL's"),
    "max_grad_norm": ("recipe.optim.clip_grad", "TRL's"),
    "grad_clip": ("recipe.optim.clip_grad", "verl's"),
    "warmup_steps": ("recipe.optim.lr_warmup_steps", "TRL's"),
    "clip_ratio": ("recipe.algo.eps_clip", "verl's"),
    "clip_ratio_low": ("recipe.algo.eps_clip", "verl's"),
    "clip_ratio_high": ("recipe.algo.eps_clip_high", "verl's"),
    "epsilon": ("recipe.algo.eps_clip", "TRL's"),
    "epsilon_high": ("recipe.algo.eps_clip_high", "TRL's"),
    "beta": ("recipe.algo.kl_loss_coef", "TRL's; the KL in the loss"),
    "entropy_coeff": ("recipe.algo.entropy_coef", "verl's"),
    "adv_estimator": ("recipe.algo.advantage_estimator", "verl's"),
    "loss_agg_mode": (
        "recipe.algo.loss_reduction",
        "verl's; its token-mean is token_mean, seq-mean-token-mean is sample_mean",
    ),
    "train_batch_size": ("recipe.rollout.batch_size", "verl's; prompts per rollout"),
    "rollout_batch_size": ("recipe.rollout.batch_size", "slime's and OpenRLHF's"),
    "ppo_mini_batch_size": (
        "recipe.train.global_batch_size",
        "verl's; counted in prompts there, in samples here",
    ),
    "ppo_micro_batch_size_per_gpu": ("recipe.train.micro_batch_size", "verl's"),
    "micro_batch_size_per_gpu": ("recipe.train.micro_batch_size", "verl's and OpenRLHF's"),
    "ppo_max_token_len_per_gpu": ("recipe.train.max_tokens_per_gpu", "verl's"),
}


@functools.cache
def peer_names() -> dict[str, tuple[str, str]]:
    """PEER_NAMES, and slime's flag names as argparse spells them (`--rollout-max-response-len`
    -> rollout_max_response_len) for the keys its import sets them to, where the two
    differ. Read on a failure's path only: the import's table loads the planner."""
    from rlpost.interop.slime_flags import FLAGS

    slime = {
        rule.flag.removeprefix("--").replace("-", "_"): (
            rule.key,
            f"slime's; {rule.note}" if rule.note else "slime's",
        )
        for rule in FLAGS
        if rule.key.rsplit(".", 1)[-1] != rule.flag.removeprefix("--").replace("-", "_")
    }
    return slime | PEER_NAMES


@dataclass(frozen=True)
class UnknownKey:
    """A key path that leaves the schema at `name`, a child of `parent`."""

    path: str
    parent: str
    name: str
    choices: tuple[str, ...]

    def candidates(self) -> list[str]:
        """Full key paths the user probably meant: the key another framework's name stands
        for, same-named keys elsewhere, a close sibling, else keys of a close spelling
        elsewhere."""
        peers = peer_names()
        if self.name in peers:
            return [peers[self.name][0]]
        same = self.same_named()
        if same:
            return same
        close = difflib.get_close_matches(self.name, self.choices, n=1, cutoff=0.6)
        if close:
            return [f"{self.parent}.{close[0]}" if self.parent else close[0]]
        if self.name in load_sglang_options().options:  # SGLang's, elsewhere
            return [f"{SGLANG_KEY}.{self.name}"]
        return self.close_elsewhere()

    def same_named(self) -> list[str]:
        """Keys of this very name in other sections (recipe.train.lr: recipe.optim.lr)."""
        return [p for p in all_key_paths() if p.rsplit(".", 1)[-1] == self.name][:3]

    def close_elsewhere(self) -> list[str]:
        """Keys of a close spelling in other sections (recipe.loop.num_rollouts:
        recipe.rollout.num_rollout), those under the same top-level section first."""
        leaves = {p.rsplit(".", 1)[-1] for p in all_key_paths()}
        close = difflib.get_close_matches(self.name, leaves, n=1, cutoff=0.85)
        found = [p for p in all_key_paths() if close and p.rsplit(".", 1)[-1] == close[0]]
        top = self.path.split(".", 1)[0]
        found.sort(key=lambda p: p.split(".", 1)[0] != top)  # stable
        return found[:3]

    def suggestion(self) -> str:
        """' Did you mean ...?': the sibling's own name, or the full path of a key elsewhere."""
        peers = peer_names()
        if self.name in peers:
            key, whose = peers[self.name]
            owner, _, differs = whose.partition("; ")
            tail = f"; {differs}" if differs else ""
            return f" Did you mean '{key}'? ('{self.name}' is {owner} name for it{tail})"
        close = "" if self.same_named() else did_you_mean(self.name, self.choices)
        if close:
            return close
        found = self.candidates()
        return " Did you mean " + " or ".join(f"'{p}'" for p in found) + "?" if found else ""

    def fix(self) -> str:
        """The remedy, in one sentence."""
        if not self.choices:
            return f"set {self.parent} itself to a value, or remove '{self.name}'"
        found = self.candidates()
        if found:
            return f"use {' or '.join(found)} instead, or remove the key"
        shown = ", ".join(self.choices)
        return f"remove it; {self.parent or 'the run config'} accepts: {shown}"

    def describe(self) -> str:
        if not self.choices:
            return f"{self.parent} is a single value, so it has no key '{self.name}'"
        where = f"in {self.parent}" if self.parent else "at the top level"
        return f"unknown key '{self.name}' {where}.{self.suggestion()}"


def list_example(path: str, given: Any) -> str | None:
    """How the list at `path` is written on the command line, around the value `given` where
    it is one entry of it ('[5]', '[{name: ..., path: ...}]'); None when `path` holds no list."""
    node = ROOT
    for part in path.split("."):
        if (
            node.kind == "section"
            and node.section is not None
            and part in node.section.model_fields
        ):
            node = node_for(node.section.model_fields[part].annotation)
        elif node.kind == "list" and part.isdigit():
            node = node.item or KeyNode("leaf")
        else:
            return None
    if node.kind != "list":
        return None
    item = node.item
    if item is not None and item.kind == "section" and item.section is not None:
        fields = item.section.model_fields
        required = [name for name, info in fields.items() if info.is_required()]
        entry = "{" + ", ".join(f"{name}: ..." for name in required or list(fields)[:2]) + "}"
    elif isinstance(given, str | int | float) and not isinstance(given, bool):
        entry = str(given)
    else:
        entry = "..."
    return f"{path}='[{entry}]'"


def takes_text(path: str) -> bool:
    """Whether the schema's key at `path` takes a string (a path, a URL, a name)."""
    field = resolve_loc(path.split(".")).field
    return field is not None and str in _members(field.annotation)


def takes_list(path: str) -> bool:
    """Whether the schema's key at `path` holds a list (False for an unknown key)."""
    return list_example(path, None) is not None


def find_unknown(path: str) -> UnknownKey | None:
    """None when `path` is a key the schema accepts, else where it goes wrong."""
    node, done = ROOT, list[str]()
    for part in path.split("."):
        if node.kind == "section":
            assert node.section is not None
            fields = node.section.model_fields
            if part not in fields:
                parent = ".".join(done)
                return UnknownKey(path, parent, part, tuple(fields))
            node = node_for(fields[part].annotation)
        elif node.kind == "list":
            if not part.isdigit():
                return UnknownKey(path, ".".join(done), part, ("0", "1", "..."))
            node = node.item or KeyNode("leaf")
        elif node.kind == "dict":
            node = KeyNode("leaf")  # free-form values: any key, any nesting
            break
        else:
            return UnknownKey(path, ".".join(done), part, ())
        done.append(part)
    return None


@functools.cache
def all_key_paths() -> tuple[str, ...]:
    """Every section field path ('recipe.rollout.temperature', ...); list items as '0'."""
    paths: list[str] = []

    def walk(node: KeyNode, prefix: str) -> None:
        if node.kind == "section" and node.section is not None:
            for name, info in node.section.model_fields.items():
                path = f"{prefix}.{name}" if prefix else name
                paths.append(path)
                walk(node_for(info.annotation), path)
        elif node.kind == "list" and node.item is not None:
            walk(node.item, f"{prefix}.0")

    walk(ROOT, "")
    return tuple(paths)


@dataclass(frozen=True)
class ResolvedLoc:
    """A pydantic error location split into the config key path and the field it names."""

    parts: tuple[str, ...]
    section: type[Section] | None  # the section holding the last part, when there is one
    field: FieldInfo | None

    @property
    def key(self) -> str:
        return ".".join(self.parts)


def resolve_loc(loc: Sequence[str | int]) -> ResolvedLoc:
    """Drop pydantic's union/validator tags from `loc`, keeping only real key parts."""
    node, parts = ROOT, []
    section: type[Section] | None = None
    info: FieldInfo | None = None
    for element in loc:
        text = str(element)
        if node.kind == "section" and node.section is not None:
            section, info = node.section, node.section.model_fields.get(text)
            parts.append(text)
            node = node_for(info.annotation) if info is not None else KeyNode("leaf")
        elif node.kind == "list" and isinstance(element, int):
            parts.append(text)
            section, info = None, None
            node = node.item or KeyNode("leaf")
        elif node.kind == "dict":
            parts.append(text)
            section, info = None, None
            node = KeyNode("dict")
        # otherwise a tag such as 'int' or 'function-after[...]': not a key
    return ResolvedLoc(tuple(parts), section, info)


_BOUNDS = (
    (annotated_types.Gt, "gt", ">"),
    (annotated_types.Ge, "ge", ">="),
    (annotated_types.Lt, "lt", "<"),
    (annotated_types.Le, "le", "<="),
)


def _bounds(metadata: Sequence[Any]) -> str:
    found = []
    for item in metadata:
        for cls, attr, symbol in _BOUNDS:
            if isinstance(item, cls):
                found.append(f"{symbol} {getattr(item, attr)}")
    return " and ".join(found)


def _describe_member(annotation: Any, metadata: Sequence[Any]) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        base, *extra = typing.get_args(annotation)
        return _describe_member(base, [*metadata, *extra])
    if origin is Literal:
        return "one of " + ", ".join(repr(v) for v in typing.get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, Section):
        return f"a mapping with keys {', '.join(annotation.model_fields)}"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    if annotation in names:
        bounds = _bounds(metadata)
        return f"{names[annotation]} {bounds}" if bounds else names[annotation]
    if (origin or annotation) is dict:
        return "a mapping"
    if (origin or annotation) in (list, tuple):
        args = typing.get_args(annotation)
        return f"a list of {_plural(_describe(args[0], ()))}" if args else "a list"
    return getattr(annotation, "__name__", str(annotation))


def _plural(kind: str) -> str:
    for article in ("an ", "a "):
        if kind.startswith(article):
            head, _, rest = kind[len(article) :].partition(" ")
            return f"{head}s {rest}".strip()
    return kind


def _describe(annotation: Any, metadata: Sequence[Any]) -> str:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        kinds = [_describe_member(a, metadata) for a in args if a is not type(None)]
        text = " or ".join(kinds)
        return f"{text}, or null" if type(None) in args else text
    return _describe_member(annotation, metadata)


def describe_field(info: FieldInfo) -> str:
    """'an integer > 0, or null' for `PositiveInt | None`."""
    return _describe(info.annotation, info.metadata)
