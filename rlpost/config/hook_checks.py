"""Dotted-path hooks named by a recipe, imported and signature-checked at validation time.

A typo in a hook path would otherwise surface only after Ray, the trainers and the engines
are up; here it is an Issue at the recipe key, before anything starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlpost import hooks
from rlpost.errors import Issue

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


def check_hooks(data: Mapping[str, Any]) -> list[Issue]:
    """Problems with every hook a resolved run config (plain dict) names."""
    rollout = (data.get("recipe") or {}).get("rollout") or {}
    if not isinstance(rollout, Mapping):
        return []
    checks = [
        (f"{ROLLOUT}.{name}", rollout.get(name), sig) for name, sig in HOOK_SIGNATURES.items()
    ]
    reward = rollout.get("reward") or {}
    if isinstance(reward, Mapping):
        sig = hooks.GROUP_REWARD_FUNCTION if reward.get("group") else hooks.REWARD_FUNCTION
        checks.insert(0, (f"{ROLLOUT}.reward.custom_function", reward.get("custom_function"), sig))
    found = (check_hook(key, path, sig) for key, path, sig in checks)
    return [issue for issue in found if issue is not None]
