"""What an actor raised, as a caller of it sees it: Ray wraps the actor's exception in its own
(a RayTaskError), whose text is the actor's whole traceback."""

from __future__ import annotations


def remote_cause(exc: BaseException) -> BaseException:
    """The exception an actor raised, without Ray's wrapping (whose text is the actor's
    whole traceback); `exc` itself when it is not wrapped."""
    cause = getattr(exc, "cause", None)  # a RayTaskError carries the actor's exception
    return cause if isinstance(cause, BaseException) else exc
