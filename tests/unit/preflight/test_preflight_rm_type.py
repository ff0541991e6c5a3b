"""Which prompt lines' metadata rm_type the data preflight holds to rlpost's reward types."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlpost.data.prompts import PromptFormat
from rlpost.preflight.data_files import RowRules, check_prompt_file

FMT = PromptFormat("prompt", "label", "metadata", None, apply_chat_template=False)


def test_a_lines_rm_type_beside_a_custom_function_is_the_functions_to_read(
    tmp_path: Path,
) -> None:
    """A custom function scores every sample before any rm_type (slime's --custom-rm-path
    does too) and may read rm_type itself, so a name rlpost grades nothing by (slime's
    ifbench, a function's own) is no error there; where the line's rm_type picks its grader,
    it is refused with the reason."""
    path = tmp_path / "mixed.jsonl"
    line = {"prompt": "Write two lines.", "label": "2", "metadata": {"rm_type": "ifbench"}}
    path.write_text(json.dumps(line) + "\n")
    read_by_function = RowRules(FMT, labelled=False, reward_type="math", rm_type_grades=False)
    assert check_prompt_file("recipe.data.prompt_data", str(path), read_by_function) == []
    graded = RowRules(FMT, labelled=True, reward_type="math")
    (issue,) = check_prompt_file("recipe.data.prompt_data", str(path), graded)
    assert "metadata rm_type 'ifbench' is not available" in issue.message


def test_an_eval_set_its_own_function_scores_is_not_held_to_labels_or_rm_types(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A set scored by a custom function of the evaluation's (its own, or recipe.eval's) is
    graded against no label, and its lines' rm_type is the function's to read: the preflight
    that holds a set the math grader scores to both leaves it alone."""
    from rlpost.config.loader import compose_run_config
    from rlpost.plan import build_plan
    from rlpost.preflight.data_files import check_data

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "hooks_fixtures"))
    path = tmp_path / "ifeval.jsonl"
    line = {"prompt": "Write two lines.", "label": "", "metadata": {"rm_type": "ifbench"}}
    path.write_text(json.dumps(line) + "\n")

    def issues(*overrides: str) -> list[str]:
        cfg = compose_run_config(
            [f"recipe.eval.datasets=[{{name: ifeval, path: {path}}}]", *overrides]
        )[0]
        return [issue.key for issue in check_data(cfg, build_plan(cfg))]

    fn = "rlpost_test_hooks.quarter_reward"
    own = f"recipe.eval.datasets=[{{name: ifeval, path: {path}, custom_reward_function: {fn}}}]"
    assert issues() == [f"{path}:1"]  # an empty label: the math grader pays only an empty box
    assert issues(f"recipe.eval.custom_reward_function={fn}") == []
    line["label"] = "2"
    path.write_text(json.dumps(line) + "\n")
    assert issues() == [f"{path}:1"]  # 'ifbench' picks the grader, and is none of rlpost's
    assert issues(own) == []


def test_a_lines_labelled_rm_type_in_a_set_without_labels_is_refused(tmp_path: Path) -> None:
    """A set whose lines carry no label (label_key: false) is graded by a scorer that reads
    none; a line whose rm_type picks a labelled grader would fail at every sample. A set's
    own reward_type grades over the line's rm_type, so there it is no error."""
    from rlpost.config.loader import compose_run_config
    from rlpost.plan import build_plan
    from rlpost.preflight.data_files import check_data

    path = tmp_path / "mixed.jsonl"
    lines = [{"prompt": "1+1=", "metadata": {"rm_type": "random"}}, {"prompt": "2+2="}]
    lines.append({"prompt": "3+3=", "metadata": {"rm_type": "math"}})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))

    def issues(dataset: str, *overrides: str) -> list[tuple[str, str, str]]:
        given = [
            "mode=eval",
            "recipe.rollout.reward.type=random",
            f"recipe.eval.datasets=[{{name: mixed, path: {path}, {dataset}}}]",
            *overrides,
        ]
        cfg = compose_run_config(given)[0]
        return [(i.key, i.message, i.fix) for i in check_data(cfg, build_plan(cfg))]

    [(key, message, fix)] = issues("label_key: false")
    assert key == f"{path}:3"
    assert message == (
        "metadata rm_type 'math' grades the response against the line's label, and "
        "recipe.eval.datasets.0.label_key is false, so no line's label is read: the line's "
        "every sample would fail when graded"
    )
    assert fix == (
        "set recipe.eval.datasets.0.label_key to the key that holds the lines' answers, or "
        "remove rm_type from the line (reward type random grades it then)"
    )
    [(_, message, fix)] = issues("label_key: null", "recipe.data.label_key=null")
    assert "recipe.data.label_key is unset" in message and "set recipe.data.label_key" in fix
    assert issues("label_key: false, reward_type: random") == []
