"""Load user hooks named by dotted path (`package.module.attr`) and check their signatures.

Config validation calls `load_hook` for every hook a run names, so a typo or a wrong
signature fails before any process starts. Imports only the standard library (plus the
stdlib-only `rlpost.errors`): validation must stay cheap.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from rlpost.errors import Issue, Location


@dataclass(frozen=True)
class KeywordShape:
    """A second shape a hook may have, recognised by its parameter names and called by
    keyword: `required` are always passed, each of `optional` where the function takes it
    (by name, or through **kwargs). A function of this shape has no other required
    parameter."""

    origin: str  # whose shape it is, for messages
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()

    def describe(self) -> str:
        params = [*self.required, *(f"{name}=None" for name in self.optional)]
        return f"{self.origin}'s [async] def fn({', '.join(params)})"

    def fits(self, hook: Callable[..., Any]) -> bool:
        """Whether `hook` names every required parameter and requires nothing else."""
        params = _parameters(hook)
        if params is None:
            return False
        kinds = inspect.Parameter
        by_name = {
            p.name: p for p in params if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)
        }
        known = {*self.required, *self.optional}
        others_required = any(
            p.default is p.empty and p.name not in known
            for p in params
            if p.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD)
        )
        return all(name in by_name for name in self.required) and not others_required

    def arguments(self, hook: Callable[..., Any], values: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments to call a fitting `hook` with: `values` less the optional
        ones it does not take."""
        params = _parameters(hook) or []
        taken = {p.name for p in params}
        open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        return {
            name: value
            for name, value in values.items()
            if name in self.required or open_ended or name in taken
        }


@dataclass(frozen=True)
class HookSignature:
    """What a hook must look like: its role (for messages), positional parameters, kind;
    or, where `keywords` is set, that other shape.

    `is_async` None accepts both plain and `async def` functions.
    """

    role: str
    params: tuple[str, ...]
    is_async: bool | None = None
    keywords: KeywordShape | None = None

    def describe(self) -> str:
        prefix = {True: "async def", False: "def", None: "[async] def"}[self.is_async]
        return f"{prefix} fn({', '.join(self.params)})"

    def shapes(self) -> str:
        """Every shape the hook may have, for messages."""
        own = self.describe()
        return f"{own}, or {self.keywords.describe()}" if self.keywords else own


# verl's custom_reward_function (verl.utils.reward_score.default_compute_score's shape),
# which verl calls by keyword; a dict it returns holds the reward as "score"
VERL_COMPUTE_SCORE = KeywordShape(
    "verl", ("data_source", "solution_str", "ground_truth"), ("extra_info",)
)
REWARD_FUNCTION = HookSignature("reward function", ("sample",), keywords=VERL_COMPUTE_SCORE)
GROUP_REWARD_FUNCTION = HookSignature("group reward function", ("samples",))
DYNAMIC_SAMPLING_FILTER = HookSignature("dynamic sampling filter", ("samples",), is_async=False)
GENERATE_FUNCTION = HookSignature("generate function", ("sample", "ctx"), is_async=True)
DATA_SOURCE = HookSignature("data source class", ("ctx",))
REWARD_MODEL = HookSignature("reward model class", ("ctx",))
BUFFER_FILTER = HookSignature(
    "buffer filter", ("rollout_id", "buffer", "num_groups"), is_async=False
)


class HookErrorKind(StrEnum):
    BAD_PATH = "bad path"
    MODULE_NOT_FOUND = "module not found"
    IMPORT_FAILED = "import failed"
    ATTRIBUTE_MISSING = "attribute missing"
    NOT_CALLABLE = "not callable"
    WRONG_SIGNATURE = "wrong signature"


class HookError(ValueError):
    """A hook path that does not resolve to a function of the expected shape."""

    def __init__(self, kind: HookErrorKind, path: str, message: str, fix: str) -> None:
        super().__init__(f"{message}; fix: {fix}")
        self.kind = kind
        self.path = path
        self.message = message
        self.fix = fix

    def as_issue(self, key: str, location: Location | None = None) -> Issue:
        """The same problem as a config issue at `key` (e.g. 'rollout.reward.custom_function')."""
        return Issue(
            key=key, message=self.message, fix=self.fix, value=self.path, location=location
        )


def load_hook(path: str, signature: HookSignature) -> Callable[..., Any]:
    """Import `path` ('pkg.module.attr') and return the callable, or raise HookError."""
    hook: Callable[..., Any] = load_object(path, signature)
    check_signature(hook, path, signature)
    return hook


def load_object(path: str, signature: HookSignature) -> Any:
    """Import `path` and return the attribute it names (a function, a class), or raise
    HookError; `signature` words the messages, its parameters are not checked."""
    module_name, _, attr = path.rpartition(".")
    if not module_name or not attr or any(not part.isidentifier() for part in path.split(".")):
        raise HookError(
            HookErrorKind.BAD_PATH,
            path,
            f"{signature.role} '{path}' is not a dotted path 'package.module.function'",
            "name the function by its module and attribute, e.g. 'my_pkg.rewards.score'",
        )
    module = _import_module(module_name, path, signature)
    if not hasattr(module, attr):
        public = [name for name in dir(module) if not name.startswith("_")]
        raise HookError(
            HookErrorKind.ATTRIBUTE_MISSING,
            path,
            f"module '{module_name}' has no attribute '{attr}'"
            + _did_you_mean(attr, public, prefix=f"{module_name}."),
            f"define {signature.describe()} named '{attr}' in {_module_file(module)}, "
            "or correct the name",
        )
    return getattr(module, attr)


def check_signature(hook: Any, path: str, signature: HookSignature) -> None:
    """Raise HookError unless `hook` can be called as `signature` describes."""
    if not callable(hook):
        raise HookError(
            HookErrorKind.NOT_CALLABLE,
            path,
            f"{signature.role} '{path}' is {_a(type(hook).__name__)}, not a function",
            f"point it at a function: {signature.shapes()}",
        )
    if signature.keywords is not None and signature.keywords.fits(hook):
        return
    problem = _arity_problem(hook, len(signature.params))
    wants_async = signature.is_async
    if problem is None and wants_async is not None and _is_async(hook) != wants_async:
        problem = "is an async function" if _is_async(hook) else "is a plain (non-async) function"
    if problem is not None:
        raise HookError(
            HookErrorKind.WRONG_SIGNATURE,
            path,
            f"{signature.role} '{path}' {problem}; expected {signature.shapes()}",
            f"change it to {signature.shapes()}",
        )


def is_async_hook(hook: Callable[..., Any]) -> bool:
    """True for `async def` functions and objects with an `async def __call__`."""
    return _is_async(hook)


def _import_module(module_name: str, path: str, signature: HookSignature) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        if module_name == missing or module_name.startswith(missing + "."):
            raise _module_not_found(module_name, missing, path, signature) from None
        raise HookError(
            HookErrorKind.IMPORT_FAILED,
            path,
            f"module '{module_name}' exists but importing it failed: it imports "
            f"'{missing}', which is not installed",
            f"install '{missing}' in the environment that runs rlpost, or remove that import",
        ) from None
    except Exception as exc:  # a user module can fail to import in any way
        raise HookError(
            HookErrorKind.IMPORT_FAILED,
            path,
            f"module '{module_name}' exists but importing it raised {type(exc).__name__}: {exc}",
            f"fix the error in module '{module_name}' (import it with python -c "
            f"'import {module_name}' to see the traceback)",
        ) from None


def _module_not_found(
    module_name: str, missing: str, path: str, signature: HookSignature
) -> HookError:
    parent, _, leaf = missing.rpartition(".")
    try:
        search = getattr(importlib.import_module(parent), "__path__", []) if parent else None
        candidates = [m.name for m in pkgutil.iter_modules(search)]
    except Exception:  # a broken parent package: the plain message is enough
        candidates = []
    hint = _did_you_mean(leaf, candidates, prefix=f"{parent}." if parent else "")
    where = f"module '{module_name}' was not found"
    if missing != module_name:
        where += f" (no package '{missing}')"
    return HookError(
        HookErrorKind.MODULE_NOT_FOUND,
        path,
        f"{signature.role} '{path}': {where}{hint}",
        "check the spelling, and that the module's directory is importable "
        "(installed, or on PYTHONPATH for every process of the run)",
    )


def _parameters(hook: Callable[..., Any]) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(hook).parameters.values())
    except (TypeError, ValueError):
        return None  # builtins without a signature


def _arity_problem(hook: Callable[..., Any], count: int) -> str | None:
    params = _parameters(hook)
    if params is None:
        return None  # nothing to check
    kinds = inspect.Parameter
    positional = [
        p for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
    ]
    required = [p for p in positional if p.default is p.empty]
    varargs = any(p.kind is kinds.VAR_POSITIONAL for p in params)
    required_kwonly = [
        p.name for p in params if p.kind is kinds.KEYWORD_ONLY and p.default is p.empty
    ]
    if required_kwonly:
        return f"has required keyword-only parameters {required_kwonly}"
    if len(required) > count:
        names = ", ".join(p.name for p in required)
        return f"requires {len(required)} positional parameters ({names})"
    if len(positional) < count and not varargs:
        return f"takes {len(positional)} positional parameters but is called with {count}"
    return None


def _is_async(hook: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(hook):
        return True
    call = getattr(hook, "__call__", None)  # noqa: B004 - an async __call__ on an instance
    return not inspect.isfunction(hook) and inspect.iscoroutinefunction(call)


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1].lower() in "aeiou" else f"a {noun}"


def shown(value: Any, limit: int = 120) -> str:
    """`value`'s repr, cut to `limit` characters, for messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _did_you_mean(word: str, choices: list[str], prefix: str = "") -> str:
    matches = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f". Did you mean '{prefix}{matches[0]}'?" if matches else ""


def _module_file(module: Any) -> str:
    return getattr(module, "__file__", None) or f"module '{module.__name__}'"
