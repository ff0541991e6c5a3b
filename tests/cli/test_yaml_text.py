"""The YAML the commands write reads back (with PyYAML's YAML 1.1 rules) as what was written."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from rlpost.cli.yaml_text import block_lines, float_text, keyed_block_lines, scalar_text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1e-6, "1.0e-6"),
        (2.5e-7, "2.5e-7"),
        (1e21, "1.0e+21"),
        (1000000.0, "1000000"),
        (0.5, "0.5"),
        (1.0, "1.0"),
        (40.0, "40.0"),
    ],
)
def test_floats_read_back_as_floats(value: float, text: str) -> None:
    assert float_text(value) == text
    assert yaml.safe_load(f"x: {text}")["x"] == value


@pytest.mark.parametrize(
    "value",
    [
        "yes",
        "1.0",
        "null",
        "a: b",
        "${.hf_checkpoint}",
        "- x",
        "plain text",
        "",
        True,
        None,
        3,
        [1, "two", 3.5e-6],
        {},
    ],
)
def test_scalars_read_back_unchanged(value: Any) -> None:
    assert yaml.safe_load(f"x: {scalar_text(value)}")["x"] == value


def test_blocks_keep_order_and_nest_lists_of_mappings() -> None:
    data = {"b": 1, "a": {"z": [1, 2], "items": [{"name": "x", "n": 1}, {"name": "y"}]}}
    text = "\n".join(block_lines(data))
    assert text.splitlines()[:2] == ["b: 1", "a:"]
    assert yaml.safe_load(text) == data
    paths = [path for _, path in keyed_block_lines(data, "top")]
    assert paths == [
        "top.b",
        None,
        "top.a.z",
        None,
        "top.a.items.0.name",
        "top.a.items.0.n",
        "top.a.items.1.name",
    ]
