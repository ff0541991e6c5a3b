"""A small text-table helper: aligned columns, numbers to the right, no dependencies."""

from __future__ import annotations

from collections.abc import Sequence

Cell = str | int | float | None


def format_cell(value: Cell, decimals: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.{decimals}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return value


def _is_number(value: Cell) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def render_table(
    headers: Sequence[str], rows: Sequence[Sequence[Cell]], title: str | None = None
) -> str:
    """Rows under a header line; a column is right-aligned when every value in it is a number."""
    cells = [[format_cell(value) for value in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    numeric = [
        bool(rows) and all(_is_number(row[i]) or row[i] is None for row in rows)
        for i in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "  " + "  ".join(parts).rstrip()

    out = [title] if title else []
    out.append(line(list(headers)))
    out.append("  " + "  ".join("-" * w for w in widths))
    out.extend(line(row) for row in cells)
    return "\n".join(out)


def ranges(values: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    if not values:
        return "-"
    spans: list[tuple[int, int]] = []
    for v in values:
        if spans and v == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], v)
        else:
            spans.append((v, v))
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
