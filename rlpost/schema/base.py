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


def refuse_unused(section: BaseModel, field: str, *, why: str, fix: str, prefix: str = "") -> None:
    """An InvariantError when `field` differs from its default although nothing reads it.

    A setting the run would ignore is refused rather than accepted: whoever changed it
    expected an effect. A field at its default value is never reported (a shipped file may
    spell out a default that a derived recipe then makes moot). `prefix` is the path from
    the validating section to `section` ('optim.'), so the error points at the right key.
    """
    info = type(section).model_fields[field]
    value = getattr(section, field)
    if value != info.get_default(call_default_factory=True):
        raise InvariantError(
            f"{field}={value!r} has no effect: {why}", fields=(prefix + field,), fix=fix
        )
