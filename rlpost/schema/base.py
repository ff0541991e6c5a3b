"""Base class for every config section: frozen, unknown keys forbidden."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A validated, immutable config section.

    Unknown keys are errors (the loader turns them into did-you-mean messages), and nothing
    downstream may mutate a config: derived values belong to the Plan.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


class InvariantError(ValueError):
    """A cross-field rule broken inside one section.

    `fields` are paths relative to the section that raised it, so the loader can point at
    the YAML key (and file) a user has to change; `fix` is the remedy in one sentence.
    """

    def __init__(self, message: str, *, fields: tuple[str, ...], fix: str) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields
        self.fix = fix
