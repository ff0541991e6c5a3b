"""Values as an override writes them: in Hydra's grammar (`hydra_value`), and as typed on a
shell's command line (`shell_value`). What a refusal's fix says to write."""

from __future__ import annotations

import json
import re
from typing import Any

_PLAIN = re.compile(r"^[A-Za-z0-9_./:+-]+$")


def hydra_value(value: Any) -> str:
    """A value in Hydra's override grammar: strings it would not read bare are quoted."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {hydra_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    return text if _PLAIN.match(text) else json.dumps(text)


def shell_value(value: Any) -> str:
    """A value as an override's right-hand side, quoted for the shell where it needs it."""
    text = hydra_value(value)
    return text if _PLAIN.match(text) else "'" + text.replace("'", "'\\''") + "'"
