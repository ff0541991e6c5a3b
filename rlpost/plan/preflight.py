"""What a training launch checks on this machine before it starts anything.

The plan says whether a run can work on its hardware; the preflight says whether it can start
here: the checkpoint folders and data files it names exist and read (every jsonl line has its
keys; an HF folder given as model.load or model.ref_load is of the model's architecture), the
credentials and packages it will need are present, this node has the GPUs its hardware profile
describes (as many, with as much memory: `nvidia-smi`), the run directory can be written, and
the run fits in memory (plan.memory_check). `launch.py mode=train` and `rlpost validate` run
it; `mode=plan` does not, so a config meant for a cluster plans anywhere.

Standard library only, and quick: data files are parsed as JSON, never tokenized (prompt
length against data.max_prompt_len is judged when the tokenizer loads, still before anything
starts). What can only be judged while the run is under way (a reward server that answers,
a hook that raises on some sample) is handled by the run itself.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.metadata
import importlib.util
import math
import os
import re
import shutil
import socket
import subprocess
import tempfile
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from rlpost.config.chat_templates import (
    TOKENIZER_ARGUMENTS,
    added_token_ids,
    added_tokens,
    chat_templates,
    template_markers,
    template_variables,
)
from rlpost.config.hf_check import check_weights_config
from rlpost.data.files import RawRow, UnreadableFile, prompt_rows, row_count
from rlpost.data.prompts import LineError, PromptFormat, Row, prompt_format, read_row
from rlpost.errors import Issue, Location, UserError
from rlpost.plan.cluster import address_key, check_cluster_source, ray_address
from rlpost.plan.fit import memory_issues, timeout_issues
from rlpost.plan.plan import Plan
from rlpost.schema import ModelConfig, RunConfig
from rlpost.schema.prompt_file import split_prompt_path
from rlpost.schema.reward import (
    GRADER_FLOOR,
    GRADER_MARKERS,
    LABELLED_REWARD_TYPES,
    UNREGISTERED_REWARD_TYPES,
    RewardConfig,
    RewardType,
)
from rlpost.schema.run import EVAL_RESUME_FIX
from rlpost.switches import bad_switches

MAX_BAD_LINES = 5
HEAD_CONNECT_TIMEOUT_S = 3.0
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "model*.bin")
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")
HUB_NOTE = (
    "rlpost reads local folders only and never downloads (a hub id such as Qwen/Qwen3-4B is "
    "not fetched)"
)


def preflight(cfg: RunConfig, plan: Plan, *, machine: bool = True) -> list[Issue]:
    """Problems that would stop this training launch, and the memory verdict's warnings.

    Raises UserError listing every problem; returns the memory issues to warn about when
    plan.memory_check is `warn`. `machine=False` skips what depends on this machine (files,
    packages, GPUs, credentials): for a config meant to run elsewhere.
    """
    memory = memory_issues(cfg, plan)
    refused = list(memory) if cfg.plan.memory_check == "refuse" else []
    refused += timeout_issues(cfg, plan)
    if machine:
        for rule in MACHINE_CHECKS:
            refused.extend(rule(cfg, plan))
    if refused:
        title = "memory problem" if all(i in memory for i in refused) else "launch problem"
        raise UserError(refused, title=title)
    return memory


# ---- checkpoints --------------------------------------------------------------------------


def _folder_issue(key: str, value: str, problem: str, fix: str) -> Issue:
    return Issue(key, problem, fix, value=value)


def check_hf_folder(key: str, value: str, *, needs_weights: bool = True) -> list[Issue]:
    """A local Hugging Face model folder: config.json, tokenizer files and weights."""
    path = Path(value).expanduser()
    fix = (
        "point it at a local HF checkpoint folder (config.json, *.safetensors, tokenizer "
        "files), e.g. one made with `hf download <repo> --local-dir <folder>`"
    )
    if not path.exists():
        return [_folder_issue(key, value, f"no such folder on this machine; {HUB_NOTE}", fix)]
    if not path.is_dir():
        return [_folder_issue(key, value, "is a file, not a checkpoint folder", fix)]
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        missing.append(f"tokenizer files ({', '.join(TOKENIZER_FILES[:2])})")
    if needs_weights and not any(any(path.glob(p)) for p in WEIGHT_PATTERNS):
        missing.append("weights (*.safetensors)")
    if missing:
        return [_folder_issue(key, value, f"the folder has no {' and no '.join(missing)}", fix)]
    return []


def _weights_issues(key: str, value: str, backend: str, model: ModelConfig) -> list[Issue]:
    """A policy or reference checkpoint the trainer will read: an HF folder of the model's
    architecture, or (megatron only) a torch_dist checkpoint."""
    path = Path(value).expanduser()
    readable = (
        "an HF folder or a torch_dist checkpoint"
        if backend == "megatron"
        else ("an HF folder (the torch trainer reads no torch_dist checkpoint)")
    )
    if not path.exists():
        return [
            _folder_issue(
                key,
                value,
                f"no such checkpoint on this machine; {HUB_NOTE}",
                f"point it at {readable} on this machine (e.g. ${{model.hf_checkpoint}}), "
                "or remove it",
            )
        ]
    if (path / "metadata.json").is_file():
        if backend == "megatron":
            return []
        return [
            _folder_issue(
                key,
                value,
                "is a torch_dist checkpoint, which the torch trainer cannot read",
                "point it at an HF folder (tools/convert_megatron_to_hf.py writes one), or "
                "train with the megatron backend",
            )
        ]
    return check_hf_folder(key, value) or check_weights_config(key, value, model)


def check_checkpoints(cfg: RunConfig, plan: Plan) -> list[Issue]:
    model = cfg.model
    issues = check_hf_folder("model.hf_checkpoint", model.hf_checkpoint)
    # the reference only matters when the recipe reads it
    ref = model.ref_load
    if ref is not None and ref != model.hf_checkpoint and cfg.recipe.algo.reference_interval > 0:
        issues += _weights_issues("model.ref_load", ref, plan.trainer_backend, model)
    if model.load is not None and model.load != model.hf_checkpoint:
        issues += _weights_issues("model.load", model.load, plan.trainer_backend, model)
    if (
        cfg.recipe.data.apply_chat_template
        and not issues
        and not chat_templates(Path(model.hf_checkpoint).expanduser())
    ):
        issues.append(
            Issue(
                "recipe.data.apply_chat_template",
                f"the tokenizer in {model.hf_checkpoint} has no chat template "
                f"(tokenizer_config.json's chat_template, or {CHAT_TEMPLATE_FILES[0]})",
                "use a checkpoint whose tokenizer has a chat template (an instruct or chat "
                "model), or set recipe.data.apply_chat_template: false",
                value=True,
            )
        )
    elif cfg.recipe.data.apply_chat_template and not issues:
        issues += check_template_kwargs(cfg.recipe.data.apply_chat_template_kwargs, model)
    if not issues:
        issues += check_tokens_in_embedding(cfg.model)
        issues += check_thinking_reward(cfg)
        issues += check_markers_survive_sampling(cfg)
    return issues


def check_tokens_in_embedding(model: ModelConfig) -> list[Issue]:
    """A token id at or past model.vocab_size (config.json's, which the YAML is checked
    against) has no row in the embedding or the output layer: the first prompt or response
    holding it indexes past them. Tokens added to a tokenizer without resizing the model's
    embeddings are the usual source."""
    folder = Path(model.hf_checkpoint).expanduser()
    outside = {i: t for i, t in added_token_ids(folder).items() if i >= model.vocab_size}
    if not outside:
        return []
    shown = ", ".join(f"{t!r} = {i}" for i, t in sorted(outside.items())[:4])
    more = f" and {len(outside) - 4} more" if len(outside) > 4 else ""
    return [
        Issue(
            "model.hf_checkpoint",
            f"the tokenizer in {model.hf_checkpoint} has {len(outside)} token(s) with ids at "
            f"or past the model's vocabulary of model.vocab_size={model.vocab_size} "
            f"(config.json's vocab_size): {shown}{more}; the embedding and output layer have "
            "no row for them, so the first prompt or response holding one fails (an index "
            "error; on GPUs a device-side assert) after the engines and trainers have started",
            "resize the checkpoint's embeddings to the tokenizer and save it (transformers: "
            "model.resize_token_embeddings(len(tokenizer)), then model.save_pretrained), or "
            "use the tokenizer the checkpoint was trained with",
            value=model.hf_checkpoint,
        )
    ]


THINK_END = "</think>"


def check_thinking_reward(cfg: RunConfig) -> list[Issue]:
    """deepscaler grades only the text after `</think>` and pays 0 without one: a model
    whose tokenizer and chat templates never name `</think>` (no such token, no thinking
    block) never writes one, and every sample it is graded on would score 0."""
    keys = [f"recipe.{key}" for key, kind in cfg.recipe.rule_graders() if kind == "deepscaler"]
    if not keys:
        return []
    folder = Path(cfg.model.hf_checkpoint).expanduser()
    try:
        vocabulary = (folder / "tokenizer.json").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []  # a tokenizer of another format: cannot tell
    texts = [vocabulary, *chat_templates(folder).values()]
    if any(THINK_END in text for text in texts):
        return []
    return [
        Issue(
            key,
            f"deepscaler grades only the text after {THINK_END} and scores 0 without one, and "
            f"{cfg.model.hf_checkpoint} has no {THINK_END} (neither a token of its tokenizer "
            "nor in its chat templates): the model never opens a thinking block, so every "
            "sample it grades would score 0",
            "grade with math (the same answer check on the whole response), or use a "
            "thinking model",
            value="deepscaler",
        )
        for key in keys
    ]


def check_markers_survive_sampling(cfg: RunConfig) -> list[Issue]:
    """A grader's marker that is one of the tokenizer's added tokens (`</think>`) never
    reaches it when a stop token id ends generation at it, or when skip_special_tokens drops
    it from the text for being special (verl#1724, trl#2897: the reward then never pays).
    Stop strings are the schema's concern (RecipeConfig.check_stops_leave_the_answer)."""
    rollout = cfg.recipe.rollout
    graders = cfg.recipe.rule_graders()
    if not graders or not (rollout.stop_token_ids or rollout.skip_special_tokens):
        return []
    tokens = added_tokens(Path(cfg.model.hf_checkpoint).expanduser())
    for key, kind in graders:
        for marker in GRADER_MARKERS.get(kind, ()):
            for token_id in rollout.stop_token_ids:
                text = tokens.get(token_id, ("", False))[0]
                if text and (text in marker or marker in text):
                    return [
                        Issue(
                            "recipe.rollout.stop_token_ids",
                            f"recipe.{key}={kind} grades the answer a response writes after "
                            f"'{marker}', and stop_token_ids holds {token_id} ('{text}' in "
                            f"{cfg.model.hf_checkpoint}'s tokenizer): generation ends at it, "
                            f"before any answer, so every response it grades scores "
                            f"{GRADER_FLOOR[kind]:g} and no group has a signal",
                            f"remove {token_id} from recipe.rollout.stop_token_ids (the "
                            "end-of-turn token ends a response)",
                            value=rollout.stop_token_ids,
                        )
                    ]
            special = [i for i, (text, flag) in tokens.items() if flag and text == marker]
            if rollout.skip_special_tokens and special:
                return [
                    Issue(
                        "recipe.rollout.skip_special_tokens",
                        f"recipe.{key}={kind} looks for '{marker}' in each response, which "
                        f"{cfg.model.hf_checkpoint}'s tokenizer marks special (token "
                        f"{special[0]}), and skip_special_tokens: true leaves special tokens "
                        "out of the text the grader reads: every response it grades scores "
                        f"{GRADER_FLOOR[kind]:g} and no group has a signal",
                        "set recipe.rollout.skip_special_tokens: false (the default; the "
                        "graders read a response without its end-of-turn token anyway)",
                        value=True,
                    )
                ]
    return []


def check_template_kwargs(kwargs: dict[str, object], model: ModelConfig) -> list[Issue]:
    """Every apply_chat_template_kwargs key is read by the chat template it goes to: Jinja
    drops a variable a template never reads without a word (a misspelt enable_thinking
    leaves thinking on)."""
    passed = sorted(set(kwargs) - TOKENIZER_ARGUMENTS)
    if not passed:
        return []
    folder = Path(model.hf_checkpoint).expanduser()
    templates = chat_templates(folder)
    chosen = kwargs.get("chat_template")
    source: str | None
    if isinstance(chosen, str):
        source = templates.get(chosen, chosen)  # a named template, or the template itself
        which = (
            f"the chat template {chosen!r}" if chosen in templates else "the chat template given"
        )
    else:
        source = templates.get("default")
        which = f"the chat template of {model.hf_checkpoint}"
    reads = template_variables(source) if source else None
    if reads is None:
        return []
    issues = []
    for key in passed:
        if key in reads:
            continue
        near = difflib.get_close_matches(key, sorted(reads), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        issues.append(
            Issue(
                f"recipe.data.apply_chat_template_kwargs.{key}",
                f"{which} never reads {key!r}{hint}, so the tokenizer drops it without a word "
                f"(it reads {', '.join(sorted(reads))})",
                "spell it as the template does, or remove it",
                value=kwargs[key],
            )
        )
    return issues


# ---- data files ---------------------------------------------------------------------------

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


# ---- this machine -------------------------------------------------------------------------


def check_environment(cfg: RunConfig, plan: Plan) -> list[Issue]:
    issues = []
    if plan.runtime.engine_backend == "sglang" and importlib.util.find_spec("sglang") is None:
        issues.append(
            Issue(
                "engine.backend",
                "SGLang serves this run and is not installed in this environment",
                "install the GPU extra (pip install -c constraints.txt -e '.[gpu]') on the "
                "GPU machine, or use engine.backend=cpu",
                value=cfg.engine.backend,
            )
        )
    joins_cluster = ray_address(cfg) is not None
    if cfg.hardware.kind == "gpu" and not joins_cluster:
        found = _local_gpus()
        needed = cfg.hardware.gpus_per_node
        if found < needed:
            issues.append(
                Issue(
                    "hardware",
                    f"hardware {cfg.hardware.name} needs {needed} GPUs on this node and this "
                    f"machine has {found}",
                    "run on a machine with those GPUs (or join a Ray cluster that has them: "
                    "run.ray_address), or pick a hardware profile that matches this one "
                    "(`rlpost new hardware NAME` writes one from it; hardware=cpu on a machine "
                    "without GPUs)",
                    value=cfg.hardware.name,
                )
            )
        else:
            issues += visible_gpu_issues(cfg, os.environ.get(VISIBLE_DEVICES))
            gpus, driver = nvidia_smi()
            issues += local_gpu_issues(cfg, gpus)
            issues += torch_build_issues(cfg, installed_torch_version(), driver)
            issues += shared_memory_issues(cfg, shared_memory_bytes(), os.environ)
            if plan.starts_train_ranks:  # the host need is the trainers' (offload, reference)
                issues += host_memory_issues(cfg, plan, host_memory_gib())
    elif cfg.hardware.kind == "cpu" and not joins_cluster and plan.starts_train_ranks:
        issues += cpu_memory_issues(cfg, plan, host_memory_gib())
    wandb = cfg.tracking.wandb
    if wandb.enabled and wandb.mode == "online" and not _has_wandb_key():
        issues.append(
            Issue(
                "tracking.wandb.mode",
                "online wandb logging needs an API key, and neither WANDB_API_KEY nor a "
                "wandb login (~/.netrc) is present",
                "run `wandb login` or export WANDB_API_KEY, or set tracking.wandb.mode=offline",
                value="online",
            )
        )
    return issues


def check_switches(cfg: RunConfig, plan: Plan) -> list[Issue]:
    """rlpost's environment switches (rlpost.switches) set to a value they do not take."""
    return [
        Issue(switch.name, f"the environment switch {switch.problem()}", switch.meaning
              + f"; unset it or set {' or '.join(switch.choices)}", value=value,
              location=Location(file="the environment"))
        for switch, value in bad_switches()
    ]  # fmt: skip


GPU_MEMORY_TOLERANCE = 0.02
"""A GPU this much under the profile's gpu_memory_gib still is the profile's card: profiles give
the usable memory, a little under what the driver reports (H200: 139.8 GiB of 140.4)."""
GPU_FIELDS = ("name", "memory.total", "compute_cap")
BF16_COMPUTE_CAPABILITY = (8, 0)
"""The first GPUs with bf16 arithmetic (Ampere): a V100 (7.0) or T4 (7.5) has none."""


@dataclass(frozen=True)
class LocalGpu:
    name: str
    memory_gib: float
    compute_capability: tuple[int, int] | None  # None: a driver too old to report it


def nvidia_smi() -> tuple[list[LocalGpu], str | None]:
    """This machine's GPUs and the NVIDIA driver's version (580.159.04), from one call of
    `nvidia-smi` (what the driver reports, before any CUDA context); a driver without the
    compute_cap field is asked again without it; nothing where nvidia-smi is missing or
    fails."""
    command = shutil.which("nvidia-smi")
    if command is None:
        return [], None
    for fields in (GPU_FIELDS, GPU_FIELDS[:2]):
        # the driver's version first: it holds no comma, a GPU's name may
        query = [f"--query-gpu=driver_version,{','.join(fields)}", "--format=csv,noheader,nounits"]
        try:
            done = subprocess.run(
                [command, *query], capture_output=True, text=True, timeout=10, check=True
            )
        except (OSError, subprocess.SubprocessError):
            continue
        drivers, rest = [], []
        for line in done.stdout.splitlines():
            driver, _, gpu = line.partition(",")
            drivers.append(driver.strip())
            rest.append(gpu)
        gpus = parse_gpus("\n".join(rest), with_compute_capability=len(fields) == 3)
        return gpus, next((d for d in drivers if d), None)
    return [], None


def local_gpus() -> list[LocalGpu]:
    """This machine's GPUs (`nvidia_smi`); empty where nvidia-smi is missing or fails."""
    return nvidia_smi()[0]


def parse_gpus(text: str, *, with_compute_capability: bool = True) -> list[LocalGpu]:
    """`nvidia-smi --query-gpu=name,memory.total[,compute_cap] --format=csv,noheader,nounits`
    lines ("NVIDIA H200, 143771, 9.0": MiB, major.minor) -> LocalGpu; a GPU's name may hold
    commas, so the figures are read from the right; lines it cannot read are left out."""
    gpus = []
    for line in text.splitlines():
        figures = 2 if with_compute_capability else 1
        name, *rest = (part.strip() for part in line.rsplit(",", figures))
        try:
            gib = float(rest[0]) / 1024
            capability = None
            if with_compute_capability:
                major, _, minor = rest[1].partition(".")
                capability = (int(major), int(minor or 0))
        except (ValueError, IndexError):
            continue
        if name:
            gpus.append(LocalGpu(name, gib, capability))
    return gpus


def local_gpu_issues(cfg: RunConfig, gpus: list[LocalGpu]) -> list[Issue]:
    """This node's GPUs against the hardware profile and the model's dtype (`gpus`: from
    `local_gpus`; nothing to judge when empty)."""
    return gpu_memory_issues(cfg, gpus) + bf16_issues(cfg, gpus)


def gpu_memory_issues(cfg: RunConfig, gpus: list[LocalGpu]) -> list[Issue]:
    """A profile that promises more memory per GPU than this machine's smallest GPU has: every
    memory verdict of the plan, its micro-batches and SGLang's memory fraction assume the
    profile's card, so the run would fit on paper and run out of memory on this one."""
    if not gpus:
        return []
    smallest = min(gpus, key=lambda gpu: gpu.memory_gib)
    wanted, gib = cfg.hardware.gpu_memory_gib, smallest.memory_gib
    if gib >= wanted * (1 - GPU_MEMORY_TOLERANCE):
        return []
    usable = math.floor(gib * 10) / 10
    card = cfg.hardware.gpu_name or "its GPU"
    return [
        Issue(
            "hardware.gpu_memory_gib",
            f"hardware {cfg.hardware.name} plans each GPU as {card} with {wanted:g} GiB, and "
            f"this machine's {smallest.name} has {gib:.1f} GiB: the plan's memory verdicts, "
            "micro-batches and SGLang's memory fraction were judged for the larger card",
            f"plan for this machine's GPUs: hardware.gpu_memory_gib={usable:g} (with its "
            "peak_bf16_tflops and memory_bandwidth_gbps for the time estimates), or a profile "
            "of its own (`rlpost new hardware NAME` writes one from this machine)",
            value=wanted,
        )
    ]


def bf16_issues(cfg: RunConfig, gpus: list[LocalGpu]) -> list[Issue]:
    """model.params_dtype=bf16 on GPUs without bf16 arithmetic (before Ampere): the trainers'
    kernels and SGLang's fail on them, or crawl in emulation."""
    older = [
        gpu
        for gpu in gpus
        if gpu.compute_capability is not None and gpu.compute_capability < BF16_COMPUTE_CAPABILITY
    ]
    if cfg.model.params_dtype != "bf16" or not older:
        return []
    major, minor = older[0].compute_capability or (0, 0)
    return [
        Issue(
            "model.params_dtype",
            f"this machine's {older[0].name} (compute capability {major}.{minor}) has no bf16 "
            "arithmetic; bf16 needs compute capability 8.0 or later (A100, H100 and newer)",
            "set model.params_dtype: fp16 with trainer.backend=megatron (its optimizer scales "
            "the loss) or model.params_dtype: fp32, or run on GPUs with bf16",
            value="bf16",
        )
    ]


CUDA_MIN_DRIVER = {11: 450, 12: 525, 13: 580}
"""The oldest driver (major version) that runs each CUDA major version's builds (NVIDIA's minor
version compatibility table): a torch built for CUDA 13 needs a driver of 580 or later."""
TORCH_BUILD = re.compile(r"\+(cpu|cu(\d+)\d)$")  # 2.11.0+cu130: CUDA 13; 2.13.0+cpu


def installed_torch_version() -> str | None:
    """The installed torch's version, from its metadata (torch itself is not imported)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_build_issues(
    cfg: RunConfig, torch_version: str | None, driver: str | None
) -> list[Issue]:
    """The torch this run would train with, against the GPUs it is given: a CPU build (the CPU
    install on a GPU machine) sees no GPU at all, and a CUDA build newer than the driver fails
    at its first CUDA call, in a rank, after Ray and the engines have started."""
    build = TORCH_BUILD.search(torch_version or "")
    if build is None:  # no local version tag: the build cannot be told without importing it
        return []
    gpu_extra = "pip install torch from a CUDA index (https://download.pytorch.org/whl/cu1XX)"
    if build.group(1) == "cpu":
        return [
            Issue(
                "hardware",
                f"hardware {cfg.hardware.name} trains on GPUs, and this environment's torch "
                f"{torch_version} is the CPU build: no rank would see a GPU",
                f"{gpu_extra} matching this machine's driver, or hardware=cpu",
                value=cfg.hardware.name,
            )
        ]
    cuda = int(build.group(2))
    needed = CUDA_MIN_DRIVER.get(cuda)
    try:
        major = int((driver or "").split(".")[0])
    except ValueError:
        return []
    if needed is None or major >= needed:
        return []
    return [
        Issue(
            "hardware",
            f"this environment's torch {torch_version} is built for CUDA {cuda}, which needs an "
            f"NVIDIA driver of {needed} or later, and this machine's is {driver}: the first "
            "CUDA call of a rank would fail",
            f"{gpu_extra} for a CUDA version this driver runs, or update the driver",
            value=cfg.hardware.name,
        )
    ]


MEMINFO = Path("/proc/meminfo")


def host_memory_gib() -> float | None:
    """This machine's memory (MemTotal), None where /proc/meminfo does not say."""
    try:
        for line in MEMINFO.read_text(encoding="utf-8").splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024**2  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def host_memory_issues(cfg: RunConfig, plan: Plan, total_gib: float | None) -> list[Issue]:
    """A node whose memory is less than the plan's host need (offloaded optimizer state and
    reference weights, the processes): the plan judged it against the profile's
    host_memory_gib, and the run would be killed by the kernel's OOM killer mid-step."""
    host = plan.memory.host
    if total_gib is None or host.total_gib <= total_gib:
        return []
    return [
        Issue(
            "hardware.host_memory_gib",
            f"the run needs {host.total_gib:,.1f} GiB of host memory on a node (offloaded "
            f"state {host.optimizer_gib:,.1f}, reference weights "
            f"{host.reference_weights_gib:,.1f}, processes {host.processes_gib:,.1f}), and "
            f"this machine has {total_gib:,.1f} GiB; the plan judged it against the "
            f"profile's {cfg.hardware.host_memory_gib:g}",
            f"plan for this machine: hardware.host_memory_gib={math.floor(total_gib):d} (the "
            "plan then offers what fits), or run on nodes with more memory",
            value=cfg.hardware.host_memory_gib,
        )
    ]


def cpu_memory_issues(cfg: RunConfig, plan: Plan, total_gib: float | None) -> list[Issue]:
    """A CPU profile's device slots are processes in this machine's memory: the train ranks
    of a node at the plan's training peak, with the host's offloaded state and reference
    weights, must fit in it, or the kernel's OOM killer ends the run mid-step. (The profile's
    nominal figure for the processes themselves is left out: a floor, not a forecast.)"""
    if total_gib is None:
        return []
    memory, host = plan.memory, plan.memory.host
    per_rank = max(memory.train.total_gib, memory.weight_sync_gib)
    ranks = min(plan.placement.train_gpus, cfg.hardware.gpus_per_node)
    held = host.optimizer_gib + host.reference_weights_gib
    need = ranks * per_rank + held
    if need <= total_gib:
        return []
    return [
        Issue(
            "hardware",
            f"the plan's training takes {per_rank:,.1f} GiB in each of {ranks} train rank(s) "
            f"on a node, {need:,.1f} GiB with {held:,.1f} GiB of offloaded state and "
            f"reference weights, and this machine has {total_gib:,.1f} GiB: the OOM killer "
            "would end the run mid-step",
            "lower recipe.train.max_tokens_per_gpu (the activations), train fewer ranks "
            "(layout.train.num_gpus), or use a smaller model",
            value=cfg.hardware.name,
        )
    ]


SHM = Path("/dev/shm")
SHM_MIN_BYTES = 1 << 30
"""/dev/shm a node with several GPUs needs at least: NCCL's intra-node transport makes its
segments there (several MB each, per peer and channel), and a container's default of 64 MB
fails the first collective ("Error while creating shared memory segment")."""


def shared_memory_bytes() -> int | None:
    """The size of /dev/shm on this machine, None where there is none."""
    try:
        stats = os.statvfs(SHM)
    except OSError:
        return None
    return stats.f_blocks * stats.f_frsize


def shared_memory_issues(
    cfg: RunConfig, size: int | None, environ: typing.Mapping[str, str]
) -> list[Issue]:
    """A node of several GPUs whose /dev/shm is too small for NCCL (a container's default),
    unless NCCL's shared-memory transport is off (NCCL_SHM_DISABLE=1)."""
    if cfg.hardware.gpus_per_node < 2 or size is None or size >= SHM_MIN_BYTES:
        return []
    if environ.get("NCCL_SHM_DISABLE") == "1":
        return []
    return [
        Issue(
            "hardware",
            f"/dev/shm on this node holds {size / 2**20:,.0f} MiB, and NCCL between its "
            f"{cfg.hardware.gpus_per_node} GPUs makes its shared-memory segments there: the "
            "first collective of the train ranks or a multi-GPU engine would fail",
            "give it at least 1 GiB (docker run --shm-size=16g; on Kubernetes an emptyDir "
            "with medium: Memory mounted at /dev/shm), or NCCL_SHM_DISABLE=1 (slower "
            "transfers within the node)",
            value=cfg.hardware.name,
            location=Location(file="this machine"),
        )
    ]


VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


def visible_gpu_issues(cfg: RunConfig, visible: str | None) -> list[Issue]:
    """CUDA_VISIBLE_DEVICES (`visible`) hiding GPUs the profile counts on: Ray and CUDA see only
    the listed ones, so the placement would wait for GPUs that never come."""
    if visible is None:
        return []
    listed = [d for d in (part.strip() for part in visible.split(",")) if d]
    # CUDA stops at the first invalid entry, such as -1
    count = next((i for i, d in enumerate(listed) if d.startswith("-")), len(listed))
    named = [d for d in listed[:count] if not d.isdigit()]
    if named:
        return [
            Issue(
                VISIBLE_DEVICES,
                f"it names GPUs by UUID or MIG id ({named[0]}), and the run places its "
                "engines and train ranks by GPU index (Ray hands out these names as the ids)",
                "list the GPUs by index (`nvidia-smi -L` shows which index is which UUID), "
                f"or unset {VISIBLE_DEVICES}",
                value=visible,
                location=Location(file="the environment"),
            )
        ]
    needed = cfg.hardware.gpus_per_node
    if count >= needed:
        return []
    return [
        Issue(
            VISIBLE_DEVICES,
            f"it shows {count} GPU(s) to this launch, and hardware {cfg.hardware.name} "
            f"places the run on {needed} per node",
            f"unset {VISIBLE_DEVICES}, or list {needed} GPUs in it, or pick a hardware profile "
            f"of {count} GPU(s) (hardware.gpus_per_node={count}, or `rlpost new hardware NAME`)",
            value=visible,
            location=Location(file="the environment"),
        )
    ]


def _local_gpus() -> int:
    try:
        return sum(1 for _ in NVIDIA_GPUS.iterdir())
    except OSError:
        return 0


def _has_wandb_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return "api.wandb.ai" in netrc.read_text(encoding="utf-8")
    except OSError:
        return False


# ---- the run directory --------------------------------------------------------------------


def check_run_dir(cfg: RunConfig, plan: Plan) -> list[Issue]:
    issues = []
    if cfg.run.dir is not None:
        target = Path(cfg.run.dir).expanduser().resolve()
        existing = next((p for p in (target, *target.parents) if p.exists()), None)
        foreign = foreign_run_dir(cfg.run.dir, target)
        training_run = _a_run_to_keep(cfg, target)
        if foreign:
            issues.append(foreign)
        elif training_run:
            issues.append(training_run)
        elif existing is None or not _writable_folder(existing):
            issues.append(
                Issue(
                    "run.dir",
                    f"cannot be created or written: {existing} is not a writable folder",
                    "choose a run.dir under a folder you can write to",
                    value=cfg.run.dir,
                )
            )
        elif existing is not None:
            free = shutil.disk_usage(existing).free
            # a run that resumes here: its checkpoints give way to new ones, its exports stay
            from rlpost.runtime.checkpoint import bytes_under

            held = bytes_under(target / "ckpt")
            exported = _folders_in(target / "hf")
            issues += checkpoint_disk_issues(cfg, plan, free + held, exported)
    return issues + check_resume_target(cfg.run.resume, cfg.mode)


def check_resume_target(resume: str | None, mode: str = "train") -> list[Issue]:
    """run.resume names a complete checkpoint, or a run directory holding one: the launch's
    own test (rlpost.runtime.resume), sizes checked but not each file's sha256."""
    if resume in (None, "auto"):
        return []
    if not Path(resume).expanduser().is_dir():
        issues = [
            Issue(
                "run.resume",
                "no such checkpoint or run directory on this machine",
                "point run.resume at <run.dir>/ckpt/rollout_<n> or at a run directory, or use "
                "run.resume=auto",
                value=resume,
            )
        ]
    else:
        from rlpost.runtime.resume import checkpoint_named

        try:
            checkpoint_named(resume, check_hashes=False, mode=mode)
            return []
        except UserError as exc:
            issues = exc.issues
    if mode == "eval":
        return [dataclasses.replace(i, fix=EVAL_RESUME_FIX) for i in issues]
    return issues


SHOWN_ENTRIES = 4


def _a_run_to_keep(cfg: RunConfig, target: Path) -> Issue | None:
    """mode=eval naming a run's directory: its metrics.jsonl would gain an evaluation that
    no rollout of the run made, beside the run's own at that rollout."""
    from rlpost.runtime.rundir import RUN_MARKERS

    if cfg.mode != "eval" or not any((target / marker).exists() for marker in RUN_MARKERS):
        return None
    return Issue(
        "run.dir",
        f"{target} is a run's directory, and mode=eval writes a run directory of its own",
        "leave run.dir unset (a new dated directory) or name a new one; to evaluate this "
        f"run's weights, run.resume={target}/ckpt/rollout_<n>",
        value=cfg.run.dir,
    )


def foreign_run_dir(value: str, target: Path) -> Issue | None:
    """run.dir naming a folder that holds files and is no run's: the launch would write its
    config.yaml, provenance.json and metrics.jsonl over any of the same name there."""
    from rlpost.runtime.rundir import RUN_MARKERS, foreign_entries

    entries = foreign_entries(target)
    if not entries:
        return None
    shown = ", ".join(entries[:SHOWN_ENTRIES])
    more = len(entries) - SHOWN_ENTRIES
    shown += f" and {more} more" if more > 0 else ""
    return Issue(
        "run.dir",
        f"{target} holds {shown}; it is no run's directory (every launch of rlpost writes "
        f"{' and '.join(RUN_MARKERS[:-1])} in its run's, and checkpoints in "
        f"{RUN_MARKERS[-1]}/): this launch would write its config.yaml, provenance.json and "
        "metrics.jsonl over files of those names",
        "choose a new or empty folder, or the run's own folder (the one an earlier launch of "
        "it wrote, to continue it with run.resume=auto)",
        value=value,
    )


def saves_due(interval: int | None, total: int) -> int:
    """How many of `total` rollouts end with a save every `interval` (and the last always)."""
    if interval is None:
        return 0
    return total // interval + (total % interval != 0)


@dataclass(frozen=True)
class CheckpointDisk:
    """What a run's saves hold on the disk of run.dir at their peak, in bytes."""

    checkpoint: float  # one trainer checkpoint: weights (+ optimizer state)
    kept: int  # checkpoints on disk at once: keep_last, plus the new one before pruning
    hf_export: float  # one HF export of the policy
    hf_exports: int  # HF exports written (never pruned)
    on_sigterm_only: bool = False  # no save is due: the one counted is SIGTERM's

    @property
    def total(self) -> float:
        return self.checkpoint * self.kept + self.hf_export * self.hf_exports


def checkpoint_disk(cfg: RunConfig, plan: Plan) -> CheckpointDisk:
    """The bytes of the run's checkpoints and HF exports: per parameter, the trainer's weights
    (megatron: the compute dtype; the torch trainer: its float32 shards) and, with
    save_optimizer, two float32 Adam moments and, where the weights are not float32 already,
    float32 master weights; an HF export in the compute dtype. An evaluation (mode=eval)
    saves nothing: no checkpoint, no export, none when it is stopped."""
    if cfg.mode == "eval":
        return CheckpointDisk(0.0, 0, 0.0, 0)
    save, total = cfg.recipe.save, cfg.recipe.rollout.num_rollout
    params = plan.memory.params_total
    compute = 4 if cfg.model.params_dtype == "fp32" or cfg.hardware.kind == "cpu" else 2
    torch_trainer = plan.trainer_backend == "torch"
    weights = 4 if torch_trainer else compute
    optimizer = (8 + (4 if weights < 4 else 0)) if save.save_optimizer else 0
    saves = saves_due(save.interval, total)
    # run.on_sigterm: save writes a checkpoint when the run is stopped, saves due or not
    on_sigterm_only = saves == 0 and cfg.run.on_sigterm == "save"
    kept = 1 if on_sigterm_only else min(save.keep_last + 1, saves)
    exports = saves_due(save.save_hf_interval, total)
    return CheckpointDisk(
        params * (weights + optimizer), kept, params * compute, exports, on_sigterm_only
    )


def checkpoint_disk_issues(
    cfg: RunConfig, plan: Plan, free_bytes: float, exported: int = 0
) -> list[Issue]:
    """Saves that cannot all fit in the free space of run.dir's disk: the first to find it
    full would come hours in; the run goes on without it, and a last save that fails fails
    the run. `free_bytes` counts a resumed run's own checkpoints as free (new ones replace
    them); `exported`: its HF exports already written."""
    need = checkpoint_disk(cfg, plan)
    need = dataclasses.replace(need, hf_exports=max(0, need.hf_exports - exported))
    if need.total <= free_bytes:
        return []
    save, gib = cfg.recipe.save, 1024**3
    fixes = ["free space there or point run.dir at a larger disk"]
    if need.on_sigterm_only:
        what = "(run.on_sigterm: save; recipe.save.interval is null)"
        parts = [f"the checkpoint of {need.checkpoint / gib:,.1f} GiB a SIGTERM saves {what}"]
        fixes.append("run.on_sigterm: stop (a SIGTERM then loses what the run trained)")
    else:
        kept = f"keep_last {save.keep_last}, and the new one before the oldest goes"
        parts = [f"{need.kept} checkpoint(s) of {need.checkpoint / gib:,.1f} GiB at once ({kept})"]
        fixes.append("lower recipe.save.keep_last")
    if need.hf_exports:
        parts.append(f"{need.hf_exports} HF export(s) of {need.hf_export / gib:,.1f} GiB")
    if save.save_optimizer:
        fixes.append("recipe.save.save_optimizer: false (weights only: no exact resume)")
    if need.hf_exports:
        fixes.append("a larger recipe.save.save_hf_interval")
    return [
        Issue(
            "run.dir",
            f"the run's saves need {need.total / gib:,.1f} GiB ({'; '.join(parts)}), and its "
            f"disk has {free_bytes / gib:,.1f} GiB free",
            ", ".join(fixes[:-1]) + f" or {fixes[-1]}",
            value=cfg.run.dir,
        )
    ]


def _folders_in(folder: Path) -> int:
    try:
        return sum(1 for p in folder.iterdir() if p.is_dir())
    except OSError:
        return 0


def _writable_folder(folder: Path) -> bool:
    """Whether a file can be made in `folder` (tried: permission bits do not tell for root, or
    for special file systems)."""
    if not folder.is_dir():
        return False
    try:
        handle, name = tempfile.mkstemp(prefix=".rlpost-probe-", dir=folder)
    except OSError:
        return False
    os.close(handle)
    os.unlink(name)
    return True


MachineCheck = Callable[[RunConfig, Plan], Iterable[Issue]]


def check_cluster(cfg: RunConfig, plan: Plan) -> list[Issue]:
    """A multi-node profile has a cluster to join, a head given as host:port answers, and
    the cluster has the nodes the profile needs (read from its GCS in well under a second,
    before the launch joins it)."""
    issues = check_cluster_source(cfg)
    address = ray_address(cfg)
    if not address or "://" in address:
        return issues
    key, where = address_key(cfg)
    if address != "auto" and ":" in address:
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=HEAD_CONNECT_TIMEOUT_S).close()
        except (OSError, ValueError) as exc:
            issues.append(
                Issue(
                    key,
                    f"no Ray head answers at {address} ({exc})",
                    "start the cluster first (rlpost cluster up --hostfile FILE, or ray start "
                    "--head on the head node) or correct the address" + _or_start_here(cfg),
                    value=address,
                    location=where,
                )
            )
            return issues
    issues += _cluster_capacity(cfg, plan, address)
    return issues


def _or_start_here(cfg: RunConfig) -> str:
    """For an address from the environment on a one-node profile: the launch can start
    its own Ray (a RAY_ADDRESS left exported from a cluster's shell joins that cluster)."""
    if cfg.run.ray_address or cfg.hardware.num_nodes > 1:
        return ""
    return (
        f"; or unset RAY_ADDRESS: hardware={cfg.hardware.name} is one node, and without it "
        "the launch starts Ray on this machine"
    )


def _cluster_capacity(cfg: RunConfig, plan: Plan, address: str) -> list[Issue]:
    from rlpost.plan.cluster import NodeInfo, check_capacity
    from rlpost.runtime.gcs import gcs_address, read_gcs_nodes

    if address == "auto":
        try:
            gcs_address(address)
        except ConnectionError as exc:  # none runs here, or several: joining would fail
            key, where = address_key(cfg)
            ray_says = str(exc).strip().split(". ")[0].rstrip(".")
            return [
                Issue(
                    key,
                    "auto joins the Ray cluster this machine is a node of, and Ray finds no "
                    f"single one here ({ray_says})",
                    "bring the cluster up first (rlpost cluster up --hostfile FILE, or ray "
                    "start on this machine) and launch on one of its nodes, or give the "
                    "head's host:port" + _or_start_here(cfg),
                    value=address,
                    location=where,
                )
            ]
    try:
        found = read_gcs_nodes(address)
    except (ConnectionError, RuntimeError, ValueError):
        return []  # joining reports it, with Ray's own words
    nodes = [NodeInfo(n.address, int(n.gpus), int(n.cpus)) for n in found if n.alive]
    try:
        check_capacity(cfg.hardware, nodes, plan.placement.slots_in_use)
    except UserError as exc:
        return list(exc.issues)
    return []


MACHINE_CHECKS: tuple[MachineCheck, ...] = (
    check_checkpoints,
    check_data,
    check_environment,
    check_switches,
    check_cluster,
    check_run_dir,
)
