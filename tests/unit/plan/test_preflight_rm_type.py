"""Which prompt lines' metadata rm_type the data preflight holds to rlpost's reward types."""

from __future__ import annotations

import json
from pathlib import Path

from rlpost.data.prompts import PromptFormat
from rlpost.plan.preflight import RowRules, check_jsonl

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
    assert check_jsonl("recipe.data.prompt_data", str(path), read_by_function) == []
    graded = RowRules(FMT, labelled=True, reward_type="math")
    (issue,) = check_jsonl("recipe.data.prompt_data", str(path), graded)
    assert "metadata rm_type 'ifbench' is not available" in issue.message
