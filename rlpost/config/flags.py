"""Flags on a launch's command line that are not Hydra's: slime's, or a key written as one.

`python launch.py --lr 1e-6` is what a slime user types first. Hydra's argument parser answers
it with its usage line and 'unrecognized arguments: --lr', which says neither that a launch
takes `key=value` overrides nor which key `--lr` stands for. Here each such flag becomes an
Issue naming the rlpost key (slime's flags through the import's own table,
rlpost.interop.slime_flags; any other flag through the schema's key names) and the override
to write instead, with the value the flag was given.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from rlpost.config.override_values import shell_value
from rlpost.config.sglang_options import SGLANG_KEY, OptionSpec, load_sglang_options
from rlpost.errors import Issue, Location

# flags whose value is a credential, never shown (slime's --wandb-key; --tool-key is no secret)
# (OpenRLHF's --use_wandb and --logger.wandb.key are its wandb key, TRL's --hub_token a token)
SECRET = re.compile(
    r"^--wandb-key$|^--use_wandb$|wandb\.key$|api[-_]key|secret|password|(^|[-_])token$"
)


def _same_number(text: str, value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return float(text) == value
    except ValueError:
        return False


def _secret(flag: str) -> bool:
    return SECRET.search(flag.lower()) is not None


def _sglang_option(flag: str) -> tuple[str, OptionSpec] | None:
    """slime's `--sglang-<flag>` as SGLang's option (its name and spec), by any spelling."""
    if not flag.startswith("--sglang-"):
        return None
    wanted = "--" + flag.removeprefix("--sglang-")
    for name, spec in load_sglang_options().options.items():
        if wanted in (spec.cli, *spec.flags):
            return name, spec
    return None


def _slime_issue(flag: str, values: list[str], token: str) -> Issue | None:
    """The Issue for one of slime's flags, or None when slime has no such flag."""
    from rlpost.interop.slime_flags import FIXED_SETTINGS, NOT_IMPORTED, READ_TOGETHER, RULES

    given = " ".join(values) if values else None
    head = f"{flag} is slime's flag; rlpost takes Hydra overrides (key=value), not flags"
    if flag in RULES:
        rule = RULES[flag]
        try:
            value = rule.read(values)
        except (ValueError, IndexError, TypeError, yaml.YAMLError):
            value = given
        if len(values) == 1 and _same_number(values[0], value):
            value = values[0]  # as the user wrote it: 1e-6, not 1e-06
        note = f" ({rule.note})" if rule.note else ""
        if value is None:
            fix = f"write {rule.key}=VALUE"
        else:
            fix = f"write {rule.key}={shell_value(value)}"
        return Issue(
            key=rule.key,
            value=given,
            message=f"{head}, and rlpost's key for it is {rule.key}{note}",
            fix=fix,
            location=Location(override=token),
        )
    if flag in READ_TOGETHER:
        key, note = READ_TOGETHER[flag]
        return Issue(
            key=key,
            value=given,
            message=f"{head}; rlpost's key for it is {key} ({note})",
            fix=f"set {key} instead (`rlpost import slime --table` lists every flag's key)",
            location=Location(override=token),
        )
    if flag in FIXED_SETTINGS:
        return Issue(
            key=flag,
            value=given,
            message=f"{head}; rlpost always runs with {' '.join([flag, *FIXED_SETTINGS[flag]])}",
            fix=f"drop {flag}",
            location=Location(override=token),
        )
    sglang = _sglang_option(flag)
    if sglang is not None and flag not in NOT_IMPORTED:
        name, spec = sglang
        key = f"{SGLANG_KEY}.{name}"
        option: Any = values[0] if len(values) == 1 else (values or None)
        if not values and "bool" in spec.kinds:
            option = True
        return Issue(
            key=key,
            value=given,
            message=f"{head}; slime passes {flag} to SGLang as {spec.cli}, which rlpost's "
            f"layouts set as {key}",
            fix=f"write {key}={shell_value(option)}" if option is not None else f"set {key}",
            location=Location(override=token),
        )
    if flag in NOT_IMPORTED:
        why, near = NOT_IMPORTED[flag]
        nearest = f" (the nearest key: {near})" if near != "-" else ""
        return Issue(
            key=flag,
            value=given,
            message=f"{head}, and rlpost has no setting for it: {why}{nearest}",
            fix=f"drop {flag}",
            location=Location(override=token),
        )
    return None


@dataclass(frozen=True)
class FlagOwner:
    """Whose flags a command line takes: the launcher's (Hydra's) or an rlpost verb's."""

    name: str = "the launcher"
    flags: str = "Hydra's flags"
    takes: str = "Hydra's own flags"

    @classmethod
    def verb(cls, verb: str) -> FlagOwner:
        return cls(f"rlpost {verb}", f"rlpost {verb}'s flags", "its own flags")


LAUNCHER = FlagOwner()


def _other_issue(
    flag: str, values: list[str], token: str, known: Sequence[str], owner: FlagOwner = LAUNCHER
) -> Issue:
    """A flag neither the owner's nor slime's: a key of rlpost's written as a flag, or a typo
    of one of the owner's own flags."""
    from rlpost.config.keys import all_key_paths

    given = " ".join(values) if values else None
    name = flag.lstrip("-").replace("-", "_")
    keys = [p for p in all_key_paths() if p.rsplit(".", 1)[-1] == name][:3]
    close = difflib.get_close_matches(flag, known, n=1, cutoff=0.75)
    value = shell_value(given) if given is not None else "VALUE"
    if keys:
        fix = "write " + " or ".join(f"{key}={value}" for key in keys)
    elif close:
        fix = f"did you mean {close[0]}? {owner.flags}: {', '.join(known)}"
    else:
        fix = (
            f"write the setting as key=value (e.g. recipe.optim.lr=1e-6); {owner.flags}: "
            + ", ".join(known)
        )
    return Issue(
        key=flag,
        value=given,
        message=f"{flag} is not a flag of {owner.name}: it takes {owner.takes} and "
        "overrides key=value",
        fix=fix,
        location=Location(override=token),
    )


def flag_issues(
    argv: Sequence[str], known: Sequence[str], owner: FlagOwner = LAUNCHER
) -> list[Issue]:
    """An Issue for each flag in `argv` that is not in `known` (the parser's own option
    strings, `owner`'s), with the values that follow it up to the next flag or override."""
    from rlpost.config.peer_flags import flag_line, peer_flag_issue

    issues: list[Issue] = []
    tokens = list(argv)
    found = list(_flags(tokens, known))
    line = flag_line([(flag, values) for flag, values, _ in found])
    for flag, values, shown in found:
        if _secret(flag) and values:
            values, shown = ["***"], f"{flag} ***"
        hyphens = "--" + flag.lstrip("-").replace("_", "-") if "." not in flag else flag
        slime = _slime_issue(hyphens, values, shown)
        peer = peer_flag_issue(flag, values, shown, line, slime)
        issues.append(peer or slime or _other_issue(flag, values, shown, known, owner))
    return issues


def _flags(tokens: list[str], known: Sequence[str]) -> list[tuple[str, list[str], str]]:
    """Each flag not in `known`, its values and the token(s) as written."""
    found = []
    for i, token in enumerate(tokens):
        if not token.startswith("-") or token in ("-", "--"):
            continue
        flag, eq, inline = token.partition("=")
        if flag in known or (len(flag) > 2 and flag[1] != "-" and flag[:2] in known):
            continue  # a flag of the parser's own, or its short form with a value (-cdDIR)
        values = [inline] if eq else []
        if not eq:
            for follower in tokens[i + 1 :]:
                if follower.startswith("--") or follower in known or "=" in follower:
                    break
                values.append(follower)
        shown = " ".join([flag, *values]) if not eq else f"{flag}={values[0]}"
        found.append((flag, values, shown))
    return found
