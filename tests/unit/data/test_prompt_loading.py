import json
import logging
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
        "tool_key": "tools",
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


def test_a_null_label_is_refused_as_a_missing_answer(write_jsonl, chat_tokenizer) -> None:
    rows = [DAPO_ROW, {**DAPO_ROW, "label": None}]
    with pytest.raises(PromptDataError) as refused:
        load_prompts(write_jsonl(rows), fmt(), chat_tokenizer)
    (issue,) = refused.value.issues
    assert (issue.key, issue.location.line) == ("label", 2)
    assert issue.message == "is null: the line has no reference answer to grade against"
    assert issue.fix == "store this line's reference answer under that key, or leave the line out"


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
    with pytest.raises(PromptDataError) as refused:
        load_prompts(write_jsonl(rows), fmt(), chat_tokenizer, max_prompt_len=2)
    (issue,) = refused.value.issues
    shortest = len(records[0].prompt_ids)
    assert (issue.key, issue.value) == ("recipe.data.max_prompt_len", 2)
    assert issue.message.startswith("leaves out all 2 prompts of the file (they run from ")
    assert f"raise recipe.data.max_prompt_len to at least {shortest} " in issue.fix


def test_a_drop_is_said_loudly_and_one_that_cannot_fill_a_rollout_is_refused(
    write_jsonl: Callable[..., Path], chat_tokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    rows = [{"prompt": "short", "label": "1"}]
    rows += [{"prompt": "long " * (20 + i), "label": "2"} for i in range(9)]
    path = write_jsonl(rows)
    everything, _ = load_prompts(path, fmt(), chat_tokenizer)
    lengths = sorted(len(r.prompt_ids) for r in everything)  # the template's tokens included
    with caplog.at_level(logging.WARNING, logger="rlpost"):
        kept, dropped = load_prompts(path, fmt(), chat_tokenizer, max_prompt_len=lengths[0])
    assert (len(kept), dropped) == (1, 9)
    assert (
        f"left out 9 of 10 prompts longer than recipe.data.max_prompt_len={lengths[0]} tokens"
        in caplog.text
    )
    with pytest.raises(PromptDataError) as refused:
        load_prompts(path, fmt(), chat_tokenizer, max_prompt_len=lengths[0], min_prompts=4)
    (issue,) = refused.value.issues
    assert issue.message.startswith(
        f"leaves out 9 of the file's 10 prompts (they run from {lengths[0]} to {lengths[-1]} "
    )
    assert "the 1 left cannot fill one rollout of recipe.rollout.batch_size=4 prompts" in (
        issue.message
    )
    assert f"at least {lengths[3]} " in issue.fix
    assert str(issue.location) == str(path)
    kept, _ = load_prompts(path, fmt(), chat_tokenizer, max_prompt_len=lengths[3], min_prompts=4)
    assert len(kept) == 4


def test_an_empty_file_is_refused_saying_what_to_write(tmp_path: Path, chat_tokenizer) -> None:
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(PromptDataError) as refused:
        load_prompts(tmp_path / "empty.jsonl", fmt(), chat_tokenizer)
    (issue,) = refused.value.issues
    assert issue.message == "has no prompts"
    assert issue.fix == "write one JSON object per line into it, or use another file"


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
    assert "set recipe.data.apply_chat_template: false" in issue.fix
    as_written = fmt(apply_chat_template=False)
    (record,) = load_prompts(path, as_written, chat_tokenizer)[0]
    assert chat_tokenizer.decode(list(record.prompt_ids)) == rendered
    plain = write_jsonl([{"prompt": "Is 3 < 4 [yes/no]?", "label": "yes"}])
    assert load_prompts(plain, fmt(), chat_tokenizer)[0]


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TOOL_ROW = {"prompt": [{"role": "user", "content": "Rain in Oslo?"}], "label": "yes"}


def text_of(record, tokenizer) -> str:
    return tokenizer.decode(list(record.prompt_ids))


def test_a_lines_tools_reach_the_chat_template_and_its_metadata(
    write_jsonl, tools_tokenizer
) -> None:
    """As slime's --tool-key: the tools are passed to apply_chat_template and kept in the
    sample's metadata; a JSON string of the list is decoded, as slime decodes it."""
    rows = [
        TOOL_ROW | {"tools": [WEATHER], "metadata": {"rm_type": "math"}},
        TOOL_ROW | {"tools": json.dumps([WEATHER])},
    ]
    listed, as_string = load_prompts(write_jsonl(rows), fmt(), tools_tokenizer)[0]
    expected = tools_tokenizer.apply_chat_template(
        TOOL_ROW["prompt"], tools=[WEATHER], add_generation_prompt=True, tokenize=False
    )
    assert text_of(listed, tools_tokenizer) == expected
    assert expected.startswith("<|im_start|>system\n# Tools\n{") and '"get_weather"' in expected
    assert listed.metadata == {"rm_type": "math", "tools": [WEATHER]}
    assert as_string.prompt_ids == listed.prompt_ids
    assert as_string.metadata == {"tools": [WEATHER]}


def test_lines_without_tools_render_as_before(write_jsonl, tools_tokenizer, chat_tokenizer) -> None:
    """A line with no tools field (or null there) gets the same bytes as before tools were
    read, and as with tool_key null, beside lines that have tools."""
    plain = write_jsonl([DAPO_ROW], name="plain.jsonl")
    for tokenizer in (tools_tokenizer, chat_tokenizer):
        before = tokenizer.apply_chat_template(  # the call made before tools were read
            DAPO_ROW["prompt"], add_generation_prompt=True, tokenize=False
        )
        before_ids = tuple(tokenizer([before], add_special_tokens=False)["input_ids"][0])
        for tool_key in ("tools", None):
            (record,) = load_prompts(plain, fmt(tool_key=tool_key), tokenizer)[0]
            assert (record.prompt_ids, record.metadata) == (before_ids, {})
    rows = [DAPO_ROW, TOOL_ROW | {"tools": [WEATHER]}, DAPO_ROW | {"tools": None}]
    first, with_tools, null_tools = load_prompts(write_jsonl(rows), fmt(), tools_tokenizer)[0]
    assert first.prompt_ids == null_tools.prompt_ids
    assert "# Tools" not in text_of(first, tools_tokenizer)
    assert "# Tools" in text_of(with_tools, tools_tokenizer)
    assert null_tools.metadata == {}


def test_bad_tools_are_bad_lines_naming_the_key(write_jsonl, tools_tokenizer) -> None:
    rows = [
        TOOL_ROW | {"tools": 3},
        TOOL_ROW | {"tools": ["get_weather"]},
        TOOL_ROW | {"tools": "[{not json"},
        TOOL_ROW | {"tools": '{"type": "function"}'},
        TOOL_ROW | {"tools": [WEATHER], "metadata": {"tools": []}},
        TOOL_ROW | {"tools": [WEATHER], "metadata": {"tools": [WEATHER]}},  # the same: kept
    ]
    with pytest.raises(PromptDataError) as refused:
        load_prompts(write_jsonl(rows), fmt(), tools_tokenizer)
    issues = refused.value.issues
    assert [issue.location.line for issue in issues] == [1, 2, 3, 4, 5]
    assert all(issue.key == "tools" for issue in issues)
    messages = [issue.message for issue in issues]
    assert messages[0].startswith("holds a value of type int; tools must be a list of JSON")
    assert messages[1].startswith("holds a list with items of type str;")
    assert messages[2].startswith("is a string that is not JSON")
    assert messages[3].startswith("holds a value of type dict;")
    assert "differs from the line's metadata.tools" in messages[4]
    assert issues[4].fix == "remove 'tools' from metadata, or make it equal to the 'tools' field"
    assert issues[1].value == '["get_weather"]'
    assert "point data.tool_key at the field that holds them" in issues[0].fix


def test_tools_without_the_chat_template_are_refused(write_jsonl, tools_tokenizer) -> None:
    """Only the chat template writes tools into a prompt: sent as written, the prompt would
    never describe them; tool_key null keeps them out knowingly."""
    rows = [{"prompt": "Rain in Oslo?", "tools": [WEATHER]}, {"prompt": "Sun?", "tools": []}]
    path = write_jsonl(rows)
    as_written = fmt(apply_chat_template=False, label_key=None)
    with pytest.raises(PromptDataError) as refused:
        load_prompts(path, as_written, tools_tokenizer)
    (issue,) = refused.value.issues  # an empty list has nothing to lose
    assert (issue.key, issue.location.line) == ("tools", 1)
    assert "apply_chat_template is false" in issue.message
    assert issue.fix == (
        "set data.apply_chat_template: true, or data.tool_key: null to keep them out of the prompt"
    )
    keep_out = fmt(apply_chat_template=False, label_key=None, tool_key=None)
    records = load_prompts(path, keep_out, tools_tokenizer)[0]
    assert text_of(records[0], tools_tokenizer) == "Rain in Oslo?"
    assert all("tools" not in r.metadata for r in records)


def test_a_chat_template_that_ignores_tools_is_refused_once(write_jsonl, tiny_tokenizer) -> None:
    """transformers passes tools to every template and drops them silently in one that never
    reads them: the shipped tiny model's ChatML template is one."""
    rows = [DAPO_ROW, TOOL_ROW | {"tools": [WEATHER]}, TOOL_ROW | {"tools": [WEATHER]}]
    path = write_jsonl(rows)
    with pytest.raises(PromptDataError) as refused:
        load_prompts(path, fmt(), tiny_tokenizer)
    (issue,) = refused.value.issues
    assert issue.key == "model.hf_checkpoint"
    assert issue.value == str(tiny_tokenizer.name_or_path)
    assert issue.location.line == 2
    assert "the chat template does not render tools" in issue.message
    assert issue.fix == (
        "use a tokenizer whose chat template renders tools, pass one as "
        "data.apply_chat_template_kwargs.chat_template, or set data.tool_key: null to keep "
        "the tools out of the prompt"
    )
    without = load_prompts(path, fmt(tool_key=None), tiny_tokenizer)[0]
    assert without[1].prompt_ids == without[2].prompt_ids
    assert all("tools" not in r.metadata for r in without)
    only_empty = write_jsonl([TOOL_ROW | {"tools": []}], name="empty.jsonl")
    assert load_prompts(only_empty, fmt(), tiny_tokenizer)[0][0].metadata == {"tools": []}


def test_a_chat_template_passed_as_an_argument_can_render_the_tools(
    write_jsonl, tiny_tokenizer, tools_tokenizer
) -> None:
    path = write_jsonl([TOOL_ROW | {"tools": [WEATHER]}])
    template = {"chat_template": tools_tokenizer.chat_template}
    (record,) = load_prompts(path, fmt(chat_template_kwargs=template), tiny_tokenizer)[0]
    assert "# Tools" in text_of(record, tiny_tokenizer)


def test_another_tool_key_reads_another_field(write_jsonl, tools_tokenizer) -> None:
    path = write_jsonl([TOOL_ROW | {"functions": [WEATHER], "tools": "ignored"}])
    (record,) = load_prompts(path, fmt(tool_key="functions"), tools_tokenizer)[0]
    assert record.metadata == {"tools": [WEATHER]}
    assert '"get_weather"' in text_of(record, tools_tokenizer)


TOOL = {"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}
BAD_LINES = {
    "not JSON": "{prompt: 1",
    "a JSON list": '["prompt", "label"]',
    "no prompt": {"question": "1+1?", "label": "2"},
    "an empty prompt": {"prompt": " ", "label": "2"},
    "a message without a role": {"prompt": [{"content": "1+1?"}], "label": "2"},
    "no label": {"prompt": "1+1?"},
    "a label that is a list": {"prompt": "1+1?", "label": ["2"]},
    "a label that is a boolean": {"prompt": "1+1?", "label": True},
    "metadata that is a string": {"prompt": "1+1?", "label": "2", "metadata": "math"},
    "tools that are a string, not JSON": {"prompt": "1+1?", "label": "2", "tools": "calc"},
    "tools that are an object": {"prompt": "1+1?", "label": "2", "tools": TOOL},
    "tools unlike the metadata's": {
        "prompt": "1+1?",
        "label": "2",
        "tools": [TOOL],
        "metadata": {"tools": []},
    },
}


@pytest.mark.parametrize("template", [True, False], ids=["template", "as written"])
def test_validation_refuses_every_line_the_loader_refuses(
    template: bool, write_jsonl, chat_tokenizer, tmp_path: Path
) -> None:
    """`rlpost validate` reads a prompt file as the loader does (one `read_row`), so no line
    the run would refuse passes validation; without a template, message lists and tools too."""
    from rlpost.config.chat_templates import template_markers
    from rlpost.preflight.data_files import RowRules, check_prompt_file

    lines = dict(BAD_LINES)
    if not template:
        lines["a message list"] = DAPO_ROW
        lines["tools"] = {"prompt": "1+1?", "label": "2", "tools": [TOOL]}
    else:  # the template's own markers, found by validation in the checkpoint's files
        lines["a prompt rendered already"] = {
            "prompt": "<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n",
            "label": "2",
        }
    folder = tmp_path / "tokenizer"
    chat_tokenizer.save_pretrained(folder)
    markers = template_markers(folder)
    assert set(markers) == {"<|im_start|>", "<|im_end|>"}
    good = {"prompt": "what is 2 times 3?", "label": "6"}
    form = fmt(apply_chat_template=template)
    for name, line in lines.items():
        path = tmp_path / f"{name}.jsonl"
        rows = [json.dumps(good), line if isinstance(line, str) else json.dumps(line)]
        path.write_text("\n".join(rows) + "\n")
        rules = RowRules(form, labelled=True, markers=markers)
        issues = check_prompt_file("recipe.data.prompt_data", str(path), rules)
        assert [issue.key for issue in issues] == [f"{path}:2"], (name, [str(i) for i in issues])
        with pytest.raises(PromptDataError) as raised:
            load_prompts(path, form, chat_tokenizer)
        where = [(i.location.file, i.location.line) for i in raised.value.issues if i.location]
        assert where == [(str(path), 2)], name


def test_validation_names_a_template_argument_no_chat_template_reads(tmp_path: Path) -> None:
    """Jinja drops a variable a template never reads: validation reads the checkpoint's chat
    templates (the default one, or the one `chat_template` names, or gives) and refuses an
    argument none of them would read; a template it cannot parse is not judged."""
    from rlpost.config.chat_templates import chat_templates
    from rlpost.preflight.tokens import check_template_kwargs
    from rlpost.schema import ModelConfig

    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {"chat_template": [
                {"name": "default", "template": "{{ messages[0]['content'] }}"},
                {"name": "tool_use", "template": "{% if verbose %}{{ tools }}{% endif %}"},
            ]}
        )
    )  # fmt: skip
    assert set(chat_templates(folder)) == {"default", "tool_use"}
    model = ModelConfig.model_validate({**yaml_of("qwen3-tiny"), "hf_checkpoint": str(folder)})
    (refused,) = check_template_kwargs({"verbose": True}, model)
    assert refused.key == "recipe.data.apply_chat_template_kwargs.verbose"
    assert "never reads 'verbose'" in refused.message and "(it reads messages)" in refused.message
    assert check_template_kwargs({"verbose": True, "chat_template": "tool_use"}, model) == []
    given = {"chat_template": "{{ mode }}", "mode": "x", "verbose": True}
    assert [i.key.rsplit(".", 1)[1] for i in check_template_kwargs(given, model)] == ["verbose"]
    assert check_template_kwargs({"x": 1, "chat_template": "{% generation %}"}, model) == []


def yaml_of(model: str) -> dict:
    import yaml

    root = Path(__file__).resolve().parents[3]
    return yaml.safe_load((root / "rlpost" / "conf" / "model" / f"{model}.yaml").read_text())


def test_a_key_no_line_has_is_one_problem_of_the_setting_that_names_it(tmp_path: Path) -> None:
    """A data key every line lacks is the setting's mistake, said once with the keys the
    lines do have; a key some lines lack stays a problem of those lines."""
    from rlpost.config.loader import compose_run_config
    from rlpost.plan import build_plan
    from rlpost.preflight.data_files import check_data

    def issues(*overrides: str) -> list:
        cfg = compose_run_config(list(overrides))[0]
        return check_data(cfg, build_plan(cfg))

    wrong = issues("recipe.data.input_key=question")
    assert [(i.key, i.value) for i in wrong] == [("recipe.data.input_key", "question")] * 2
    assert "has the key 'question' (keys there: label, prompt)" in wrong[0].message
    assert "recipe.data.input_key to the key that holds the prompt" in wrong[0].fix
    labels = issues("recipe.data.label_key=answer")
    assert {i.key for i in labels} == {"recipe.data.label_key"}
    assert issues("recipe.data.input_key=prompt") == []  # the key the fix names
    some = tmp_path / "some.jsonl"
    some.write_text('{"prompt": "1+1?", "label": "2"}\n{"question": "1+1?", "label": "2"}\n')
    partly = issues(f"recipe.data.prompt_data={some}", "recipe.eval.interval=null")
    assert [i.key for i in partly] == [f"{some}:2"]


def test_an_unlabelled_set_scored_without_a_label_is_told_it_may_read_none(
    tmp_path: Path, hook_modules: Path
) -> None:
    """An evaluation set whose lines have no label field, scored by a function: the refusal
    of the label key it inherits names label_key: false, and with it the lines pass; a set
    graded against the label is not told so."""
    from rlpost.config.loader import compose_run_config
    from rlpost.plan import build_plan
    from rlpost.preflight.data_files import check_data

    free = tmp_path / "free.jsonl"
    free.write_text('{"prompt": "Say 1."}\n{"prompt": "Say 2."}\n')

    def issues(label_key: str = "", function: str = "rlpost_test_hooks.length_reward") -> list:
        own = f", label_key: {label_key}" if label_key else ""
        scored = f", custom_reward_function: {function}" if function else ""
        cfg = compose_run_config(
            ["mode=eval", f"recipe.eval.datasets=[{{name: free, path: {free}{own}{scored}}}]"]
        )[0]
        return check_data(cfg, build_plan(cfg))

    [inherited] = issues()
    assert inherited.key == "recipe.data.label_key"
    assert "or set recipe.eval.datasets.0.label_key: false (its scorer reads no label)" in (
        inherited.fix
    )
    assert issues("false") == []
    [graded] = issues(function="")  # math, against the label
    assert graded.key == "recipe.data.label_key" and "false" not in graded.fix


def test_a_set_that_reads_no_tools_renders_its_lines_without_them(
    tmp_path: Path, tools_tokenizer
) -> None:
    """An evaluation set's tool_key: false (slime's eval config's tool_key: null) reads no
    tools whatever the data's tool_key, as label_key: false reads no label: its lines' tools
    are neither refused without the chat template nor rendered into the prompt."""
    from rlpost.config.loader import compose_run_config
    from rlpost.data.source import load_eval_groups
    from rlpost.plan import build_plan
    from rlpost.preflight.data_files import check_data

    lines = tmp_path / "agent.jsonl"
    lines.write_text(json.dumps({"prompt": "Rain in Oslo?", "label": "no", "tools": [WEATHER]}))

    def config(tool_key: str) -> object:
        own = f", tool_key: {tool_key}" if tool_key else ""
        return compose_run_config(
            ["mode=eval", "recipe.data.apply_chat_template=false",
             f"recipe.eval.datasets=[{{name: agent, path: {lines}{own}}}]"]
        )[0]  # fmt: skip

    inherited = config("")
    [refused] = check_data(inherited, build_plan(inherited))  # type: ignore[arg-type]
    assert "apply_chat_template is false" in refused.message
    none = config("false")
    assert check_data(none, build_plan(none)) == []  # type: ignore[arg-type]
    dataset = none.recipe.eval.datasets[0]  # type: ignore[attr-defined]
    [group] = load_eval_groups(
        dataset.path, none.recipe.data, tools_tokenizer, n_samples_per_prompt=1,  # type: ignore[attr-defined]
        input_key=dataset.input_key, label_key=dataset.label_key, tool_key=dataset.tool_key,
    )  # fmt: skip
    assert "tools" not in group[0].metadata and group[0].prompt == "Rain in Oslo?"


def test_parquet_columns_of_json_text_read_as_the_objects_they_hold(
    tmp_path: Path, chat_tokenizer
) -> None:
    """A parquet file whose messages, metadata and reward_model columns hold JSON text (as
    an export that json.dumps its objects writes them): each row reads as the file of
    objects reads; a string prompt that is not a JSON list of messages stays its text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    messages = [{"role": "user", "content": "Problem 3: what is 3 times 4?"}]
    rows = [
        {
            "prompt": messages,
            "metadata": {"rm_type": "math"},
            "reward_model": {"ground_truth": "12"},
        },
        {
            "prompt": "[3, 4]: their product?",
            "metadata": {},
            "reward_model": {"ground_truth": "12"},
        },
        {  # JSON of objects that are not messages: a prompt's own text
            "prompt": '[{"a": 3}, {"b": 4}]: multiply a by b',
            "metadata": {},
            "reward_model": {"ground_truth": "12"},
        },
    ]
    as_text = [
        {key: value if isinstance(value, str) else json.dumps(value) for key, value in row.items()}
        for row in rows
    ]
    paths = {}
    for name, table in (("objects", rows[:1]), ("text", as_text)):  # (a column: one type)
        paths[name] = tmp_path / f"{name}.parquet"
        pq.write_table(pa.Table.from_pylist(table), paths[name])
    assert pq.read_schema(paths["text"]).types == [pa.string()] * 3
    form = fmt(label_key="reward_model.ground_truth")
    objects, _ = load_prompts(paths["objects"], form, chat_tokenizer)
    text, _ = load_prompts(paths["text"], form, chat_tokenizer)
    assert [r.prompt for r in text] == [messages, *(row["prompt"] for row in rows[1:])]
    assert [r.metadata for r in text] == [{"rm_type": "math"}, {}, {}]
    assert [r.label for r in text] == ["12", "12", "12"]
    assert text[0].prompt_ids == objects[0].prompt_ids
    expected = "<|im_start|>user\nProblem 3: what is 3 times 4?<|im_end|>\n<|im_start|>assistant\n"
    assert chat_tokenizer.decode(list(text[0].prompt_ids)) == expected
