"""Turning OmegaConf and pydantic errors into Issues: key path, value, why, fix, location.

Every pydantic error type maps to an Issue: unknown keys get did-you-mean from the
section's own fields, type and range errors state what the field takes, and cross-field
rules (InvariantError) point at the key their `fields` name.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from omegaconf import DictConfig, ListConfig, Node, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from rlpost.config.keys import (
    ResolvedLoc,
    describe_field,
    find_unknown,
    list_example,
    resolve_loc,
)
from rlpost.config.sources import DEFAULT, SourceMap
from rlpost.errors import Issue, did_you_mean
from rlpost.schema import InvariantError, RunConfig

ABSENT = object()


def value_at(data: Any, key: str) -> Any:
    """The plain value at a dotted key, or ABSENT."""
    node = data
    for part in key.split(".") if key else []:
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return ABSENT
    return node


def _shown(value: Any) -> Any:
    """The value for an Issue's head: None hides it; whole sections are not repeated."""
    return None if value is ABSENT or isinstance(value, Mapping | list) else value


def attach_locations(issues: Sequence[Issue], sources: SourceMap) -> list[Issue]:
    """Give every Issue without a location the place its key was set. One whose key is no
    config key (a data file's line, `/data/train.jsonl:7`; a tool or a device) names its own
    place: no file or override set it, and 'default' would say the config's default did."""
    located = []
    for issue in issues:
        if issue.location is None:
            where = sources.set_at_or_below(issue.key)
            if where != DEFAULT or _is_config_key(issue.key):
                issue = dataclasses.replace(issue, location=where)
        located.append(issue)
    return located


def _is_config_key(key: str) -> bool:
    return key.split(".", 1)[0] in RunConfig.model_fields


# --- pydantic -------------------------------------------------------------------------------

Handler = Callable[[ErrorDetails, ResolvedLoc, Any, SourceMap], Issue]


def _unknown_key(err: ErrorDetails, loc: ResolvedLoc, data: Any, sources: SourceMap) -> Issue:
    unknown = find_unknown(loc.key)
    message = unknown.describe() if unknown else f"unknown key '{loc.key}'"
    fix = unknown.fix() if unknown else "remove it"
    value = _shown(err.get("input", ABSENT))
    return Issue(loc.key, message, fix, value=value, location=sources.get(loc.key))


def _missing(err: ErrorDetails, loc: ResolvedLoc, data: Any, sources: SourceMap) -> Issue:
    expected = f" ({describe_field(loc.field)})" if loc.field is not None else ""
    where = sources.locate(loc.key)
    in_file = f" in {where.file}" if where.file else ""
    return Issue(
        loc.key,
        "required key is missing",
        f"set {loc.key.rsplit('.', 1)[-1]}{expected}{in_file}",
        location=where,
    )


def _rule(err: ErrorDetails, loc: ResolvedLoc, data: Any, sources: SourceMap) -> Issue:
    error = (err.get("ctx") or {}).get("error")
    if isinstance(error, InvariantError):
        return _invariant_issue(error, loc, data, sources)
    message = str(error) if error is not None else err["msg"]
    return Issue(
        loc.key or "(run config)",
        message,
        "change the values named above so that the rule holds",
        location=sources.locate(loc.key),
    )


def _invariant_issue(
    error: InvariantError, loc: ResolvedLoc, data: Any, sources: SourceMap
) -> Issue:
    key = ".".join([*loc.parts, error.fields[0]]) if error.fields else loc.key
    return Issue(
        key,
        error.message,
        error.fix,
        value=_shown(value_at(data, key)),
        location=sources.get(key),
    )


def _literal_values(annotation: Any) -> list[str]:
    if typing.get_origin(annotation) is typing.Literal:
        return [str(arg) for arg in typing.get_args(annotation)]
    return [v for arg in typing.get_args(annotation) for v in _literal_values(arg)]


def _literal_hint(err: ErrorDetails, loc: ResolvedLoc) -> str:
    value = err.get("input")
    if err["type"] != "literal_error" or not isinstance(value, str) or loc.field is None:
        return ""
    return did_you_mean(value, _literal_values(loc.field.annotation))


def _bad_value(err: ErrorDetails, loc: ResolvedLoc, data: Any, sources: SourceMap) -> Issue:
    value = err.get("input", ABSENT)
    expected = describe_field(loc.field) if loc.field is not None else None
    message = err["msg"].rstrip(".")
    if value is not ABSENT:
        message += f"; got {type(value).__name__} {value!r}"
    message += "." + _literal_hint(err, loc)
    fix = f"set it to {expected}" if expected else "correct the value"
    location = sources.get(loc.key)
    example = list_example(loc.key, value) if location and location.override else None
    if example is not None:  # `key=5` for a list: the command line's brackets and quotes
        fix += f", on the command line in brackets, quoted for the shell: {example}"
    return Issue(loc.key, message, fix, value=_shown(value), location=location)


def _not_finite(err: ErrorDetails, loc: ResolvedLoc, data: Any, sources: SourceMap) -> Issue:
    value = err.get("input", ABSENT)
    expected = describe_field(loc.field) if loc.field is not None else "a number"
    return Issue(
        loc.key,
        f"must be a finite number; got {value!r}, which no range check can hold (NaN compares"
        " false with everything) and no run can use",
        f"set it to {expected.replace('a number', 'a finite number', 1)}",
        value=_shown(value),
        location=sources.get(loc.key),
    )


HANDLERS: dict[str, Handler] = {
    "extra_forbidden": _unknown_key,
    "finite_number": _not_finite,
    "missing": _missing,
    "value_error": _rule,
    "assertion_error": _rule,
}


def issues_from_validation_error(
    exc: ValidationError, data: Any, sources: SourceMap
) -> list[Issue]:
    """One Issue per pydantic error, in the schema's order."""
    issues = []
    for err in exc.errors():
        loc = resolve_loc(err["loc"])
        handler = HANDLERS.get(err["type"], _bad_value)
        issues.append(handler(err, loc, data, sources))
        error = (err.get("ctx") or {}).get("error")
        if isinstance(error, InvariantError):  # a rule that found several keys wrong
            issues += [_invariant_issue(also, loc, data, sources) for also in error.also]
    return issues


# --- OmegaConf --------------------------------------------------------------------------------


def _children(node: DictConfig | ListConfig) -> list[Any]:
    return list(node.keys()) if isinstance(node, DictConfig) else list(range(len(node)))


def _interpolation_issue(path: str, raw: Any, exc: Exception, sources: SourceMap) -> Issue:
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return Issue(
        key=path,
        value=raw,
        message=f"cannot resolve {raw}: {reason}",
        fix="point the interpolation at an existing key (absolute like "
        "${model.hf_checkpoint}, or relative like ${.hf_checkpoint}), or write the value",
        location=sources.get(path),
    )


def interpolation_issues(
    node: DictConfig | ListConfig, sources: SourceMap, prefix: str = ""
) -> list[Issue]:
    """Every value under `node` that fails to resolve, each at its own key."""
    issues: list[Issue] = []
    for key in _children(node):
        path = f"{prefix}.{key}" if prefix else str(key)
        if OmegaConf.is_missing(node, key):
            issues.append(
                Issue(
                    path,
                    "required value is missing (???)",
                    f"set {path}",
                    location=sources.locate(path),
                )
            )
            continue
        child = node._get_node(key)
        if OmegaConf.is_interpolation(node, key):
            try:
                node[key]
            except (OmegaConfBaseException, ValueError, TypeError) as exc:
                raw = child._value() if isinstance(child, Node) else None
                issues.append(_interpolation_issue(path, raw, exc, sources))
            continue
        if isinstance(child, DictConfig | ListConfig) and not child._is_none():
            issues.extend(interpolation_issues(child, sources, path))
    return issues


def resolve_config(cfg: DictConfig, sources: SourceMap) -> tuple[dict[str, Any], list[Issue]]:
    """The resolved plain dict and the Issues of every value that cannot resolve. Where
    values fail, the dict is the rest of the config resolved without them (a list's item as
    null), so that the schema's and the other checks' problems are reported beside them; ({},
    the issue) when the failure is tied to no key."""
    try:
        data = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except (OmegaConfBaseException, ValueError, TypeError) as exc:
        issues = interpolation_issues(cfg, sources)
        if not issues:  # not tied to one key: report it as a whole
            return {}, [_interpolation_issue("(run config)", None, exc, sources)]
        return _resolved_without(cfg, [issue.key for issue in issues]), issues
    assert isinstance(data, dict)
    return {str(k): v for k, v in data.items()}, []


def _resolved_without(cfg: DictConfig, paths: Sequence[str]) -> dict[str, Any]:
    """`cfg` resolved with the values at `paths` left out; {} if it still fails."""
    rest = cfg.copy()
    for path in paths:
        parent_path, _, key = path.rpartition(".")
        parent = OmegaConf.select(rest, parent_path) if parent_path else rest
        if isinstance(parent, DictConfig) and key in parent:
            with open_dict(parent):
                del parent[key]
        elif isinstance(parent, ListConfig) and key.isdigit() and int(key) < len(parent):
            parent[int(key)] = None
    try:
        data = OmegaConf.to_container(rest, resolve=True, throw_on_missing=True)
    except (OmegaConfBaseException, ValueError, TypeError):
        return {}
    assert isinstance(data, dict)
    return {str(k): v for k, v in data.items()}


def issues_beside(failed: Sequence[Issue], issues: Sequence[Issue]) -> list[Issue]:
    """`issues` less those at or below a key of `failed` (values left out as unresolvable,
    which the schema would call missing or null)."""
    keys = [issue.key for issue in failed]
    return [
        issue
        for issue in issues
        if not any(issue.key == key or issue.key.startswith(f"{key}.") for key in keys)
    ]
