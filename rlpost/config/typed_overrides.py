"""A sweep's overrides as the user typed them, and the ones that tell its jobs apart.

Hydra's sweeper hands each job its overrides rewritten from the values it parsed:
`-m recipe.optim.lr=1e-5,1e-4` gives the jobs `recipe.optim.lr=1e-05` and
`recipe.optim.lr=0.0001` (so do their `.hydra/overrides.yaml`); only the sweep's
`multirun.yaml` keeps the command line as typed. What rlpost shows of a job (the sweep
summary, a refused job's name, a plot's legend) maps Hydra's spelling back to the user's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

_CLOSING = {"[": "]", "{": "}", "(": ")"}


def _elements(value: str) -> list[str]:
    """`value` split at its top-level commas: those outside quotes and brackets."""
    pieces, depth, quote, start, i = [], 0, "", 0, 0
    while i < len(value):
        char = value[i]
        if quote:
            if char == "\\":
                i += 1  # the escaped character, a quote included
            elif char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in _CLOSING:
            depth += 1
        elif char in _CLOSING.values():
            depth -= 1
        elif char == "," and depth == 0:
            pieces.append(value[start:i].strip())
            start = i + 1
        i += 1
    pieces.append(value[start:].strip())
    return pieces


def typed_forms(overrides: Iterable[str]) -> dict[str, str]:
    """Each override a job of these (a command line's) gets, in Hydra's spelling, mapped to
    the user's: {'recipe.optim.lr=1e-05': 'recipe.optim.lr=1e-5', ...}. An element is mapped
    only where the text typed parses to the very value Hydra wrote (a sweep written with a
    function, `range(1,4)`, keeps Hydra's spelling); a line Hydra cannot parse maps nothing."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    forms: dict[str, str] = {}
    for line in overrides:
        if "=" not in line:
            continue
        try:
            override = parser.parse_override(line)
            key = override.get_key_element()
            if override.is_sweep_override():
                if not override.is_discrete_sweep():
                    continue
                hydra_values = list(override.sweep_string_iterator())
            else:
                hydra_values = [override.get_value_element_as_str()]
            typed = _elements(line.split("=", 1)[1])
            if len(typed) != len(hydra_values):
                continue
            for text, hydra_value in zip(typed, hydra_values, strict=True):
                alone = parser.parse_override(f"{key}={text}")
                if alone.is_sweep_override() or alone.get_value_element_as_str() != hydra_value:
                    break
            else:
                for text, hydra_value in zip(typed, hydra_values, strict=True):
                    forms[f"{key}={hydra_value}"] = f"{key}={text}"
        except HydraException:
            continue
    return forms


def own_overrides(
    jobs: Sequence[Sequence[str]], typed: Mapping[str, str] | None = None
) -> list[list[str]]:
    """Per job, the overrides that tell it apart from the others (every job sharing one
    says nothing about the difference), as typed where `typed` (typed_forms) knows them,
    without Hydra's '+'."""
    shared = set.intersection(*(set(job) for job in jobs)) if jobs else set()
    forms = typed or {}
    return [[forms.get(o, o).lstrip("+") for o in job if o not in shared] for job in jobs]
