"""The prompt files a launch reads (recipe.data.prompt_data, every evaluation set): every row
its path selects reads as the prompt loader reads it, with a label its grader can read.

Quick: data files are parsed as JSON, never tokenized (prompt length against
data.max_prompt_len is judged when the tokenizer loads, still before anything starts).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from pathlib import Path

from rlpost.config.chat_templates import template_markers
from rlpost.data.files import RawRow, UnreadableFile, prompt_rows, row_count
from rlpost.data.prompts import LineError, PromptFormat, Row, prompt_format, read_row
from rlpost.errors import Issue
from rlpost.plan.plan import Plan
from rlpost.schema import RunConfig
from rlpost.schema.prompt_file import split_prompt_path
from rlpost.schema.reward import (
    LABELLED_REWARD_TYPES,
    UNREGISTERED_REWARD_TYPES,
    RewardConfig,
    RewardType,
)

MAX_BAD_LINES = 5

REWARD_TYPES = frozenset(typing.get_args(RewardType))


@dataclass(frozen=True)
class RowRules:
    """What a prompt file's lines must hold: `fmt` reads them as the prompt loader does
    (keys, tools, template), `labelled` says whether the reward grades against the label,
    `reward_type` grades them (`forced`: over a line's own metadata rm_type, as an eval set's
    reward_type does), and `scorer`, when given, scores every sample without reading rm_type."""

    fmt: PromptFormat
    labelled: bool
    reward_type: str | None = None
    scorer: str | None = None
    forced: bool = False
    # whether a line's rm_type picks its grader: not where a custom function scores every
    # sample (before any rm_type, as slime's --custom-rm-path; it may read rm_type itself)
    rm_type_grades: bool = True
    has_server: bool = False  # recipe.rollout.reward.remote_url is set
    markers: tuple[str, ...] = ()  # the chat template's (template_markers)
    # the config key that names each of fmt's line keys ('prompt' -> recipe.data.input_key):
    # a key no line has is that setting's problem, said once
    key_settings: tuple[tuple[str, str], ...] = ()
    # an evaluation set scored without a label: the key that says its lines have none
    unlabelled_key: str | None = None
    # the setting that names the label's key (fmt.label_key None: false or unset there)
    label_setting: str = "recipe.data.label_key"


def check_prompt_file(key: str, path_text: str, rules: RowRules) -> list[Issue]:
    """Every row a prompt file's path selects (a jsonl or parquet file, its row slice applied)
    reads as the prompt loader reads it (`read_row`: JSON, keys, label, metadata, tools,
    message lists without a template), with a label its grader can read (`rules`); the checks
    that need the tokenizer wait for the run."""
    prompt_file = split_prompt_path(path_text)
    path = Path(prompt_file.path).expanduser()
    kind, unit = prompt_file.kind, prompt_file.unit
    fix_path = f"point {key} at an existing {kind} file" + (
        " (one JSON object per line)" if kind == "jsonl" else ""
    )
    if not path.is_file():
        what = f"is a folder, not a {kind} file" if path.is_dir() else "no such file"
        return [Issue(key, f"{what} on this machine", fix_path, value=path_text)]
    issues: list[Issue] = []
    bad = rows = 0
    lacking: dict[str, int] = {}  # a row key -> how many rows lack it
    keys_there: set[str] = set()
    try:
        for number, raw in prompt_rows(prompt_file):
            rows += 1
            problem = _row_problem(number, raw, rules, unit)
            if problem is None:
                continue
            bad += 1
            what, fix, missing = problem
            if missing is not None:
                lacking[missing[0]] = lacking.get(missing[0], 0) + 1
                keys_there.update(missing[1])
            if len(issues) < MAX_BAD_LINES:
                where = f"{path}:{number}" if unit == "line" else f"{path}, row {number}"
                issues.append(Issue(where, what, fix, value=None))
        total = row_count(prompt_file) if not rows and prompt_file.rows is not None else 0
    except UnreadableFile as exc:
        return [Issue(key, str(exc), fix_path, value=path_text)]
    for field, setting in rules.key_settings:
        if rows and lacking.get(field) == rows:  # the setting names a key no row has
            there = ", ".join(sorted(keys_there)) or "none"
            label = not setting.endswith("input_key")
            fix_key = f"point {key} at a file whose {unit}s have '{field}'"
            if label and rules.unlabelled_key:
                fix_key += f", or set {rules.unlabelled_key}: false (its scorer reads no label)"
            return [
                Issue(
                    setting,
                    f"no {unit} of {path} has the key '{field}' (keys there: {there})",
                    f"set {setting} to the key that holds the "
                    f"{'label' if label else 'prompt'} (one of: {there}), or {fix_key}",
                    value=field,
                )
            ]
    if bad > len(issues):
        issues.append(
            Issue(
                str(path),
                f"{bad - len(issues)} more bad {unit}(s) ({bad} of {rows})",
                f"fix every {unit} listed by the same rule",
            )
        )
    if not rows and total:
        issues.append(
            Issue(
                key,
                f"the row slice {prompt_file.slice_text} selects none of the file's {total} "
                f"{unit}s",
                f"write a slice within its rows (@[0:{total}] is every one, @[-{min(total, 100)}"
                ":] the last ones), or remove the slice",
                value=path_text,
            )
        )
    elif not rows:
        fix_empty = f"write one JSON object per {unit} into it, or point {key} at another file"
        issues.append(Issue(key, "the file holds no prompts", fix_empty, value=path_text))
    return issues


Problem = tuple[str, str, tuple[str, tuple[str, ...]] | None]
"""What is wrong with a row, the fix, and (the key, the row's keys) when it lacks a key."""


def _row_problem(number: int, raw: RawRow, rules: RowRules, unit: str) -> Problem | None:
    """(what is wrong, the fix, the key it lacks) for one jsonl line or parquet row, or None."""
    try:
        row = read_row(number, raw, rules.fmt, rules.markers, unit)
    except LineError as exc:
        what = f"the {unit} {exc.message}" if exc.key == "line" else f"'{exc.key}' {exc.message}"
        lacks = None if exc.missing_from is None else (exc.key, exc.missing_from)
        return what, exc.fix, lacks
    problem = _content_problem(row, rules, unit)
    return None if problem is None else (*problem, None)


def _content_problem(row: Row, rules: RowRules, unit: str = "line") -> tuple[str, str] | None:
    """(what is wrong, the fix) for a row read whole (`unit`: a jsonl line, a parquet row):
    its label and rm_type."""
    fmt, reward_type, scorer = rules.fmt, rules.reward_type, rules.scorer
    label_key = fmt.label_key if rules.labelled else None
    if label_key is not None and row.label is not None and not row.label.strip():
        return (
            f"has an empty '{label_key}' (the label key): only an empty answer would match it "
            "(the math grader pays an empty \\boxed{} against it)",
            "store the reference answer under that key",
        )
    rm_type = row.metadata.get("rm_type") if rules.rm_type_grades else None
    if isinstance(rm_type, str) and rm_type in UNREGISTERED_REWARD_TYPES:
        why, fix = UNREGISTERED_REWARD_TYPES[rm_type]
        return f"metadata rm_type {rm_type!r} is not available: {why}", fix
    if rm_type is not None and rm_type not in REWARD_TYPES:
        return (
            f"metadata rm_type {rm_type!r} is not a reward type",
            f"use one of {', '.join(sorted(REWARD_TYPES))}",
        )
    if rm_type is not None and scorer is not None:
        return (
            f"metadata rm_type {rm_type!r} names a reward type, and {scorer} scores every "
            "sample without reading it",
            f"remove rm_type from the {unit}s, or grade with a rule-based reward.type",
        )
    if rm_type == "remote" and not rules.forced and not rules.has_server:
        return (
            "metadata rm_type 'remote' posts the sample to a reward server, and "
            "recipe.rollout.reward.remote_url is not set: its every sample would fail",
            f"set recipe.rollout.reward.type: remote and its remote_url (the {unit}s' own "
            f"rm_type still grade theirs), or give the {unit} a rule-based rm_type",
        )
    if rm_type in LABELLED_REWARD_TYPES and not rules.forced and fmt.label_key is None:
        setting = rules.label_setting  # a set's own names no key only as false
        state = "unset" if setting == "recipe.data.label_key" else "false"
        return (
            f"metadata rm_type {rm_type!r} grades the response against the {unit}'s label, and "
            f"{setting} is {state}, so no {unit}'s label is read: the {unit}'s every sample "
            "would fail when graded",
            f"set {setting} to the key that holds the {unit}s' answers, or remove rm_type from "
            f"the {unit} (reward type {reward_type} grades it then)",
        )
    graded = reward_type if rules.forced else rm_type or reward_type
    if label_key is not None and graded == "gpqa":
        from rlpost.rewards.answers import choice_label  # the grader's own reading

        try:
            choice_label(row.label, row.metadata)
        except ValueError as exc:
            return f"'{label_key}' (the label key): {exc}", "fix the label, or the reward type"
    return None


def check_data(cfg: RunConfig, plan: Plan) -> list[Issue]:
    data, recipe = cfg.recipe.data, cfg.recipe
    scorer = _whole_batch_scorer(recipe.rollout.reward)
    reward = recipe.rollout.reward
    custom = reward.custom_function is not None and not reward.group  # (a group's: scorer)
    has_server = recipe.rollout.reward.remote_url is not None
    markers = (
        template_markers(Path(cfg.model.hf_checkpoint).expanduser())
        if data.apply_chat_template
        else ()
    )
    issues = []
    # a source reads its own way; an evaluation reads no training prompt
    if data.source is None and data.prompt_data is not None and cfg.mode != "eval":
        fmt = prompt_format(data)
        rules = RowRules(
            fmt,
            recipe.rollout.reward.needs_label,
            recipe.rollout.reward.type,
            scorer,
            rm_type_grades=not custom,
            has_server=has_server,
            markers=markers,
            key_settings=_key_settings(fmt, "recipe.data", "recipe.data"),
        )
        issues += check_prompt_file("recipe.data.prompt_data", data.prompt_data, rules)
    for i, dataset in enumerate(recipe.eval.datasets):
        # the set's own custom function (or the evaluation's) scores it before any type
        function = recipe.eval.reward_function(i) is not None
        labelled = recipe.eval_label_grader(i) is not None
        own = f"recipe.eval.datasets.{i}"
        fmt = prompt_format(data, dataset.input_key, dataset.label_key, dataset.tool_key)
        rules = RowRules(
            fmt,
            labelled,
            dataset.reward_type or recipe.rollout.reward.type,
            None if function else scorer,
            forced=dataset.reward_type is not None,
            rm_type_grades=not function and (dataset.reward_type is not None or not custom),
            has_server=has_server,
            markers=markers,
            key_settings=_key_settings(
                fmt,
                own if dataset.input_key else "recipe.data",
                own if dataset.label_key is not None else "recipe.data",
            ),
            unlabelled_key=None if labelled else f"{own}.label_key",
            label_setting=f"{own}.label_key"
            if dataset.label_key is False
            else "recipe.data.label_key",
        )
        issues += check_prompt_file(f"recipe.eval.datasets.{i}.path", dataset.path, rules)
    return issues


def _key_settings(
    fmt: PromptFormat, input_from: str, label_from: str
) -> tuple[tuple[str, str], ...]:
    """Which setting names the prompt's key and the label's (a dataset's own, or the data
    section's)."""
    settings = [(fmt.input_key, f"{input_from}.input_key")]
    if fmt.label_key is not None:
        settings.append((fmt.label_key, f"{label_from}.label_key"))
    return tuple(settings)


def _whole_batch_scorer(reward: RewardConfig) -> str | None:
    """What scores every sample without reading its metadata's rm_type, if anything does."""
    if reward.type == "model":
        return "the reward model (reward.type=model)"
    return "the group function (reward.group)" if reward.group else None
