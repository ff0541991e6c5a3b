"""A grading worker process: JSON lines in on stdin, one reward per line out on stdout.

Started by `pool.py` as `python -m rlpost.rewards.worker`. Request: {"grader": name,
"response": str, "label": str}; reply: {"reward": float} or {"error": str}. The first line
out is {"ready": true}, once math_verify and sympy are imported.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from rlpost.rewards.answers import GRADERS, warm_up


def handle(request: dict[str, Any]) -> dict[str, Any]:
    grader = GRADERS.get(request.get("grader", ""))
    if grader is None:
        return {"error": f"unknown grader {request.get('grader')!r}; known: {sorted(GRADERS)}"}
    try:
        return {"reward": float(grader(request["response"], request["label"]))}
    except Exception as exc:  # reported to the parent, which raises it there
        return {"error": f"{type(exc).__name__}: {exc}"}


def main() -> None:
    # Keep the protocol channel to ourselves: anything a library prints goes to stderr.
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout = sys.stderr
    warm_up()
    protocol.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        if line.strip():
            protocol.write(json.dumps(handle(json.loads(line))) + "\n")


if __name__ == "__main__":
    main()
