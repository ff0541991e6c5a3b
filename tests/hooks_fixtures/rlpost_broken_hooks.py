"""A hook module whose own import fails: it needs a package that is not installed."""

import rlpost_package_that_does_not_exist  # noqa: F401


def reward(sample) -> float:  # pragma: no cover - never importable
    return 0.0
