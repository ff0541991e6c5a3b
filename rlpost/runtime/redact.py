"""Secrets never reach a run's files: what a run writes about itself is redacted first.

Two kinds: credentials inside URLs (`https://user:password@host/...`, e.g. a remote reward
server), and the values of environment variables whose names say they are secret (KEY,
TOKEN, SECRET, PASSWORD), which a config can pull in with `${oc.env:NAME}`. config.yaml,
provenance.json, launches.jsonl, checkpoints and the wandb config all go through `redact`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD")
MIN_SECRET_LEN = 4  # shorter values ("1", "yes") would blank out ordinary text
URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:/@\s]*):[^@/\s]*@")


def secret_values(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment variables whose names mark them secret, by name."""
    env = os.environ if env is None else env
    return {
        name: value
        for name, value in env.items()
        if any(word in name.upper() for word in SECRET_WORDS) and len(value) >= MIN_SECRET_LEN
    }


def redact_text(text: str, secrets: Mapping[str, str] | None = None) -> str:
    secrets = secret_values() if secrets is None else secrets
    text = URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)
    for name, value in sorted(secrets.items(), key=lambda item: -len(item[1])):
        text = text.replace(value, f"<redacted ${name}>")
    return text


def redact(value: Any, secrets: Mapping[str, str] | None = None) -> Any:
    """`value` with every string in it redacted (mappings and lists walked)."""
    secrets = secret_values() if secrets is None else secrets
    if isinstance(value, str):
        return redact_text(value, secrets)
    if isinstance(value, Mapping):
        return {key: redact(item, secrets) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [redact(item, secrets) for item in value]
    return value
