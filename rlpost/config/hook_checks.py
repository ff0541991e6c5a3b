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

# key under recipe.rollout -> name of its HookSignature in rlpost.hooks
HOOK_SIGNATURES: dict[str, str] = {
    "dynamic_sampling_filter": "DYNAMIC_SAMPLING_FILTER",
    "buffer_filter": "BUFFER_FILTER",
    "generate_function": "GENERATE_FUNCTION",
}


def _signature(name: str, role: str) -> tuple[hooks.HookSignature, bool]:
    """(the signature, whether rlpost.hooks defines it; if not, only the import is checked)."""
    found = getattr(hooks, name, None)
    if isinstance(found, hooks.HookSignature):
        return found, True
    return hooks.HookSignature(role, ()), False


def check_hook(key: str, path: Any, signature_name: str) -> Issue | None:
    """Import the hook at `key` and check its signature; the problem as an Issue, if any."""
    if path is None:
        return None
    if not isinstance(path, str):
        return None  # the schema reports a non-string itself
    role = key.rsplit(".", 1)[-1].replace("_", " ")
    signature, known = _signature(signature_name, role)
    try:
        hooks.load_hook(path, signature)
    except hooks.HookError as exc:
        if exc.kind is hooks.HookErrorKind.WRONG_SIGNATURE and not known:
            return None
        return exc.as_issue(key)
    return None


def check_hooks(data: Mapping[str, Any]) -> list[Issue]:
    """Problems with every hook a resolved run config (plain dict) names."""
    rollout = (data.get("recipe") or {}).get("rollout") or {}
    if not isinstance(rollout, Mapping):
        return []
    checks = [(f"{ROLLOUT}.{field}", rollout.get(field), sig) for field, sig in HOOK_SIGNATURES.items()]
    reward = rollout.get("reward") or {}
    if isinstance(reward, Mapping):
        group = bool(reward.get("group"))
        sig = "GROUP_REWARD_FUNCTION" if group else "REWARD_FUNCTION"
        checks.insert(0, (f"{ROLLOUT}.reward.custom_function", reward.get("custom_function"), sig))
    found = (check_hook(key, path, sig) for key, path, sig in checks)
    return [issue for issue in found if issue is not None]
