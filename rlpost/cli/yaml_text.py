"""YAML text written the way the shipped configs are: block mappings, one key per line.

PyYAML's dumper sorts or reflows keys and writes `1e-06` (which YAML 1.1 reads back as a
string); these helpers keep the caller's key order and write floats that read back as floats.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

INDENT = "  "


WHOLE_AS_INT = 1000.0


def float_text(value: float) -> str:
    """'1000000' for large whole floats (RoPE bases), '1.0e-6' (not '1e-06', which YAML 1.1
    reads as a string) and '1.0e+21' for exponents, else repr ('1.0', '2.5')."""
    if value.is_integer() and WHOLE_AS_INT <= abs(value) < 1e15:
        return str(int(value))
    text = repr(value)
    if "e" not in text:
        return text
    mantissa, exponent = text.split("e")
    mantissa = mantissa if "." in mantissa else f"{mantissa}.0"
    sign = "-" if exponent.startswith("-") else "+"  # YAML 1.1 needs the exponent's sign
    return f"{mantissa}e{sign}{exponent.lstrip('+-').lstrip('0') or '0'}"


def scalar_text(value: Any) -> str:
    """One YAML scalar (or a flow list of scalars), quoted only when YAML needs it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return float_text(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Sequence) and not isinstance(value, str):
        return "[" + ", ".join(scalar_text(item) for item in value) + "]"
    if isinstance(value, Mapping) and not value:
        return "{}"
    text = str(value)
    dumped = yaml.safe_dump(text, default_flow_style=True, width=1 << 20).strip()
    return str(dumped).removesuffix("\n...").removesuffix("...").strip()


def _is_block(value: Any) -> bool:
    if isinstance(value, Mapping):
        return bool(value)
    return (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and any(isinstance(item, Mapping) for item in value)
    )


def _join(base: str, key: object) -> str:
    return f"{base}.{key}" if base else str(key)


def keyed_block_lines(data: Mapping[str, Any], base: str = "") -> list[tuple[str, str | None]]:
    """Block YAML lines, each paired with the dotted key path whose value it holds (None for a
    line that only opens a section); `base` prefixes the paths."""
    return _block(data, "", base)


def _block(data: Mapping[str, Any], indent: str, base: str) -> list[tuple[str, str | None]]:
    lines: list[tuple[str, str | None]] = []
    for key, value in data.items():
        path = _join(base, key)
        if not _is_block(value):
            lines.append((f"{indent}{key}: {scalar_text(value)}", path))
            continue
        lines.append((f"{indent}{key}:", None))
        if isinstance(value, Mapping):
            lines.extend(_block(value, indent + INDENT, path))
            continue
        for index, item in enumerate(value):
            item_path = _join(path, index)
            if isinstance(item, Mapping) and item:
                item_lines = _block(item, indent + INDENT + INDENT, item_path)
                text, first = item_lines[0]
                item_lines[0] = (f"{indent}{INDENT}- {text.lstrip()}", first)
                lines.extend(item_lines)
            else:
                lines.append((f"{indent}{INDENT}- {scalar_text(item)}", item_path))
    return lines


def block_lines(data: Mapping[str, Any], indent: str = "") -> list[str]:
    """`data` as block YAML lines: nested mappings indented, lists of mappings as '- ' items."""
    return [text for text, _ in _block(data, indent, "")]
