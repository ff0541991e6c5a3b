"""Hydra's config search path outside `@hydra.main`, and its composition failures as Issues.

The launcher's search path is: Hydra's own configs, conf/ (the main dir), a `--config-dir`
(Hydra inserts it after the main dir, so a user file named like a shipped one is shadowed by
it), then the `hydra.searchpath` entries of the primary config or the command line.
`hydra_session` builds exactly that for callers that are not a `@hydra.main` task
(`rlpost validate`, `rlpost show`, tests), so they find the same files the launcher does.

Hydra reports a misspelled defaults entry or broken YAML in a user's file with a stack trace
or a bare "Could not load"; `composition_issues` turns those into Issues at the file and line,
with did-you-mean from the group's options.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from rlpost.config.hydra_state import session
from rlpost.config.sources import (
    CONF_DIR,
    PRIMARY_CONFIG,
    ConfigRoot,
    display_path,
    find_config,
    group_options,
)
from rlpost.errors import Issue, Location, UserError, did_you_mean

CHOICES_SHOWN = 12
_IN_PARENT = re.compile(r"In '([^']+)': Could not (?:load|find)")
_MERGING = re.compile(r"Error merging override \+*(\S+?)=(.*)")
_NOT_THERE = re.compile(r"Could not delete from config\. '([^']+)' does not exist")
_SECOND_CHOICE = re.compile(
    r"Multiple values for (\S+?)\. To override a value use 'override \S+: (.*)'"
)
_FORCE_ADDED = re.compile(r"force-add of config groups is not supported: '\+\+(\S+?)=(.*)'")
_TWICE = re.compile(r"^(\S+) appears more than once in the final defaults list")


def check_config_dir(config_dir: str | Path | None) -> None:
    """UserError when a `--config-dir` is given but is not a directory."""
    if config_dir is None or Path(config_dir).is_dir():
        return
    raise UserError(
        [
            Issue(
                key="--config-dir",
                value=str(config_dir),
                message=f"{Path(config_dir).resolve()} is not a directory",
                fix="pass the folder that holds your model/, recipe/ and hardware/ folders",
                location=Location(override=f"--config-dir {config_dir}"),
            )
        ],
        title="command-line error",
    )


def launcher_search_path(
    config_dir: str | Path | None = None, main_dir: str | Path = CONF_DIR
) -> list[tuple[str, str]]:
    """(provider, url) pairs in the order `@hydra.main` builds them for the launcher."""
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery

    search_path = create_config_search_path(str(Path(main_dir).resolve()))
    if config_dir is not None:
        search_path.prepend(
            provider="command-line",
            path=f"file://{Path(config_dir).resolve()}",
            anchor=SearchPathQuery(provider="schema"),
        )
    return [(element.provider, element.path) for element in search_path.get_path()]


def hydra_session(
    config_dir: str | Path | None = None, main_dir: str | Path = CONF_DIR
) -> contextlib.AbstractContextManager[None]:
    """Hydra initialized as the launcher is: conf/ (or `main_dir`), then `config_dir`."""
    check_config_dir(config_dir)
    return session(launcher_search_path(config_dir, main_dir))


def primary_searchpath(roots: Sequence[ConfigRoot], config_name: str) -> list[str]:
    """The `hydra.searchpath` a primary config file lists (Hydra reads it from there)."""
    found = find_config(roots, config_name)
    if found is None:
        return []
    try:
        data = yaml.safe_load(found.read_text(encoding="utf-8"))
    except yaml.YAMLError:
        return []  # reported when Hydra loads it
    hydra = data.get("hydra") if isinstance(data, dict) else None
    entries = hydra.get("searchpath") if isinstance(hydra, dict) else None
    if not isinstance(entries, list):
        return []
    from omegaconf import OmegaConf

    try:  # entries may use ${oc.env:...}, as Hydra allows
        resolved = OmegaConf.to_container(OmegaConf.create({"p": entries}), resolve=True)
        entries = resolved["p"] if isinstance(resolved, dict) else entries
    except Exception:  # an unresolvable entry fails in Hydra with its own message
        pass
    return [str(entry) for entry in entries]


# --- composition failures ---------------------------------------------------------------


def _yaml_error(exc: BaseException) -> yaml.YAMLError | None:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, yaml.YAMLError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _repeated_in(node: yaml.Node, line: int, path: str = "") -> tuple[str, int, bool] | None:
    """The key written again at `line` (0-based) in a mapping below `node`: (its dotted path
    in the file, the line it was first written at, whether it holds a mapping)."""
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found = _repeated_in(item, line, f"{path}{i}.")
            if found is not None:
                return found
    if not isinstance(node, yaml.MappingNode):
        return None
    first: dict[str, yaml.Node] = {}
    for key, value in node.value:
        if not isinstance(key, yaml.ScalarNode):
            continue
        if key.value in first and key.start_mark.line == line:
            block = isinstance(value, yaml.MappingNode)
            return f"{path}{key.value}", first[key.value].start_mark.line, block
        first.setdefault(key.value, key)
        found = _repeated_in(value, line, f"{path}{key.value}.")
        if found is not None:
            return found
    return None


def _repeated_key_issue(error: yaml.YAMLError) -> Issue | None:
    """A key written twice in one mapping of a file: OmegaConf refuses to pick one (plain
    YAML would keep the last), so the issue names both lines and how to join them."""
    mark = getattr(error, "problem_mark", None)
    problem = str(getattr(error, "problem", None) or "")
    if mark is None or not problem.startswith("found duplicate key"):
        return None
    try:
        root = yaml.compose(Path(mark.name).read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except (OSError, yaml.YAMLError):
        return None
    found = _repeated_in(root, mark.line) if root is not None else None
    if found is None:
        return None
    key, first_line, block = found
    file, lines = display_path(mark.name), f"lines {first_line + 1} and {mark.line + 1}"
    return Issue(
        key=key,
        message=f"{key} is written twice in {file}, at {lines}: plain YAML keeps only the "
        "second and drops what the first sets without a word; rlpost refuses the file instead",
        fix=(
            f"write {key}: once, holding the keys of both blocks ({lines})"
            if block
            else f"keep one of the two ({lines}) and delete the other"
        ),
        location=Location(file=file, line=mark.line + 1),
    )


def _yaml_issue(error: yaml.YAMLError) -> Issue:
    repeated = _repeated_key_issue(error)
    if repeated is not None:
        return repeated
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    file = display_path(mark.name) if mark is not None else None
    line = mark.line + 1 if mark is not None else None
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    context = getattr(error, "context", None)
    return Issue(
        key="(YAML syntax)",
        message=f"{file or 'a config file'} is not valid YAML: {problem}"
        + (f" ({context})" if context else ""),
        fix="correct the YAML at that line (an unclosed bracket or quote, or a tab used "
        "for indentation, are the usual causes)",
        location=Location(file=file, line=line),
    )


def load_yaml_file(file: Path) -> Any:
    """A YAML file's data as rlpost reads a config file (OmegaConf's loader: a key written
    twice in one mapping is refused, not kept last); UserError naming the file, the line
    and, for a repeated key, both lines."""
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(OmegaConf.load(file), resolve=False)
    except yaml.YAMLError as error:
        raise UserError([_yaml_issue(error)], title="YAML error") from None


def _defaults_line(text: str, name: str) -> int | None:
    """The line of the defaults entry that names `name` (or ends in '/name')."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    if not isinstance(root, yaml.MappingNode):
        return None
    for key, value in root.value:
        if key.value != "defaults" or not isinstance(value, yaml.SequenceNode):
            continue
        for item in value.value:
            scalars = [item] if isinstance(item, yaml.ScalarNode) else []
            if isinstance(item, yaml.MappingNode):
                scalars = [v for _, v in item.value if isinstance(v, yaml.ScalarNode)]
            for scalar in scalars:
                written = str(scalar.value)
                if written == name or written.endswith(f"/{name}"):
                    return int(scalar.start_mark.line) + 1
    return None


def primary_config_issue(name: str, roots: Sequence[ConfigRoot]) -> Issue:
    """`--config-name NAME` naming no top-level config on the search path."""
    options = group_options(roots, "")
    shown = ", ".join(options[:CHOICES_SHOWN]) + (" ..." if len(options) > CHOICES_SHOWN else "")
    return Issue(
        key="--config-name",
        value=name,
        message=f"there is no top-level config '{name}' (a {name}.yaml beside model/, recipe/ "
        f"and hardware/ on the search path).{did_you_mean(name, options)}",
        fix=f"choose one of: {shown} (without --config-name: {PRIMARY_CONFIG})",
        location=Location(override=f"--config-name {name}"),
    )


def check_config_name(name: str | None, roots: Sequence[ConfigRoot]) -> None:
    """UserError when `--config-name` names no top-level config."""
    if name is None or find_config(roots, name) is not None:
        return
    raise UserError([primary_config_issue(name, roots)], title="command-line error")


def _missing_issue(missing: str, parent: str | None, roots: Sequence[ConfigRoot]) -> Issue:
    group, _, name = missing.rpartition("/")
    if not group and parent is None:  # the primary config itself
        return primary_config_issue(name, roots)
    options = group_options(roots, group) if group else []
    location = None
    parent_file = find_config(roots, parent) if parent else None
    if parent_file is not None:
        line = _defaults_line(parent_file.read_text(encoding="utf-8"), name)
        location = Location(file=display_path(parent_file), line=line)
    shown = ", ".join(options[:CHOICES_SHOWN]) + (" ..." if len(options) > CHOICES_SHOWN else "")
    fix = (
        f"choose one of: {shown} (files {group}/<name>.yaml on the search path)"
        if options
        else f"create {missing}.yaml in a config dir on the search path"
    )
    return Issue(
        key="defaults",
        value=name,
        message=f"the defaults list names '{name}', but group '{group or '(top level)'}' has "
        f"no such config.{did_you_mean(name, options)}",
        fix=fix,
        location=location,
    )


def _example_list(items: Sequence[Any]) -> str:
    """A list shaped like `items` for a fix: '[{name: ..., path: ...}, {name: ..., ...}]'."""
    first = items[0] if items else None
    if isinstance(first, Mapping):
        entry = "{" + ", ".join(f"{k}: ..." for k in first) + "}"
    else:
        entry = "..."
    return f"[{entry}, {entry}]"


def _index_issue(exc: BaseException) -> Issue | None:
    """An override of a list entry past the list's end ('datasets.1.path' on a list of
    one): Hydra says only 'list index out of range', under no key."""
    from omegaconf.errors import ConfigIndexError

    cause, merging = exc.__cause__, _MERGING.match(str(exc))
    if not isinstance(cause, ConfigIndexError) or merging is None:
        return None
    key, value = merging.groups()
    list_key = str(cause.full_key).rsplit("[", 1)[0]
    items = list(cause.parent_node) if cause.parent_node is not None else []
    return Issue(
        key=key,
        value=value,
        message=f"{list_key} has {len(items)} entr{'y' if len(items) == 1 else 'ies'}, so there "
        f"is no entry {cause.key} to set: an override changes an entry the list has, and "
        "cannot add one",
        fix=f"write the whole list: {list_key}='{_example_list(items)}'",
        location=Location(override=f"{key}={value}"),
    )


def _delete_issue(exc: BaseException) -> Issue | None:
    """`~key` for a key the composed config does not hold (a layout that leaves it out):
    Hydra says only that it cannot delete it, under no key."""
    absent = _NOT_THERE.search(str(exc))
    if absent is None:
        return None
    key = absent.group(1)
    return Issue(
        key=key,
        message=f"there is no {key} to delete: the config composed from these choices "
        "(model, recipe, hardware and the layout for the pair) does not set it",
        fix=f"remove ~{key} (`rlpost show ... --only {key.rsplit('.', 1)[0]}` shows what "
        "is set), or delete one of the keys it does hold",
        location=Location(override=f"~{key}"),
    )


def _added_group_issue(exc: BaseException) -> Issue | None:
    """`+model=x` or `++model=x` for a group the defaults list already chooses: Hydra says
    'Multiple values for model. To override a value use 'override model: x'' (the defaults
    list's syntax) or that force-add of groups is not supported, under no key."""
    text = str(exc).strip()
    second, forced, twice = (p.search(text) for p in (_SECOND_CHOICE, _FORCE_ADDED, _TWICE))
    if second is not None or forced is not None:
        group, choice = (second or forced).groups()  # type: ignore[union-attr]
        plus = "+" if second is not None else "++"
        why = (
            f"+{group}={choice} adds a second {group} beside the one the defaults list "
            "chooses: '+' adds a config group the config does not choose yet, and a group "
            "takes one choice"
            if second is not None
            else f"++{group}={choice}: Hydra's '++' (add or override) sets config keys, and "
            f"{group} is a config group"
        )
        return Issue(
            key=group,
            value=choice,
            message=why,
            fix=f"write {group}={choice} (without '{plus}') to choose it; in a defaults list, "
            f"a later entry that replaces an earlier choice is written '- override {group}: "
            f"{choice}'",
            location=Location(override=f"{plus}{group}={choice}") if forced else None,
        )
    if twice is not None:
        group = twice.group(1)
        return Issue(
            key=group,
            message=f"{group} is chosen twice: once by the defaults list and again by a "
            f"'+{group}=...' on the command line ('+' adds a config group the config does not "
            "choose yet), or by a second entry in a defaults list",
            fix=f"write {group}=NAME (without '+') to choose it, or name {group} once in a "
            "defaults list",
        )
    return None


def composition_issues(exc: BaseException, roots: Sequence[ConfigRoot]) -> list[Issue]:
    """Hydra's composition failure as Issues located in the file at fault."""
    from hydra.errors import MissingConfigException

    error = _yaml_error(exc)
    if error is not None:
        return [_yaml_issue(error)]
    if isinstance(exc, MissingConfigException) and exc.missing_cfg_file:
        parent = _IN_PARENT.match(str(exc))
        return [_missing_issue(exc.missing_cfg_file, parent.group(1) if parent else None, roots)]
    index = _index_issue(exc) or _delete_issue(exc) or _added_group_issue(exc)
    if index is not None:
        return [index]
    text = str(exc).strip().split("\n\n")[0] or type(exc).__name__
    cause = exc.__cause__
    if cause is not None and str(cause).strip():
        text += f": {str(cause).strip().splitlines()[0]}"
    return [
        Issue(
            key="defaults",
            message=f"Hydra could not compose the config: {text}",
            fix="check the group choices, the defaults lists and the YAML syntax of the "
            "files named above",
        )
    ]


def check_composition(
    config_name: str,
    overrides: Sequence[str],
    roots: Sequence[ConfigRoot],
    config_dir: str | Path | None = None,
    main_dir: str | Path = CONF_DIR,
    merge: bool = False,
) -> None:
    """Compute the defaults list the launcher will compose (with `merge`, compose the config
    too, overrides merged); UserError on any failure."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from hydra.types import RunMode

    with hydra_session(config_dir, main_dir):
        loader = GlobalHydra.instance().config_loader()
        try:
            if merge:
                loader.load_configuration(config_name, list(overrides), RunMode.RUN)
            else:
                loader.compute_defaults_list(config_name, list(overrides), RunMode.RUN)
        except (HydraException, OSError, yaml.YAMLError) as exc:
            raise UserError(composition_issues(exc, roots)) from None
