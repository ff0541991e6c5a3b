"""Prompt files as slime reads them: jsonl or parquet, and the `@[start:end]` row slice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlpost.data import PromptDataError, PromptFormat, load_prompts
from rlpost.data.files import UnreadableFile, prompt_rows
from rlpost.data.prompts import holds_json_messages
from rlpost.preflight.data_files import RowRules, check_prompt_file
from rlpost.schema.base import InvariantError
from rlpost.schema.prompt_file import check_prompt_path, split_prompt_path

ROWS = [{"prompt": f"what is {i} plus 1?", "label": str(i + 1)} for i in range(10)]
# verl's preprocessed layout: a message list, the answer nested under reward_model
VERL_ROW = {
    "data_source": "openai/gsm8k",
    "prompt": [{"role": "user", "content": "what is 2 times 3?"}],
    "ability": "math",
    "reward_model": {"ground_truth": "6", "style": "rule"},
    "extra_info": {"index": 0, "split": "train"},
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


def write_parquet(path: Path, rows: list[dict[str, Any]], row_group_size: int = 3) -> Path:
    """Small row groups, so a file is read over several batches."""
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return path


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    jsonl = tmp_path / "rows.jsonl"
    lines = [json.dumps(row) for row in ROWS]
    jsonl.write_text("\n".join([*lines[:4], "", *lines[4:]]) + "\n")  # a blank line 5
    return {"jsonl": jsonl, "parquet": write_parquet(tmp_path / "rows.parquet", ROWS)}


def labels(path: str) -> list[int]:
    rows = [raw if isinstance(raw, dict) else json.loads(raw) for _, raw in prompt_rows(path)]
    return [int(row["label"]) - 1 for row in rows]


def test_a_path_splits_into_the_file_and_its_rows() -> None:
    assert split_prompt_path("/d/a.jsonl").rows is None
    assert split_prompt_path("/d/a.jsonl@[3:7]").rows == slice(3, 7)
    assert split_prompt_path("/d/a.parquet@[-100:]").rows == slice(-100, None)
    assert split_prompt_path("/d/a.parquet@[:-2]").rows == slice(None, -2)
    assert split_prompt_path("/d/a.parquet@[:]").rows == slice(None, None)
    assert split_prompt_path("/d/a.parquet@[:-2]").path == "/d/a.parquet"
    assert split_prompt_path("/d/a.parquet@[:-2]").slice_text == "@[:-2]"


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ("", list(range(10))),
        ("@[0:3]", [0, 1, 2]),
        ("@[3:]", [3, 4, 5, 6, 7, 8, 9]),
        ("@[:4]", [0, 1, 2, 3]),
        ("@[:]", list(range(10))),
        ("@[-3:]", [7, 8, 9]),
        ("@[:-2]", [0, 1, 2, 3, 4, 5, 6, 7]),
        ("@[-5:-2]", [5, 6, 7]),
        ("@[1:-1]", [1, 2, 3, 4, 5, 6, 7, 8]),
        ("@[-100:2]", [0, 1]),
        ("@[8:100]", [8, 9]),
    ],
)
def test_the_slice_selects_rows_as_python_slices_them(
    files: dict[str, Path], kind: str, rows: str, expected: list[int]
) -> None:
    assert labels(f"{files[kind]}{rows}") == expected


def test_numbers_are_the_jsonl_line_and_the_parquet_row(files: dict[str, Path]) -> None:
    assert [n for n, _ in prompt_rows(f"{files['jsonl']}@[3:6]")] == [4, 6, 7]  # 5 is blank
    assert [n for n, _ in prompt_rows(f"{files['parquet']}@[-2:]")] == [9, 10]


def test_parquet_prompts_load_as_jsonl_prompts_do(files: dict[str, Path], chat_tokenizer) -> None:
    from_jsonl, _ = load_prompts(files["jsonl"], fmt(), chat_tokenizer)
    from_parquet, _ = load_prompts(files["parquet"], fmt(), chat_tokenizer)
    assert [r.prompt_ids for r in from_parquet] == [r.prompt_ids for r in from_jsonl]
    assert [r.label for r in from_parquet] == [str(i + 1) for i in range(10)]
    sliced, _ = load_prompts(f"{files['parquet']}@[-3:]", fmt(), chat_tokenizer)
    assert [r.line for r in sliced] == [8, 9, 10]
    assert [r.label for r in sliced] == ["8", "9", "10"]


def test_a_dotted_label_key_reads_verl_nested_answer(tmp_path: Path, chat_tokenizer) -> None:
    path = write_parquet(tmp_path / "verl.parquet", [VERL_ROW])
    (record,) = load_prompts(path, fmt(label_key="reward_model.ground_truth"), chat_tokenizer)[0]
    assert record.label == "6"
    assert record.prompt == VERL_ROW["prompt"]


def test_a_dotted_key_reads_into_a_parquet_map_column_as_into_a_struct(
    tmp_path: Path, chat_tokenizer
) -> None:
    # Spark and pandas-on-Spark write a dict column as a parquet map, not a struct
    maps = pa.map_(pa.string(), pa.string())
    table = pa.table(
        {
            "extra": pa.array([[("question", "what is 2 times 3?")]], type=maps),
            "reward_model": pa.array([[("ground_truth", "6")]], type=maps),
        }
    )
    pq.write_table(table, tmp_path / "map.parquet")
    keys = fmt(input_key="extra.question", label_key="reward_model.ground_truth")
    (record,) = load_prompts(tmp_path / "map.parquet", keys, chat_tokenizer)[0]
    assert (record.prompt, record.label) == ("what is 2 times 3?", "6")
    rules = RowRules(keys, labelled=True)
    assert check_prompt_file("recipe.data.prompt_data", str(tmp_path / "map.parquet"), rules) == []


def test_a_parquet_map_with_a_key_twice_is_unreadable_naming_the_key(tmp_path: Path) -> None:
    maps = pa.map_(pa.string(), pa.string())
    table = pa.table({"extra": pa.array([[("question", "a"), ("question", "b")]], type=maps)})
    pq.write_table(table, tmp_path / "twice.parquet")
    with pytest.raises(UnreadableFile, match=r"a map column holds a key twice.*'question'"):
        list(prompt_rows(str(tmp_path / "twice.parquet")))


def test_a_top_level_key_with_dots_wins_over_the_nested_path(write_jsonl, chat_tokenizer) -> None:
    row = {"prompt": "1+1?", "a.b": "top", "a": {"b": "nested"}}
    (record,) = load_prompts(write_jsonl([row]), fmt(label_key="a.b"), chat_tokenizer)[0]
    assert record.label == "top"


def test_a_missing_key_in_a_parquet_row_names_the_row_and_the_nested_keys(
    tmp_path: Path, chat_tokenizer
) -> None:
    path = write_parquet(tmp_path / "verl.parquet", [VERL_ROW] * 12)
    with pytest.raises(PromptDataError) as raised:
        load_prompts(path, fmt(label_key="ground_truth"), chat_tokenizer)
    first = raised.value.issues[0]
    assert str(first.location) == f"{path}, row 1"
    assert "this row's keys: ability, data_source, extra_info, extra_info.index" in first.message
    assert "reward_model.ground_truth" in first.message
    assert "a dotted key reads a nested one" in first.fix
    assert raised.value.issues[-1].message == "2 more bad rows not shown"


def test_preflight_reads_a_parquet_file_as_the_loader_does(tmp_path: Path) -> None:
    bad = {**VERL_ROW, "reward_model": {"ground_truth": "", "style": "rule"}}
    path = write_parquet(tmp_path / "verl.parquet", [VERL_ROW, bad, VERL_ROW])
    rules = RowRules(fmt(label_key="reward_model.ground_truth"), labelled=True)
    (issue,) = check_prompt_file("recipe.data.prompt_data", str(path), rules)
    assert issue.key == f"{path}, row 2"
    assert "empty 'reward_model.ground_truth'" in issue.message
    assert check_prompt_file("recipe.data.prompt_data", f"{path}@[2:]", rules) == []


def test_preflight_names_the_key_no_parquet_row_has_with_the_nested_ones(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "verl.parquet", [VERL_ROW])
    rules = RowRules(
        fmt(label_key="answer"),
        labelled=True,
        key_settings=(("prompt", "recipe.data.input_key"), ("answer", "recipe.data.label_key")),
    )
    (issue,) = check_prompt_file("recipe.data.prompt_data", str(path), rules)
    assert issue.key == "recipe.data.label_key"
    assert f"no row of {path} has the key 'answer'" in issue.message
    assert "reward_model.ground_truth" in issue.fix


def test_preflight_refuses_a_slice_past_the_file_naming_its_rows(files: dict[str, Path]) -> None:
    rules = RowRules(fmt(), labelled=True)
    for kind in ("jsonl", "parquet"):
        (issue,) = check_prompt_file("recipe.data.prompt_data", f"{files[kind]}@[20:30]", rules)
        assert issue.key == "recipe.data.prompt_data"
        assert "the row slice @[20:30] selects none of the file's 10" in issue.message
    (missing,) = check_prompt_file("k", f"{files['jsonl']}.gone.jsonl@[0:3]", rules)
    assert missing.message == "no such file on this machine"


def test_preflight_tells_an_empty_files_owner_to_fill_it_not_to_find_it(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("\n")
    rules = RowRules(fmt(), labelled=True)
    (issue,) = check_prompt_file("recipe.data.prompt_data", str(tmp_path / "empty.jsonl"), rules)
    assert issue.message == "the file holds no prompts"
    assert issue.fix == (
        "write one JSON object per line into it, or point recipe.data.prompt_data at another file"
    )


def test_a_file_that_is_not_parquet_is_refused_with_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "fake.parquet"
    path.write_text('{"prompt": "1+1?"}\n')
    with pytest.raises(UnreadableFile, match="is not a parquet file"):
        list(prompt_rows(str(path)))
    (issue,) = check_prompt_file("recipe.data.prompt_data", str(path), RowRules(fmt(), True))
    assert "is not a parquet file" in issue.message


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/d/train.json", "has the suffix '.json'; prompt files are read as jsonl"),
        ("/d/train", "has no suffix"),
        ("/d/train.csv@[0:10]", "has the suffix '.csv'"),
        ("/d/train.jsonl@[a:b]", "the row slice @[a:b] is not START:END"),
        ("/d/train.jsonl@[0:10:2]", "the row slice @[0:10:2] is not START:END"),
        ("/d/train.jsonl@[5]", "the row slice @[5] is not START:END"),
        ("/d/train.jsonl@[5:5]", "the row slice @[5:5] selects no row"),
        ("/d/train.jsonl@[:0]", "the row slice @[:0] selects no row"),
        ("/d/train.jsonl@[-2:-5]", "the row slice @[-2:-5] selects no row"),
    ],
)
def test_a_path_slime_would_refuse_is_refused(path: str, says: str) -> None:
    with pytest.raises(InvariantError) as raised:
        check_prompt_path(path)
    assert says in raised.value.message


def test_a_folder_is_refused_saying_how_hf_datasets_saved_one_converts() -> None:
    with pytest.raises(InvariantError) as raised:
        check_prompt_path("/d/gsm8k_train")
    assert "has no suffix (a folder, or a file named without one)" in raised.value.message
    assert "datasets.load_from_disk(FOLDER).to_parquet('train.parquet')" in raised.value.fix
    with pytest.raises(InvariantError) as csv:
        check_prompt_path("/d/train.csv")
    assert "load_from_disk" not in csv.value.fix


@pytest.mark.parametrize(
    "path", ["/d/a.jsonl", "/d/a.parquet@[0:1000]", "/d/a.jsonl@[-100:]", "/d/a.parquet@[-5:3]"]
)
def test_a_path_slime_reads_is_taken(path: str) -> None:
    assert check_prompt_path(path) == path


def test_a_rows_data_source_is_kept_in_its_metadata(
    tmp_path: Path, write_jsonl, chat_tokenizer
) -> None:
    """verl's data_source column (the name a verl-shaped reward function is given) is kept
    in the metadata, beside verl's extra_info read as it (data.metadata_key=extra_info); a
    metadata of the row's own data_source keeps it, and a row without the column has none."""
    path = write_parquet(tmp_path / "verl.parquet", [VERL_ROW])
    verl = fmt(label_key="reward_model.ground_truth", metadata_key="extra_info")
    (record,) = load_prompts(path, verl, chat_tokenizer)[0]
    assert record.metadata == {"index": 0, "split": "train", "data_source": "openai/gsm8k"}
    own = {**VERL_ROW, "extra_info": {"data_source": "mine"}}
    (record,) = load_prompts(write_parquet(tmp_path / "own.parquet", [own]), verl, chat_tokenizer)[
        0
    ]
    assert record.metadata == {"data_source": "mine"}
    (record,) = load_prompts(write_jsonl(ROWS[:1]), fmt(), chat_tokenizer)[0]
    assert record.metadata == {}


def test_a_missing_key_names_the_keys_inside_a_string_of_a_json_object(
    write_jsonl, chat_tokenizer
) -> None:
    """A dotted key reads into a string holding a JSON object (verl's reward_model column
    written as text), so the keys a missing one is chosen from name what is inside it too."""
    row = {"prompt": "1+1?", "reward_model": json.dumps({"ground_truth": "2", "style": "rule"})}
    (record,) = load_prompts(write_jsonl([row]), fmt(label_key="reward_model.ground_truth"),
                             chat_tokenizer)[0]  # fmt: skip
    assert record.label == "2"
    with pytest.raises(PromptDataError) as raised:
        load_prompts(write_jsonl([row]), fmt(label_key="ground_truth"), chat_tokenizer)
    (issue,) = raised.value.issues
    assert (
        "this line's keys: prompt, reward_model, reward_model.ground_truth, reward_model.style"
    ) in issue.message
    assert "a dotted key reads a nested one, e.g. reward_model.ground_truth" in issue.fix


AS_TEXT = json.dumps({"q": json.dumps([{"role": "user", "content": "1+1?"}])})


@pytest.mark.parametrize(
    "line",
    [
        AS_TEXT,
        AS_TEXT.replace('\\"', "\\u0022"),  # from a writer that escapes quotes as \u0022
        json.dumps({"n": 1, "q": json.dumps([{"role": "user", "content": "1+1?"}])}),
    ],
)
def test_a_message_list_as_json_text_is_found_however_its_quotes_are_escaped(line: str) -> None:
    assert holds_json_messages(line, "q")
    assert holds_json_messages(json.loads(line), "q")


def test_message_lists_stored_as_lists_or_other_json_text_are_not_json_messages() -> None:
    messages = [{"role": "user", "content": "1+1?"}]
    for row in ({"q": messages}, {"q": "[1, 2]"}, {"q": json.dumps([{"a": "role"}])}, {"p": "x"}):
        assert not holds_json_messages(json.dumps(row), "q"), row
        assert not holds_json_messages(row, "q"), row
    assert not holds_json_messages('{"q": "\\"role\\"" broken', "q")
