"""An export folder gets the base folder's side files and appears whole or not at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlpost.backends.hf_folder import copy_side_files, publish_folder

BASE_FILES = {
    "config.json": "{}",
    "model.safetensors": "weights",
    "model-00001-of-00002.safetensors": "weights",
    "model.safetensors.index.json": "{}",
    "pytorch_model.bin": "weights",
    "tokenizer.json": "tok",
    "tokenizer_config.json": "{}",
    "chat_template.jinja": "{{ messages }}",
    "generation_config.json": "{}",
}


def make_base(folder: Path) -> Path:
    folder.mkdir()
    for name, text in BASE_FILES.items():
        (folder / name).write_text(text)
    (folder / "subdir").mkdir()
    return folder


def test_side_files_are_copied_and_weights_are_not(tmp_path: Path) -> None:
    base = make_base(tmp_path / "base")
    out = tmp_path / "out"
    out.mkdir()
    copy_side_files(base, out)
    copied = {p.name for p in out.iterdir()}
    expected = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}
    assert copied == expected | {"generation_config.json"}


def test_publish_replaces_an_existing_folder(tmp_path: Path) -> None:
    out = tmp_path / "export"
    publish_folder(out, lambda staging: (staging / "a.txt").write_text("1"))
    publish_folder(out, lambda staging: (staging / "b.txt").write_text("2"))
    assert [p.name for p in tmp_path.iterdir()] == ["export"]  # no staging or retired folder
    assert [p.name for p in out.iterdir()] == ["b.txt"]


def test_failed_fill_leaves_the_old_folder(tmp_path: Path) -> None:
    out = tmp_path / "export"
    publish_folder(out, lambda staging: (staging / "a.txt").write_text("1"))

    def broken(staging: Path) -> None:
        (staging / "half.txt").write_text("x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        publish_folder(out, broken)
    assert [p.name for p in tmp_path.iterdir()] == ["export"]
    assert (out / "a.txt").read_text() == "1"


def test_staging_left_by_a_killed_export_is_removed(tmp_path: Path) -> None:
    for leftover in (".export.k1ll3d", ".export.old-4242"):  # staging, retired folder
        (tmp_path / leftover).mkdir()
        (tmp_path / leftover / "half.txt").write_text("x")
    (tmp_path / ".other.k1ll3d").mkdir()  # another export's: not ours to remove
    publish_folder(tmp_path / "export", lambda staging: (staging / "a.txt").write_text("1"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.k1ll3d", "export"]
