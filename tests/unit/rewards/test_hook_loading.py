import subprocess
import sys
from pathlib import Path

import pytest

from rlpost.errors import Location
from rlpost.hooks import (
    BUFFER_FILTER,
    DYNAMIC_SAMPLING_FILTER,
    GROUP_REWARD_FUNCTION,
    REWARD_FUNCTION,
    HookError,
    HookErrorKind,
    load_hook,
)


def load_error(path: str, signature=REWARD_FUNCTION) -> HookError:
    with pytest.raises(HookError) as info:
        load_hook(path, signature)
    return info.value


def test_loads_a_hook_with_the_right_signature(hook_modules: Path) -> None:
    hook = load_hook("rlpost_test_hooks.length_reward", REWARD_FUNCTION)
    assert hook.__name__ == "length_reward"
    assert load_hook("rlpost_test_hooks.async_contains_label", REWARD_FUNCTION)
    assert load_hook("rlpost_test_hooks.rank_in_group", GROUP_REWARD_FUNCTION)


def test_shipped_filters_match_their_signatures() -> None:
    assert load_hook("rlpost.filters.pop_first", BUFFER_FILTER)
    assert load_hook("rlpost.filters.check_reward_nonzero_std", DYNAMIC_SAMPLING_FILTER)


def test_module_not_found_suggests_a_close_module(hook_modules: Path) -> None:
    error = load_error("rlpost_test_hook.length_reward")
    assert error.kind is HookErrorKind.MODULE_NOT_FOUND
    assert "module 'rlpost_test_hook' was not found" in error.message
    assert "Did you mean 'rlpost_test_hooks'?" in error.message
    assert "PYTHONPATH" in error.fix


def test_missing_submodule_suggests_a_sibling() -> None:
    error = load_error("rlpost.filter.pop_first", BUFFER_FILTER)
    assert error.kind is HookErrorKind.MODULE_NOT_FOUND
    assert "Did you mean 'rlpost.filters'?" in error.message


def test_missing_attribute_suggests_a_close_name(hook_modules: Path) -> None:
    error = load_error("rlpost_test_hooks.lenght_reward")
    assert error.kind is HookErrorKind.ATTRIBUTE_MISSING
    assert "module 'rlpost_test_hooks' has no attribute 'lenght_reward'" in error.message
    assert "Did you mean 'rlpost_test_hooks.length_reward'?" in error.message
    assert "def fn(sample)" in error.fix


@pytest.mark.parametrize(
    ("path", "signature", "problem"),
    [
        ("rlpost_test_hooks.two_args", REWARD_FUNCTION, "requires 2 positional parameters"),
        ("rlpost_test_hooks.length_reward", BUFFER_FILTER, "takes 1 positional parameters"),
        ("rlpost_test_hooks.async_contains_label", DYNAMIC_SAMPLING_FILTER, "is an async"),
    ],
)
def test_wrong_signature_says_what_was_expected(
    hook_modules: Path, path: str, signature, problem: str
) -> None:
    error = load_error(path, signature)
    assert error.kind is HookErrorKind.WRONG_SIGNATURE
    assert problem in error.message
    assert signature.describe() in error.message


def test_a_module_that_fails_to_import_is_not_reported_as_missing(hook_modules: Path) -> None:
    error = load_error("rlpost_broken_hooks.reward")
    assert error.kind is HookErrorKind.IMPORT_FAILED
    assert "'rlpost_package_that_does_not_exist', which is not installed" in error.message


def test_not_callable_and_bad_paths(hook_modules: Path) -> None:
    error = load_error("rlpost_test_hooks.NOT_A_FUNCTION")
    assert error.kind is HookErrorKind.NOT_CALLABLE
    assert "'rlpost_test_hooks.NOT_A_FUNCTION' is an int, not a function" in error.message
    assert load_error("length_reward").kind is HookErrorKind.BAD_PATH
    assert load_error("rlpost_test_hooks.").kind is HookErrorKind.BAD_PATH


def test_hook_error_becomes_a_config_issue(hook_modules: Path) -> None:
    error = load_error("rlpost_test_hooks.lenght_reward")
    issue = error.as_issue("rollout.reward.custom_function", Location("recipe.yaml", 12))
    rendered = issue.render()
    assert "rollout.reward.custom_function = 'rlpost_test_hooks.lenght_reward'" in rendered
    assert "recipe.yaml:12" in rendered
    assert "fix: define" in rendered
    assert isinstance(error, ValueError)  # pydantic validators turn it into a field error


def test_hook_loader_and_reward_hub_import_nothing_heavy() -> None:
    code = (
        "import sys, rlpost.hooks, rlpost.rewards, rlpost.filters; "
        "heavy = ['torch', 'transformers', 'ray', 'math_verify', 'sympy', 'aiohttp', 'pydantic']; "
        "print([m for m in heavy if m in sys.modules])"
    )
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "name", ["verl_exact_match", "verl_scored_dict", "async_verl_score", "verl_sleepy_score"]
)
def test_a_reward_function_of_verl_s_shape_loads(hook_modules: Path, name: str) -> None:
    """verl's compute_score(data_source, solution_str, ground_truth, extra_info=None), with
    or without extra_info, plain or async, is a reward function as it is."""
    assert load_hook(f"rlpost_test_hooks.{name}", REWARD_FUNCTION).__name__ == name


def test_a_reward_function_of_neither_shape_is_refused_naming_both(hook_modules: Path) -> None:
    for name in ("two_args", "verl_and_sample"):
        error = load_error(f"rlpost_test_hooks.{name}")
        assert error.kind is HookErrorKind.WRONG_SIGNATURE
        assert (
            "expected [async] def fn(sample), or verl's [async] def fn(data_source, "
            "solution_str, ground_truth, extra_info=None)" in error.message
        )
    # a group function takes no verl shape
    error = load_error("rlpost_test_hooks.verl_exact_match", GROUP_REWARD_FUNCTION)
    assert "requires 3 positional parameters" in error.message
