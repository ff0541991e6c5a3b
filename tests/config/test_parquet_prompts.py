"""`rlpost validate` on the CPU default with parquet prompt files and slime's row slices,
written on the command line as slime writes them (`recipe.data.prompt_data=x.parquet@[0:8]`):
what reads is taken, what slime would refuse (or the run would fail on) exits 2, naming the
key and the fix, with no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlpost.cli.main import main

ASSETS = Path(__file__).resolve().parents[2] / "rlpost" / "assets" / "data"


@pytest.fixture(scope="module")
def parquet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The shipped arithmetic sets as parquet files, and a copy of training's with the label
    nested as verl nests it (reward_model.ground_truth)."""
    folder = tmp_path_factory.mktemp("parquet")
    files = {}
    for name in ("arith_train", "arith_eval"):
        rows = [json.loads(line) for line in (ASSETS / f"{name}.jsonl").read_text().splitlines()]
        files[name] = folder / f"{name}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), files[name], row_group_size=100)
    nested = [{"prompt": row["prompt"], "reward_model": {"ground_truth": row["label"]}} for row in (
        json.loads(line) for line in (ASSETS / "arith_train.jsonl").read_text().splitlines()
    )]  # fmt: skip
    files["verl"] = folder / "verl.parquet"
    pq.write_table(pa.Table.from_pylist(nested), files["verl"])
    return files


def validate(capsys: pytest.CaptureFixture[str], *overrides: str) -> tuple[int, str]:
    """(exit code, what was printed) of `rlpost validate` on the CPU default."""
    try:
        main(["validate", *overrides])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.mark.parametrize(
    "overrides",
    [
        ("recipe.data.prompt_data={arith_train}",),
        ("recipe.data.prompt_data={arith_train}@[0:64]",),
        ("recipe.data.prompt_data={arith_train}@[-64:]",),
        ("recipe.data.prompt_data={arith_train}@[:]",),
        ("recipe.eval.datasets.0.path={arith_eval}@[-32:]",),
        (
            "recipe.data.prompt_data={verl}",
            "recipe.data.label_key=reward_model.ground_truth",
            "recipe.eval.datasets.0.label_key=label",  # the shipped set's label is top-level
        ),
    ],
    ids=["parquet", "first rows", "last rows", "empty bounds", "eval set", "nested label"],
)
def test_parquet_prompts_validate(
    parquet: dict[str, Path], capsys: pytest.CaptureFixture[str], overrides: tuple[str, ...]
) -> None:
    code, printed = validate(capsys, *(o.format(**parquet) for o in overrides))
    assert code == 0, printed
    assert "optimizer step(s) each" in printed


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("recipe.data.prompt_data={folder}/train.json", "has the suffix '.json'; prompt files"),
        ("recipe.data.prompt_data={arith_train}@[a:b]", "the row slice @[a:b] is not START:END"),
        ("recipe.data.prompt_data={arith_train}@[9:3]", "the row slice @[9:3] selects no row"),
        ("recipe.data.prompt_data={arith_train}@[900:]", "selects none of the file's 833 rows"),
        ("recipe.eval.datasets.0.path={folder}/eval.csv", "has the suffix '.csv'"),
        ("recipe.data.prompt_data={verl}", "no row of {verl} has the key 'label'"),
        ("recipe.data.prompt_data={folder}/gone.parquet@[0:3]", "no such file on this machine"),
    ],
)
def test_a_prompt_path_that_cannot_be_read_is_refused(
    parquet: dict[str, Path], capsys: pytest.CaptureFixture[str], override: str, says: str
) -> None:
    names = {**parquet, "folder": parquet["verl"].parent}
    key = override.split("=", 1)[0]
    code, printed = validate(capsys, override.format(**names))
    assert code == 2, printed
    assert "Traceback" not in printed
    assert says.format(**names) in printed
    assert key in printed and "fix:" in printed


def test_a_parquet_row_without_the_input_key_is_named_by_its_row(
    parquet: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rows = pq.read_table(parquet["arith_train"]).to_pylist()[:4]
    rows[2] = {"prompt": None, "label": "3"}
    path = tmp_path / "holed.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    code, printed = validate(capsys, f"recipe.data.prompt_data={path}")
    assert code == 2, printed
    assert "Traceback" not in printed
    assert f"{path}, row 3" in printed
    assert "'prompt' is of type NoneType, not a prompt" in printed


def test_a_parquet_row_whose_content_is_refused_is_called_a_row(
    parquet: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The checks of a row read whole (its rm_type, its label) speak of rows in a parquet
    file, as its location does, where jsonl's speak of lines."""
    rows = pq.read_table(parquet["arith_train"]).to_pylist()[:4]
    # (pyarrow takes the columns from the first row: every row names its rm_type)
    rows = [{**row, "metadata": {"rm_type": "math"}} for row in rows]
    rows[1]["metadata"] = {"rm_type": "remote"}
    path = tmp_path / "remote.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    code, printed = validate(capsys, f"recipe.data.prompt_data={path}")
    assert code == 2 and "Traceback" not in printed, printed
    assert f"{path}, row 2" in printed
    assert "the rows' own rm_type still grade theirs), or give the row a rule-based" in printed
    assert "line" not in printed.split(f"{path}, row 2", 1)[1]


def test_parquet_columns_of_json_text_validate_and_bad_text_is_named_by_its_row(
    parquet: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Messages and metadata written as JSON text are read as what they hold; a metadata
    string that holds no JSON object is refused, naming its row, the key and why; and a
    message list, decoded, needs the chat template as one stored as a list does."""
    rows = pq.read_table(parquet["arith_train"]).to_pylist()[:4]
    rows = [
        {"prompt": json.dumps(r["prompt"]), "label": r["label"], "metadata": '{"rm_type": "math"}'}
        for r in rows
    ]
    path = tmp_path / "text.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    code, printed = validate(capsys, f"recipe.data.prompt_data={path}")
    assert code == 0, printed
    code, printed = validate(
        capsys, f"recipe.data.prompt_data={path}", "recipe.data.apply_chat_template=false"
    )
    assert code == 2 and "Traceback" not in printed, printed
    assert f"{path}, row 1" in printed and "is a message list, which needs the chat" in printed
    rows[2]["metadata"] = "rm_type=math"
    pq.write_table(pa.Table.from_pylist(rows), path)
    code, printed = validate(capsys, f"recipe.data.prompt_data={path}")
    assert code == 2 and "Traceback" not in printed, printed
    assert f"{path}, row 3" in printed
    assert "'metadata' is a string that is not JSON (Expecting value, column 1)" in printed
    assert "fix: store metadata as an object, or a string of one" in printed
