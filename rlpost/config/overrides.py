"""Command-line overrides, checked before Hydra composes anything.

Hydra reports an unknown group choice or key without a suggestion and exits 1 with a
hint about HYDRA_FULL_ERROR. Here each override is parsed with Hydra's own parser and checked
against the config groups on the search path and against the pydantic schema, so a typo
comes back as an Issue with did-you-mean, located on the command line.

Any key the schema accepts may be overridden with or without '+': a field left at its schema
default is absent from the YAML, so such overrides are passed to Hydra as '++key=value'.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlpost.config.keys import find_unknown
from rlpost.config.sources import CONF_DIR, PRIMARY_CONFIG, ConfigRoot, group_options
from rlpost.errors import Issue, Location, UserError, did_you_mean

if TYPE_CHECKING:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Override

NO_RUN_DIR_MODES = frozenset({"plan", "slime_args"})
CHOICES_SHOWN = 12
# the groups conf/config.yaml's defaults list marks optional: leaving one out is `~group`
OPTIONAL_GROUPS = frozenset({"layout"})
# the groups every run needs (RunConfig's model, recipe and hardware): `~group` is refused
REQUIRED_GROUPS = frozenset({"model", "recipe", "hardware"})


@dataclass(frozen=True)
class LaunchArgs:
    """Hydra's command line split into overrides and the flags that matter here."""

    overrides: list[str]
    config_dir: str | None = None
    config_path: str | None = None
    config_name: str | None = None
    multirun: bool = False
    informational: bool = False  # --help, --shell-completion, ...: Hydra answers, no config


def parse_argv(argv: Sequence[str]) -> LaunchArgs:
    """Split argv with Hydra's own argument parser (the one `@hydra.main` uses); UserError for
    a flag that is not one of its own (slime's `--lr 1e-6`: rlpost.config.flags)."""
    from hydra._internal.utils import get_args_parser  # hydra-core 1.3: the same parser

    parser = get_args_parser()
    try:
        args, extra = parser.parse_known_args(list(argv))
    except SystemExit:  # --version, or a malformed flag: let Hydra answer it
        return LaunchArgs(overrides=[], informational=True)
    if any(token.startswith("-") for token in extra):  # slime's --lr 1e-6, a typo of a flag
        from rlpost.config.flags import flag_issues

        known = sorted(parser._option_string_actions)
        raise UserError(flag_issues(argv, known), title="command-line error")
    if extra:  # e.g. overrides after -m: Hydra rejects these with its usage line
        return LaunchArgs(overrides=[], informational=True)
    # --cfg and --info compose the config, so their overrides are checked like a run's
    informational = bool(args.help or args.hydra_help or args.shell_completion)
    return LaunchArgs(
        overrides=list(args.overrides),
        config_dir=args.config_dir,
        config_path=args.config_path,
        config_name=args.config_name,
        multirun=bool(args.multirun),
        informational=informational or bool(args.experimental_rerun),
    )


def flags_first(argv: Sequence[str]) -> list[str]:
    """argv with Hydra's own flags (and their values) ahead of the overrides, each group in
    its order: Hydra's parser takes overrides only after its flags, so `model=x --config-dir
    d recipe=y` would end in its usage line where `rlpost validate` reads it. A flag Hydra does
    not know (slime's `--lr 1e-6`) leaves argv as it is, for parse_argv to answer."""
    from hydra._internal.utils import get_args_parser  # hydra-core 1.3: the same parser

    actions = get_args_parser()._option_string_actions
    flags: list[str] = []
    overrides: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if not token.startswith("-"):
            overrides.append(token)
            continue
        name, given, _ = token.partition("=")
        action = actions.get(name)
        if action is None:
            return list(argv)
        flags.append(token)
        if given:  # --config-dir=d
            continue
        nargs = action.nargs
        if nargs is None:
            take = 1
        elif nargs == "?":  # --info [choice]
            take = int(i < len(argv) and argv[i] in (action.choices or ()))
        else:
            take = nargs if isinstance(nargs, int) else 0
        flags += argv[i : i + take]
        i += take
    return [*flags, *overrides]


def main_dir(config_path: str | None = None, base_dir: Path = CONF_DIR) -> Path:
    """The launcher's main config dir: conf/, or `--config-path` (relative to rlpost/cli)."""
    if not config_path:
        return base_dir
    main = Path(config_path)
    return main if main.is_absolute() else (Path(__file__).resolve().parents[1] / "cli" / main)


def search_roots(
    config_dir: str | None = None,
    config_path: str | None = None,
    searchpath: Iterable[str] = (),
    base_dir: Path = CONF_DIR,
) -> list[ConfigRoot]:
    """The roots in Hydra's order: the main dir, --config-dir, then hydra.searchpath."""
    roots = [ConfigRoot("file", str(main_dir(config_path, base_dir).resolve()))]
    if config_dir:
        roots.append(ConfigRoot("file", str(Path(config_dir).resolve())))
    roots.extend(ConfigRoot.parse(entry) for entry in searchpath)
    return roots


def _is_group(roots: Sequence[ConfigRoot], name: str) -> bool:
    return any(root.options(name) for root in roots)


@functools.cache
def _parser() -> OverridesParser:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


QUOTING = (
    "a string with characters other than letters, digits and _-./: goes in double quotes "
    """inside the shell's single quotes (recipe.rollout.stop='["</answer>", "a b"]')"""
)


def _bare(token: str) -> bool:
    """A token that is no override at all: no '=', no '~key' deletion."""
    return "=" not in token and token[:1] not in "+~-"


def _continued(tokens: Sequence[str]) -> dict[int, list[str]]:
    """Values written the slime way (`stop_token_ids=1 2 3`): by the index of the override
    that has them, the bare tokens after it."""
    runs: dict[int, list[str]] = {}
    owner = None
    for i, token in enumerate(tokens):
        if not _bare(token):
            owner = i if "=" in token else None
        elif owner is not None:
            runs.setdefault(owner, []).append(token)
    return runs


def _continuation_issue(owner: str, more: Sequence[str]) -> Issue:
    from rlpost.config.keys import takes_list, takes_text
    from rlpost.config.override_values import hydra_value

    key, first = owner.split("=", 1)
    key = key.lstrip("+~")
    values = [hydra_value(v) for v in [first, *more]]
    if takes_list(key):
        fix = f"write the list in brackets, quoted for the shell: {key}='[{', '.join(values)}]'"
    elif takes_text(key):
        spaced = " ".join([first, *more])
        fix = (
            f"a value with spaces is one word for the shell: '{key}={spaced}'; or give one "
            f"value ({key}={values[0]})"
        )
    else:
        fix = (
            f"{key} takes one value: give one ({key}={values[0]}), or sweep them, one run "
            f"each, with commas and -m: -m '{key}={','.join(values)}'"
        )
    return Issue(
        key=key,
        value=" ".join([first, *more]),
        message=f"{' '.join(more)}: value(s) after {owner} that are no override (key=value) of "
        "their own; values written slime's way, one after another, are a token each",
        fix=fix,
        location=Location(override=" ".join([owner, *more])),
    )


def _parse(token: str) -> Override | Issue:
    from hydra.errors import HydraException

    try:
        return _parser().parse_override(token)
    except HydraException as exc:
        return Issue(
            key=token.split("=", 1)[0].lstrip("+~"),
            message=f"cannot parse this override: {str(exc).splitlines()[0]}",
            fix="write key=value (a list or mapping in brackets, quoted for the shell: "
            f"key='[1, 2]'; {QUOTING}), group=option, +key=value to add, or ~key to delete",
            location=Location(override=token),
        )


def _choices_of(override: Override) -> list[str]:
    from hydra.core.override_parser.types import ValueType

    if override.is_sweep_override():
        if override.value_type is ValueType.GLOB_CHOICE_SWEEP:
            return []  # glob(...) matches what exists
        return list(override.sweep_string_iterator())
    value = override.value()
    return [] if value is None else [str(value)]


def _shown(available: Sequence[str]) -> str:
    return ", ".join(available[:CHOICES_SHOWN]) + (" ..." if len(available) > CHOICES_SHOWN else "")


def _null_group(override: Override, token: str, roots: Sequence[ConfigRoot]) -> Issue:
    """`group=null`: Hydra raises 'Config group override must be a string or a list' with a
    traceback. A group takes a config's name; leaving an optional one out is `~group`."""
    group = override.key_or_group
    choose = f"choose one of: {_shown(group_options(roots, group))}"
    fix = (
        f"write ~{group} to leave it out (the planner derives the {group} for the model and "
        f"hardware), or {choose}"
        if group in OPTIONAL_GROUPS
        else f"{choose} (files {group}/<name>.yaml on the search path); the run needs a {group}"
    )
    return Issue(
        key=group,
        value=None,
        message=f"{group}=null names no config: a config group takes the name of one of its "
        "configs",
        fix=fix,
        location=Location(override=token),
    )


def _deleted_group(override: Override, token: str, roots: Sequence[ConfigRoot]) -> Issue:
    """`~model`: Hydra fails on the layout's `${model}_${hardware}` (or the schema on a
    missing section), naming neither the override nor what to write."""
    group = override.key_or_group
    return Issue(
        key=group,
        message=f"{token} leaves the {group} out, and every run needs a {group}",
        fix=f"choose one instead: {group}=NAME, one of: {_shown(group_options(roots, group))}",
        location=Location(override=token),
    )


def _check_group(override: Override, token: str, roots: Sequence[ConfigRoot]) -> list[Issue]:
    group = override.key_or_group
    if not override.is_sweep_override() and override.value() is None:
        return [_null_group(override, token, roots)]
    available = group_options(roots, group)
    issues = []
    for choice in _choices_of(override):
        if choice in available:
            continue
        shown = _shown(available)
        issues.append(
            Issue(
                key=group,
                value=choice,
                message=f"no config '{choice}' in group '{group}'."
                f"{did_you_mean(choice, available)}",
                fix=f"choose one of: {shown} (files {group}/<name>.yaml on the search path)",
                location=Location(override=token),
            )
        )
    return issues


def _check_key(override: Override, token: str, verl: Mapping[str, Any]) -> Issue | None:
    unknown = find_unknown(override.key_or_group)
    if unknown is None:
        return None
    value = None if override.is_delete() or override.is_sweep_override() else override.value()
    from rlpost.config.peer_keys import is_peer_key, peer_key_issue

    if is_peer_key(unknown.path):  # data.train_batch_size=1024: the key to write instead
        return peer_key_issue(unknown.path, value, verl, token)
    return Issue(
        key=unknown.path,
        value=value,
        message=unknown.describe(),
        fix=unknown.fix(),
        location=Location(override=token),
    )


def refuse_sweeps(tokens: Sequence[str], why: str, fix: str) -> None:
    """Raise the sweep_issues of `tokens`, if any, as a command-line error."""
    issues = sweep_issues(tokens, why, fix)
    if issues:
        raise UserError(issues, title="command-line error")


def sweep_issues(tokens: Sequence[str], why: str, fix: str) -> list[Issue]:
    """An Issue for each sweep (a,b or range(...)) among `tokens` on a command that runs or
    writes one launch: `why` it cannot take one, and the `fix` ({token} filled in). A list
    key's comma is left to the launcher's own answer (it may mean the list)."""
    from hydra.errors import HydraException

    from rlpost.config.keys import takes_list

    issues = []
    for token in tokens:
        parsed = _parse(token)
        if isinstance(parsed, Issue) or not parsed.is_sweep_override():
            continue
        if takes_list(parsed.key_or_group):
            continue
        key, values = parsed.key_or_group, token.split("=", 1)[1]
        try:
            choices = _choices_of(parsed)
        except HydraException:  # interval(...) has no values to list
            choices = []
        first = f"{key}={choices[0]}" if choices else f"{key}=VALUE"
        issues.append(
            Issue(
                key=key,
                value=values,
                message=f"{values} is a sweep, one run per value, and {why}",
                fix=fix.format(token=token, first=first),
                location=Location(override=token),
            )
        )
    return issues


def _sweep(override: Override, token: str) -> Issue:
    """A sweep (a,b or range(...)) on a launch without -m: Hydra says only 'Ambiguous value',
    under no key."""
    from hydra.errors import HydraException

    key, values = override.key_or_group, token.split("=", 1)[1]
    try:
        choices = _choices_of(override)
    except HydraException:  # interval(...) has no values to list
        choices = []
    from rlpost.config.keys import takes_list

    one = f" ({key}={choices[0]})" if choices else ""
    fix = (
        f"add -m to launch one run per value (python launch.py -m {token}), or give one value{one}"
    )
    if takes_list(key):
        brackets = f"{key}='[{values}]'"
        fix = f"{key} is a list: write it in brackets, quoted for the shell ({brackets}); {fix}"
    return Issue(
        key=key,
        value=values,
        message=f"{values} is a sweep, one run per value, and a launch without -m is one run: "
        "Hydra refuses it",
        fix=fix,
        location=Location(override=token),
    )


def check_override(
    token: str,
    roots: Sequence[ConfigRoot],
    multirun: bool = False,
    verl: Mapping[str, Any] | None = None,
) -> tuple[str, list[Issue]]:
    """One override -> (the form to hand Hydra, issues). `verl`: the peers' keys (verl's,
    NeMo-RL's) on the same command line, which convert a peer key's value (rollout.n for
    verl's prompt counts)."""
    token = _quote_row_slice(token)
    parsed = _parse(token)
    if isinstance(parsed, Issue):
        return token, [parsed]
    if parsed.is_hydra_override() or parsed.key_or_group.split(".")[0] == "hydra":
        return token, []
    sweep = [] if multirun or not parsed.is_sweep_override() else [_sweep(parsed, token)]
    if parsed.package is not None or _is_group(roots, parsed.key_or_group):
        if parsed.is_delete() and parsed.key_or_group in REQUIRED_GROUPS:
            return token, [_deleted_group(parsed, token, roots)]
        return token, ([] if parsed.is_delete() else _check_group(parsed, token, roots)) + sweep
    issue = _check_key(parsed, token, verl or {})
    if issue is not None:
        return token, [issue, *sweep]
    if parsed.is_delete() or parsed.is_force_add() or sweep:
        return token, sweep
    # '+key' fails in Hydra when a file already sets the key; every schema key may be set
    return f"++{token.removeprefix('+')}", []


_ROW_SLICE = re.compile(r"^(?P<key>[+~]*[\w.]+)=(?P<value>[^'\"\\\s]*@\[[^\[\]\s]*\])$")


def _quote_row_slice(token: str) -> str:
    """`key=train.jsonl@[0:1000]`, a prompt path with slime's row slice, in the double quotes
    Hydra's grammar needs around brackets that hold no list (so slime's form is written as
    slime writes it); any other token as it is."""
    match = _ROW_SLICE.match(token)
    return token if match is None else f'{match["key"]}="{match["value"]}"'


def _verl_values(tokens: Sequence[str]) -> dict[str, Any]:
    """The peers' keys among the overrides (verl's, NeMo-RL's) and their values
    (`actor_rollout_ref.rollout.n=5`)."""
    from rlpost.config.peer_keys import is_peer_key

    found: dict[str, Any] = {}
    for token in tokens:
        key = token.split("=", 1)[0].lstrip("+~")
        if "=" not in token or not is_peer_key(key) or find_unknown(key) is None:
            continue
        parsed = _parse(token)
        if not isinstance(parsed, Issue) and not parsed.is_sweep_override():
            found[parsed.key_or_group] = parsed.value()
    return found


def check_overrides(
    tokens: Sequence[str], roots: Sequence[ConfigRoot], multirun: bool = False
) -> list[str]:
    """The overrides to hand Hydra, or a UserError listing every bad one. Sweeps (a,b or
    range(...)) only with `multirun` (-m)."""
    rewritten, issues = [], []
    verl = _verl_values(tokens)
    continued = _continued(tokens)
    taken = {token for more in continued.values() for token in more}
    for i, token in enumerate(tokens):
        if i in continued:
            issues.append(_continuation_issue(token, continued[i]))
            rewritten.append(token)
            continue
        if token in taken and _bare(token):
            rewritten.append(token)
            continue
        form, found = check_override(token, roots, multirun, verl)
        rewritten.append(form)
        issues.extend(found)
    if issues:
        raise UserError(issues, title="command-line error")
    say_repeated_keys(tokens)
    return rewritten


def _target(override: Override) -> str:
    return override.key_or_group + (f"@{override.package}" if override.package else "")


def repeated_keys(tokens: Sequence[str]) -> list[str]:
    """A line for each key (or group) given two different values on one command line. As in
    Hydra (and every command line), the last wins: a script's base arguments followed by an
    experiment's own is a common way to write a command. The line says which value the run
    takes, so nothing is changed without a word. The same value twice (a resume's
    `run.dir=...` added to the command that started the run) changes nothing and is not
    named."""
    first: dict[str, tuple[str, str]] = {}  # target -> token, its value
    lines: list[str] = []
    for token in tokens:
        parsed = _parse(token) if "=" in token else None
        if parsed is None or isinstance(parsed, Issue) or parsed.is_delete():
            continue
        target, value = _target(parsed), token.split("=", 1)[1]
        if not parsed.is_sweep_override():  # 1e-6 and 1.0e-6 are one value
            value = parsed.get_value_element_as_str()
        earlier = first.get(target)
        first[target] = (token, value)
        if earlier is None or earlier[1] == value:
            continue
        after = token.split("=", 1)[1]
        lines.append(
            f"{target} is given twice on the command line, {earlier[0]} and then {token}: "
            f"the last is taken ({target}={after})"
        )
    return lines


_SAID: set[str] = set()


def say_repeated_keys(tokens: Sequence[str]) -> None:
    """Print `repeated_keys`' lines on stderr, each once a process (a sweep checks every job's
    command line, and a launch composes its own more than once)."""
    for line in repeated_keys(tokens):
        if line not in _SAID:
            _SAID.add(line)
            print(f"rlpost: note: {line}", file=sys.stderr)


def command_line_searchpath(tokens: Sequence[str]) -> list[str]:
    """The last `hydra.searchpath=[...]` among `tokens` (the one Hydra takes)."""
    found: list[str] = []
    for token in tokens:
        parsed = _parse(token)
        if not isinstance(parsed, Issue) and parsed.key_or_group == "hydra.searchpath":
            value: Any = parsed.value()
            found = [str(v) for v in value] if isinstance(value, list) else []
    return found


def last_value(tokens: Sequence[str], key: str) -> str | None:
    """The value the last override of `key` in `tokens` gives it (`+key=` too); None when
    none does, or when the last is a sweep."""
    found = None
    for token in tokens:
        parsed = _parse(token)
        if isinstance(parsed, Issue) or parsed.key_or_group != key:
            continue
        found = None if parsed.is_sweep_override() else str(parsed.value())
    return found


def _sets_a_list_entry(token: str) -> bool:
    """Whether an override's key goes through a list index (recipe.eval.datasets.1.path)."""
    key = token.split("=", 1)[0].lstrip("+~")
    return any(part.isdigit() for part in key.split("."))


def _jobs_that_shape_lists(overrides: Sequence[str]) -> list[list[str]]:
    """A sweep's jobs, one per distinct set of group choices, list-entry overrides and
    deletions (what decides whether a list has the entry an override sets): the other
    values swept change no list's length."""
    try:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.override_parser.overrides_parser import OverridesParser

        parsed = OverridesParser.create().parse_overrides(list(overrides))
        batches = BasicSweeper.split_arguments(parsed, None)
    except Exception:  # Hydra refuses the sweep: its own message comes at the launch
        return []
    seen: dict[tuple[str, ...], list[str]] = {}
    for job in (job for batch in batches for job in batch):
        shaping = tuple(
            token
            for token in job
            if "." not in token.split("=", 1)[0] or _sets_a_list_entry(token) or token[:1] == "~"
        )
        seen.setdefault(shaping, list(job))
    return list(seen.values())


def _user_sources(args: LaunchArgs, searchpath: Sequence[str]) -> bool:
    return bool(args.config_dir or args.config_path or args.config_name or searchpath)


TYPED_ARGV: list[str] = []
"""The launch's command line as the user typed it (the program, then its arguments), noted
before prepare_argv's rewriting for Hydra (schema keys marked '++') replaces sys.argv: what
provenance.json records as `argv`. Empty outside the launcher."""


def prepare_argv(argv: Sequence[str]) -> list[str]:
    """Check argv's overrides and return the argv to hand `@hydra.main`.

    Raises UserError for unknown group choices and keys, for a sweep without -m, when configs
    come from outside conf/ (`--config-dir`, `--config-name`, a search path) for defaults
    lists or YAML that Hydra cannot compose, and for a list entry past the list's end. For
    a single `mode=plan` or `mode=slime_args` job, points Hydra's run dir at '.' so nothing
    is created on disk.
    """
    from rlpost.config.search_path import check_composition, check_config_dir, primary_searchpath

    args = parse_argv(argv)
    if args.informational:
        return list(argv)
    check_config_dir(args.config_dir)
    config_name = args.config_name or PRIMARY_CONFIG
    searchpath = command_line_searchpath(args.overrides) or primary_searchpath(
        search_roots(args.config_dir, args.config_path), config_name
    )
    roots = search_roots(args.config_dir, args.config_path, searchpath)
    checked = check_overrides(args.overrides, roots, args.multirun)
    # a list entry past the list's end, or a key to delete that the config does not hold,
    # fails only when Hydra merges the overrides
    indexed = any(_sets_a_list_entry(token) or token.startswith("~") for token in checked)
    # '+group=...' for a group the defaults list chooses: Hydra's own entry would exit 1
    adds_group = any(
        token.startswith("+") and _is_group(roots, token.lstrip("+").split("=", 1)[0])
        for token in checked
    )
    main = main_dir(args.config_path)
    if (_user_sources(args, searchpath) or indexed or adds_group) and not args.multirun:
        check_composition(config_name, checked, roots, args.config_dir, main, merge=indexed)
    elif indexed or adds_group:  # a sweep: each distinct list the entry or deletion goes through
        for job in _jobs_that_shape_lists(checked):
            check_composition(config_name, job, roots, args.config_dir, main, merge=True)
    rewritten = dict(zip(args.overrides, checked, strict=True))
    out = [rewritten.get(token, token) for token in argv]
    mode = last_value(args.overrides, "mode")
    run_dir_given = last_value(args.overrides, "hydra.run.dir") is not None
    if mode in NO_RUN_DIR_MODES and not args.multirun and not run_dir_given:
        out.append("hydra.run.dir=.")
    return out
