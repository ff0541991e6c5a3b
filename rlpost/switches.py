"""The environment switches the trainers' kernels read, each with the values it takes.

A switch set to anything else is refused, by the launch's preflight (rlpost.preflight)
before anything starts, and by the code that reads it: a misspelt value is never taken for
the default. Standard library only (the planning path imports it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Switch:
    name: str
    choices: tuple[str, ...]
    default: str
    meaning: str  # what each value does, for the refusal's fix

    def value(self) -> str:
        """The switch's value in this process's environment (the default when unset)."""
        value = os.environ.get(self.name, self.default)
        if value not in self.choices:
            raise ValueError(f"{self.name}={value!r}: {self.problem()}; {self.meaning}")
        return value

    def problem(self) -> str:
        return f"takes {' or '.join(self.choices)} (unset: {self.default})"


COMPILE = Switch("RLPOST_COMPILE", ("0", "1"), "1", "0 runs every compiled kernel eagerly")
# a way around a torch build whose fused RMSNorm kernels misbehave (benchmarks/gpu_checks.sh
# sets it when their gpu test fails)
FUSED_RMS_NORM = Switch(
    "RLPOST_FUSED_RMS_NORM", ("0", "1"), "1", "0 runs RMSNorm without torch's fused kernels"
)
CUDNN_ATTENTION = Switch(
    "RLPOST_CUDNN_ATTENTION", ("0", "1"), "1",
    "0 leaves SDPA's own backend order on Hopper instead of cuDNN's attention first",
)  # fmt: skip
PACKED_ATTENTION = Switch(
    "RLPOST_PACKED_ATTENTION", ("auto", "varlen"), "auto",
    "varlen keeps the megatron trainer on the varlen kernel; auto takes the padded path where "
    "it measured faster",
)  # fmt: skip
SWITCHES = (COMPILE, FUSED_RMS_NORM, CUDNN_ATTENTION, PACKED_ATTENTION)


def bad_switches() -> list[tuple[Switch, str]]:
    """The switches set to a value they do not take, with that value."""
    bad = []
    for switch in SWITCHES:
        value = os.environ.get(switch.name)
        if value is not None and value not in switch.choices:
            bad.append((switch, value))
    return bad
