"""Base class for every config section: frozen, unknown keys forbidden."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator, Sequence
from typing import Annotated, Any, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict


class Section(BaseModel):
    """A validated, immutable config section.

    Unknown keys are errors (the loader turns them into did-you-mean messages), and nothing
    downstream may mutate a config: derived values belong to the Plan. Every float is
    finite: a NaN or infinite learning rate, temperature or bound would pass every range
    check it meets (NaN compares false) and only fail, if at all, inside the run.
    """

    model_config = ConfigDict(
        frozen=True, extra="forbid", validate_default=True, allow_inf_nan=False
    )


def expand_home(path: str) -> str:
    """`path` with a leading `~` (or `~user`) expanded as a shell would: the schema reads it
    once, so the preflight, the trainers, the engines and the run directory all get the
    folder the user meant (none of them expands it, and a hub id or a `./~` folder is what
    the path as written would become)."""
    return os.path.expanduser(path)


LocalPath = Annotated[str, AfterValidator(expand_home)]
"""A file or folder on the machines of the run, `~` expanded (`expand_home`)."""


def local_path_keys(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """The dotted keys of `model`'s LocalPath fields (`run.dir`, `model.hf_checkpoint`, ...),
    through nested sections; a list of sections is one value and is not entered."""
    for name, info in model.model_fields.items():
        key = f"{prefix}{name}"
        if _is_local_path(info.metadata) or any(
            _is_local_path(getattr(arg, "__metadata__", ())) for arg in get_args(info.annotation)
        ):
            yield key
            continue
        inner = (
            () if get_origin(info.annotation) in (list, tuple, dict) else get_args(info.annotation)
        )
        for arg in (info.annotation, *inner):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                yield from local_path_keys(arg, f"{key}.")


def _is_local_path(metadata: Any) -> bool:
    return any(isinstance(m, AfterValidator) and m.func is expand_home for m in metadata)


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
        self.also: tuple[InvariantError, ...] = ()

    @staticmethod
    def all_of(errors: Sequence[InvariantError]) -> InvariantError:
        """The first of `errors`, carrying the others (`also`): one rule that finds several
        keys wrong reports each, so that fixing one does not only reveal the next."""
        first = errors[0]
        first.also = tuple(errors[1:])
        return first


def changed(section: BaseModel, field: str) -> bool:
    """Whether `field` of `section` differs from its default: a field at its default is never
    reported as unused or inert (a shipped file may spell out a default that a derived recipe
    then makes moot)."""
    info = type(section).model_fields[field]
    return bool(getattr(section, field) != info.get_default(call_default_factory=True))


def refuse_unused(section: BaseModel, field: str, *, why: str, fix: str, prefix: str = "") -> None:
    """An InvariantError when `field` differs from its default although nothing reads it.

    A setting the run would ignore is refused rather than accepted: whoever changed it
    expected an effect. A field at its default value is never reported (a shipped file may
    spell out a default that a derived recipe then makes moot). `prefix` is the path from
    the validating section to `section` ('optim.'), so the error points at the right key.
    """
    value = getattr(section, field)
    if changed(section, field):
        raise InvariantError(
            f"{field}={value!r} has no effect: {why}", fields=(prefix + field,), fix=fix
        )


def check_ip(value: str, field: str) -> None:
    """An InvariantError unless `value` is an IPv4 or IPv6 address (not a host name: Ray
    and the collectives compare node addresses as written)."""
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise InvariantError(
            f"{value!r} is not an IP address",
            fields=(field,),
            fix="write the node's IP, e.g. 10.0.0.2",
        ) from None


def ray_address_problem(value: str) -> str | None:
    """Why `value` names a Ray cluster in a way a launch cannot join, or None: Ray Client's
    ray:// (the launch's driver would run outside the cluster, and plan node 0, with the
    router, the driver and train rank 0, is the node the launch runs on) or the dashboard's
    http(s):// (the Jobs API's address, which `ray job submit` reads from RAY_ADDRESS)."""
    scheme = value.split("://", 1)[0].lower() if "://" in value else None
    if scheme == "ray":
        return (
            "Ray Client (ray://) runs the launch's driver outside the cluster, through a "
            "proxy; a launch's driver runs on a node of the cluster (plan node 0: the "
            "router, the driver and train rank 0), where it starts the router and reads "
            "what the train ranks write in run.dir"
        )
    if scheme in ("http", "https"):
        return (
            "that is the Ray dashboard's address, which `ray job submit` sends jobs to; a "
            "launch joins the cluster itself, at the head's GCS (port 6379 by default)"
        )
    if scheme is not None:
        return f"{scheme}:// is not a Ray cluster address"
    return None


JOIN_FIX = (
    "launch on a node of the cluster (the head, where `ray job submit` runs its "
    "entrypoint) with run.ray_address=auto, or the head's GCS host:port (e.g. 10.0.0.1:6379)"
)


def check_host_port(value: str, field: str, expected: str) -> None:
    """An InvariantError unless `value` is host:port with a port in 1..65535."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvariantError(
            f"{value!r} is not host:port",
            fields=(field,),
            fix=f"write {expected}, e.g. 10.0.0.1:6379",
        )
