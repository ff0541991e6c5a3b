"""One generation row (a prompt and its output so far) and how it finished."""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field
from typing import Any

import torch

from rlpost.backends.cpu_engine.sampling import SamplingParams


@dataclass(frozen=True)
class FinishReason:
    """SGLang's finish_reason: kind stop (matched token id or string), length, or abort."""

    kind: str
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None
    status_code: int | None = None

    def to_json(self) -> dict[str, Any]:
        if self.kind == "stop":
            return {"type": "stop", "matched": self.matched}
        if self.kind == "length":
            return {"type": "length", "length": self.length}
        # an abort asked for (abort_request, pause_generation, a weight update) carries no
        # status_code in SGLang: null, as its FINISH_ABORT() writes; the HTTP status is 200.
        # One with a status_code (the engine shutting down: 503) is answered with that status.
        return {
            "type": "abort",
            "message": self.message,
            "status_code": self.status_code,
            "err_type": None,
        }

    @property
    def error_status(self) -> int | None:
        """The HTTP status to answer instead of the output: an abort's status_code, as SGLang
        turns an abort carrying 400, 500 or 503 into that status (None: answer 200)."""
        return self.status_code if self.kind == "abort" else None


@dataclass(eq=False)
class Row:
    """One row being generated. Mutated by the decoding thread only, except `abort`, which
    another thread may set to ask for an abort at the next step: the row finishes with it."""

    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: FinishReason | None = None
    abort: FinishReason | None = None
    weight_version: str = "default"
    done: concurrent.futures.Future[Row] = field(default_factory=concurrent.futures.Future)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def finish_with(self, reason: FinishReason, weight_version: str) -> None:
        self.finish = reason
        self.weight_version = weight_version
        if not self.done.done():
            self.done.set_result(self)
