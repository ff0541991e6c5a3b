"""recipe.eval's set settings (how each evaluation set is sampled, and the evaluation before
training) are read only by an evaluation of recipe.eval.datasets: with no set named, a command
line's are refused (rlpost.config.eval_sets), a file's kept and noted in the plan."""

from __future__ import annotations

import pytest

from rlpost.config.loader import compose_run_config
from rlpost.errors import UserError
from rlpost.plan import build_plan
from rlpost.schema.evaluation import SET_SETTINGS

TINY = ("model=qwen3-tiny", "recipe=grpo_tiny_math", "hardware=cpu")
OFF = ("recipe.eval.datasets=[]", "recipe.eval.interval=null")  # the recipe's evaluation off
# each set setting at a value other than its default and the recipe's
GIVEN = {
    "n_samples_per_prompt": "recipe.eval.n_samples_per_prompt=4",
    "max_response_len": "recipe.eval.max_response_len=12",
    "temperature": "recipe.eval.temperature=0.6",
    "top_p": "recipe.eval.top_p=0.9",
    "top_k": "recipe.eval.top_k=20",
    "skip_before_train": "recipe.eval.skip_before_train=true",
}


def test_every_set_setting_is_changed_below() -> None:
    assert set(GIVEN) == set(SET_SETTINGS)


@pytest.mark.parametrize("name", SET_SETTINGS)
def test_a_set_setting_on_the_command_line_without_sets_is_refused(name: str) -> None:
    with pytest.raises(UserError) as caught:
        compose_run_config([*TINY, *OFF, GIVEN[name]])
    [issue] = caught.value.issues
    assert issue.key == f"recipe.eval.{name}"
    assert str(issue.location) == f"command line: {GIVEN[name]}"
    assert "recipe.eval.datasets names none: no evaluation runs" in issue.message
    assert "name the sets in recipe.eval.datasets" in issue.fix
    assert f"drop the override {GIVEN[name]}" in issue.fix


def test_the_refusal_shows_the_value_given() -> None:
    with pytest.raises(UserError) as caught:
        compose_run_config([*TINY, *OFF, "recipe.eval.temperature=0.6"])
    assert caught.value.issues[0].value == 0.6


def test_set_settings_on_the_command_line_with_sets_are_taken() -> None:
    cfg = compose_run_config([*TINY, *GIVEN.values()])[0]
    ev = cfg.recipe.eval
    assert (ev.temperature, ev.top_k, ev.n_samples_per_prompt) == (0.6, 20, 4)
    assert ev.datasets and not ev.unread_set_settings()


def test_removing_or_resetting_a_set_setting_without_sets_is_accepted() -> None:
    cfg = compose_run_config(
        [*TINY, *OFF, "~recipe.eval.temperature", "recipe.eval.max_response_len=null"]
    )[0]
    assert cfg.recipe.eval.temperature is None and cfg.recipe.eval.max_response_len is None
    assert not [n for n in build_plan(cfg).notes if "recipe.eval.datasets names no" in n]


def test_turning_a_recipes_evaluation_off_keeps_its_set_settings_and_notes_them() -> None:
    """grpo_tiny_math's file sets eval.max_response_len 16 and temperature 1.0."""
    cfg = compose_run_config([*TINY, *OFF])[0]
    assert cfg.recipe.eval.unread_set_settings() == ["max_response_len", "temperature"]
    [note] = [n for n in build_plan(cfg).notes if "recipe.eval.datasets names no" in n]
    assert "(recipe.eval.max_response_len, recipe.eval.temperature) is not read" in note
