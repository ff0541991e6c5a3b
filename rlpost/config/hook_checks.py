"""Dotted-path hooks named by a recipe, imported and signature-checked at validation time.

A typo in a hook path would otherwise surface only after Ray, the trainers and the engines
are up; here it is an Issue at the recipe key, before anything starts.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from rlpost import hooks
from rlpost.errors import Issue
from rlpost.schema.training_only import training_only

# the methods each extension class must have (rlpost.data.source.RolloutDataSource,
# rlpost.rewards.model.RewardModel; kept here so validation imports neither)
SOURCE_METHODS = ("get_samples", "add_samples", "state_dict", "load_state_dict")
REWARD_MODEL_METHODS = ("__call__",)

ROLLOUT = "recipe.rollout"

# key under recipe.rollout -> the signature its hook must have
HOOK_SIGNATURES: dict[str, hooks.HookSignature] = {
    "dynamic_sampling_filter": hooks.DYNAMIC_SAMPLING_FILTER,
    "buffer_filter": hooks.BUFFER_FILTER,
    "generate_function": hooks.GENERATE_FUNCTION,
}


def check_hook(key: str, path: Any, signature: hooks.HookSignature) -> Issue | None:
    """Import the hook at `key` and check its signature; the problem as an Issue, if any."""
    if not isinstance(path, str):
        return None  # unset, or not a string: the schema reports that itself
    try:
        hooks.load_hook(path, signature)
    except hooks.HookError as exc:
        return exc.as_issue(key)
    return None


def check_class(
    key: str, path: Any, signature: hooks.HookSignature, methods: tuple[str, ...]
) -> Issue | None:
    """Import the class at `key` and check that it is built as `cls(ctx)` and has `methods`."""
    if not isinstance(path, str):
        return None
    try:
        cls = hooks.load_object(path, signature)
        missing = [m for m in methods if not _defines(cls, m)]
        if "__call__" in methods and not missing and not inspect.iscoroutinefunction(cls.__call__):
            missing = ["an async def __call__"]
        if not isinstance(cls, type) or missing:
            what = f"lacks {', '.join(missing)}" if missing else f"is a {type(cls).__name__}"
            raise hooks.HookError(
                hooks.HookErrorKind.WRONG_SIGNATURE,
                path,
                f"{signature.role} '{path}' {what}; expected a class with {', '.join(methods)}",
                f"point it at a class with {', '.join(methods)} (see the README's extension "
                "points)",
            )
        hooks.check_signature(cls, path, signature)
    except hooks.HookError as exc:
        return exc.as_issue(key)
    return None


def _defines(cls: Any, name: str) -> bool:
    """Whether the class (not `object`) defines the method."""
    if not isinstance(cls, type):
        return False
    return any(callable(vars(k).get(name)) for k in cls.__mro__ if k is not object)


def check_settings(
    path: Any, signature: hooks.HookSignature, settings_key: str, settings: Any
) -> list[Issue]:
    """A hook's own check of its settings: an extension point (generate function, reward
    model, data source) may define `check_settings(settings) -> [(name, problem, fix)]`,
    which runs here, before anything starts."""
    if not isinstance(path, str) or not isinstance(settings, Mapping):
        return []
    try:
        hook = hooks.load_object(path, signature)
    except hooks.HookError:
        return []  # reported by the signature check
    checker = getattr(hook, "check_settings", None)
    if not callable(checker):
        return []
    try:
        problems = checker(dict(settings))
    except Exception as exc:  # a user's check can fail in any way: say which
        return [
            Issue(
                settings_key,
                f"{path}.check_settings raised {type(exc).__name__}: {exc}",
                f"fix the check in {path}'s module",
            )
        ]
    malformed = _malformed_problems(problems)
    if malformed is not None:
        return [
            Issue(
                settings_key,
                f"{path}.check_settings returned {malformed}; it returns a list of "
                "(setting name, problem, fix) tuples of strings, [] when the settings are fine",
                f"return [] or [(name, problem, fix), ...] from {path}.check_settings",
            )
        ]
    return [
        Issue(f"{settings_key}.{name}", message, fix, value=settings.get(name))
        for name, message, fix in problems
    ]


def _malformed_problems(problems: Any) -> str | None:
    """What is wrong with what a check_settings returned, shown; None when it is a list (or
    tuple) of (name, problem, fix) string triples."""
    if not isinstance(problems, list | tuple):
        return f"{type(problems).__name__} {hooks.shown(problems)}"
    for entry in problems:
        triple = isinstance(entry, list | tuple) and len(entry) == 3
        if not triple or not all(isinstance(part, str) for part in entry):
            return f"{hooks.shown(problems)}, whose entry {hooks.shown(entry)} is no such tuple"
    return None


def check_hooks(data: Mapping[str, Any]) -> list[Issue]:
    """Problems with every hook a resolved run config (plain dict) names."""
    recipe = data.get("recipe") or {}
    rollout = recipe.get("rollout") or {} if isinstance(recipe, Mapping) else {}
    if not isinstance(rollout, Mapping):
        return []
    checks = [
        (f"{ROLLOUT}.{name}", rollout.get(name), sig) for name, sig in HOOK_SIGNATURES.items()
    ]
    reward = rollout.get("reward") or {}
    if isinstance(reward, Mapping):
        sig = hooks.GROUP_REWARD_FUNCTION if reward.get("group") else hooks.REWARD_FUNCTION
        checks.insert(0, (f"{ROLLOUT}.reward.custom_function", reward.get("custom_function"), sig))
    checks += _eval_reward_functions(recipe.get("eval") if isinstance(recipe, Mapping) else None)
    evaluation = data.get("mode") == "eval"
    if evaluation:  # training's own hooks (filters, data source) are never imported there
        checks = [(key, path, sig) for key, path, sig in checks if training_only(key) is None]
    found = (check_hook(key, path, sig) for key, path, sig in checks)
    issues = [issue for issue in found if issue is not None]
    issues += _class_issues(recipe, evaluation)
    if not issues:
        issues += check_settings(
            rollout.get("generate_function"),
            hooks.GENERATE_FUNCTION,
            f"{ROLLOUT}.generate_settings",
            rollout.get("generate_settings") or {},
        )
        issues += check_min_turns(rollout.get("generate_function"), rollout.get("max_turns", 1))
    return issues


def _eval_reward_functions(section: Any) -> list[tuple[str, Any, hooks.HookSignature]]:
    """The evaluation's own reward functions: recipe.eval's and each set's."""
    if not isinstance(section, Mapping):
        return []
    key = "recipe.eval.custom_reward_function"
    found = [(key, section.get("custom_reward_function"), hooks.REWARD_FUNCTION)]
    datasets = section.get("datasets")
    for i, dataset in enumerate(datasets if isinstance(datasets, list) else []):
        if isinstance(dataset, Mapping):
            path = dataset.get("custom_reward_function")
            key = f"recipe.eval.datasets.{i}.custom_reward_function"
            found.append((key, path, hooks.REWARD_FUNCTION))
    return found


def check_min_turns(path: Any, max_turns: Any) -> list[Issue]:
    """A generate function may declare `min_turns`: the policy turns a sample that uses its
    environment needs to answer (a tool call, then the answer after the tool's reply: 2).
    With max_turns below it every such sample ends before its answer."""
    if not isinstance(path, str) or not isinstance(max_turns, int):
        return []
    try:
        hook = hooks.load_object(path, hooks.GENERATE_FUNCTION)
    except hooks.HookError:
        return []  # reported by the signature check
    need = getattr(hook, "min_turns", None)
    if not isinstance(need, int) or max_turns >= need:
        return []
    return [
        Issue(
            f"{ROLLOUT}.max_turns",
            f"{path} needs {need} policy turns for a sample that uses its environment to "
            f"answer (its min_turns), and max_turns={max_turns} ends such a sample after turn "
            f"{max_turns}, before the answer: the environment's replies are never used, and "
            "a response that asks for one is graded without an answer",
            f"set {ROLLOUT}.max_turns: {need} or more",
            value=max_turns,
        )
    ]


def _class_issues(recipe: Mapping[str, Any], evaluation: bool = False) -> list[Issue]:
    """The data source class (training's: not in an `evaluation`) and the reward model
    class, with their settings."""
    issues: list[Issue] = []
    data = recipe.get("data") or {}
    reward = ((recipe.get("rollout") or {}).get("reward")) or {}
    named = [
        ("recipe.data", data, "source", "source_settings", hooks.DATA_SOURCE, SOURCE_METHODS),
        ("recipe.rollout.reward", reward, "model", "model_settings", hooks.REWARD_MODEL,
         REWARD_MODEL_METHODS),
    ]  # fmt: skip
    for prefix, section, key, settings_key, signature, methods in named:
        if not isinstance(section, Mapping) or (evaluation and training_only(f"{prefix}.{key}")):
            continue
        path = section.get(key)
        issue = check_class(f"{prefix}.{key}", path, signature, methods)
        if issue is not None:
            issues.append(issue)
            continue
        settings = section.get(settings_key) or {}
        issues += check_settings(path, signature, f"{prefix}.{settings_key}", settings)
    return issues
