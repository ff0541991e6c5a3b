from collections.abc import Callable
from pathlib import Path

import pytest

from rlpost.data import PromptDataError, PromptFormat, load_prompts
from rlpost.errors import UserError

DAPO_ROW = {
    "prompt": [{"role": "user", "content": "Problem 3: what is 3 times 4?"}],
    "label": "12",
}


def fmt(**overrides: object) -> PromptFormat:
    fields: dict = {
        "input_key": "prompt",
        "label_key": "label",
        "metadata_key": "metadata",
        "apply_chat_template": True,
    }
    return PromptFormat(**(fields | overrides))


def test_message_list_prompt_gets_the_chat_template(write_jsonl, chat_tokenizer) -> None:
    records, dropped = load_prompts(write_jsonl([DAPO_ROW]), fmt(), chat_tokenizer)
    assert dropped == 0
    (record,) = records
    expected = "<|im_start|>user\nProblem 3: what is 3 times 4?<|im_end|>\n<|im_start|>assistant\n"
    assert chat_tokenizer.decode(list(record.prompt_ids)) == expected
    assert record.prompt_ids[0] == chat_tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert record.prompt == DAPO_ROW["prompt"]
    assert record.label == "12"
    assert record.metadata == {}
    assert record.line == 1


def test_string_prompt_is_wrapped_as_a_user_message(write_jsonl, chat_tokenizer) -> None:
    path = write_jsonl([{"prompt": "what is 2 times 3?", "label": 6}])
    (record,) = load_prompts(path, fmt(), chat_tokenizer)[0]
    text = chat_tokenizer.decode(list(record.prompt_ids))
    assert text.startswith("<|im_start|>user\nwhat is 2 times 3?<|im_end|>")
    assert record.prompt == "what is 2 times 3?"
    assert record.label == "6"  # numbers become strings


def test_raw_string_prompt_without_template(write_jsonl, chat_tokenizer) -> None:
    path = write_jsonl([{"input": "what is 2 times 3?", "metadata": {"rm_type": "dapo"}}])
    loaded, _ = load_prompts(
        path, fmt(input_key="input", label_key=None, apply_chat_template=False), chat_tokenizer
    )
    (record,) = loaded
    assert chat_tokenizer.decode(list(record.prompt_ids)) == "what is 2 times 3?"
    assert record.label is None
    assert record.metadata == {"rm_type": "dapo"}


def test_chat_template_kwargs_reach_the_template(write_jsonl, chat_tokenizer) -> None:
    path = write_jsonl([DAPO_ROW])
    plain = load_prompts(path, fmt(), chat_tokenizer)[0][0]
    no_think = fmt(chat_template_kwargs={"enable_thinking": False})
    quiet = load_prompts(path, no_think, chat_tokenizer)[0][0]
    assert "<think>" not in chat_tokenizer.decode(list(plain.prompt_ids))
    assert chat_tokenizer.decode(list(quiet.prompt_ids)).endswith("<think>\n\n</think>\n\n")


def test_every_bad_line_is_reported_with_file_and_line(write_jsonl, chat_tokenizer) -> None:
    rows = [
        DAPO_ROW,
        "",  # blank lines are skipped but still counted
        '{"prompt": "unterminated',
        {"question": "what?", "label": "1"},
        {"prompt": 42, "label": "1"},
        {"prompt": "ok", "label": {"value": 1}},
        {"prompt": [{"content": "no role"}], "label": "1"},
        {"prompt": "ok", "label": "1", "metadata": ["not", "an", "object"]},
        DAPO_ROW,
    ]
    path = write_jsonl(rows)
    with pytest.raises(PromptDataError) as info:
        load_prompts(path, fmt(), chat_tokenizer)
    error = info.value
    assert isinstance(error, UserError)
    assert [issue.location.line for issue in error.issues] == [3, 4, 5, 6, 7, 8]
    assert all(issue.location.file == str(path) for issue in error.issues)
    text = error.render()
    assert f"{path}:3" in text and "is not valid JSON" in text
    assert "is missing (this line's keys: label, question)" in text
    assert "set data.input_key to the field that holds it" in text
    assert "is of type int, not a prompt" in text
    assert "a label must be a string or a number" in text
    assert "message 0 is not an object with 'role' and 'content'" in text
    assert "metadata must be a JSON object" in text
    assert text.startswith("rlpost: 6 data errors")


def test_many_bad_lines_are_summarised(write_jsonl, chat_tokenizer) -> None:
    path = write_jsonl(["not json"] * 25)
    with pytest.raises(PromptDataError) as info:
        load_prompts(path, fmt(), chat_tokenizer)
    assert len(info.value.issues) == 11
    assert "15 more bad lines not shown" in info.value.render()


def test_message_list_without_template_is_an_error(write_jsonl, chat_tokenizer) -> None:
    with pytest.raises(PromptDataError, match=r"apply_chat_template: true"):
        load_prompts(write_jsonl([DAPO_ROW]), fmt(apply_chat_template=False), chat_tokenizer)


def test_max_prompt_len_drops_long_prompts_and_counts_them(
    write_jsonl: Callable[..., Path], chat_tokenizer
) -> None:
    rows = [{"prompt": "short", "label": "1"}, {"prompt": "long " * 50, "label": "2"}]
    records, dropped = load_prompts(write_jsonl(rows), fmt(), chat_tokenizer, max_prompt_len=30)
    assert [r.label for r in records] == ["1"]
    assert dropped == 1
    with pytest.raises(PromptDataError, match="all 2 prompts exceed max_prompt_len"):
        load_prompts(write_jsonl(rows), fmt(), chat_tokenizer, max_prompt_len=2)


def test_missing_file_names_the_path(tmp_path: Path, chat_tokenizer) -> None:
    with pytest.raises(PromptDataError, match="cannot be read") as info:
        load_prompts(tmp_path / "nope.jsonl", fmt(), chat_tokenizer)
    assert "nope.jsonl" in info.value.render()


def test_a_prompt_already_rendered_by_the_chat_template_is_refused(
    write_jsonl, chat_tokenizer
) -> None:
    """Data prepared for another framework often holds the rendered conversation; wrapped by
    the template again, the model would see a conversation inside a user message."""
    rendered = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    path = write_jsonl([{"prompt": rendered, "label": "4"}])
    with pytest.raises(PromptDataError) as refused:
        load_prompts(path, fmt(), chat_tokenizer)
    (issue,) = refused.value.issues
    assert "already holds the chat template's marker" in issue.message
    assert "data.apply_chat_template: false" in issue.fix
    as_written = fmt(apply_chat_template=False)
    (record,) = load_prompts(path, as_written, chat_tokenizer)[0]
    assert chat_tokenizer.decode(list(record.prompt_ids)) == rendered
    plain = write_jsonl([{"prompt": "Is 3 < 4 [yes/no]?", "label": "yes"}])
    assert load_prompts(plain, fmt(), chat_tokenizer)[0]
