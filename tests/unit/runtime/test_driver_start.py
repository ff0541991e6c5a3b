"""The driver reaches Ray's start without loading torch or transformers (they load with the
run's inputs, alongside Ray), and names the train ranks' functions only by name; an actor
loads torch only after its thread settings are in place."""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
from pathlib import Path

from rlpost.backends.sglang import trainer_side as real_trainer_side
from rlpost.backends.sglang.trainer_calls import TrainerFunction, trainer_side

ROOT = Path(__file__).resolve().parents[3]


def test_the_driver_and_actor_modules_load_no_torch() -> None:
    """Nor does the actors' module, which each actor process imports before its __init__
    sets the thread settings torch reads when it loads."""
    code = (
        "import sys, rlpost.cli.launch, rlpost.runtime.train, rlpost.runtime.actors; "
        "print([m for m in ('torch', 'transformers') if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"


def test_every_trainer_function_the_driver_names_exists() -> None:
    """A misspelt name would only fail inside a train rank, mid-run: check them all here."""
    names: set[str] = set()
    for path in (ROOT / "rlpost" / "runtime").rglob("*.py"):
        names |= set(re.findall(r"\btrainer_side\.(\w+)", path.read_text(encoding="utf-8")))
    assert {"open_weight_stream", "probe_logprobs", "offload"} <= names
    for name in sorted(names):
        assert callable(getattr(real_trainer_side, name, None)), name


def test_a_trainer_function_travels_by_name_and_runs_the_real_one() -> None:
    fn = pickle.loads(pickle.dumps(trainer_side.release_bucket))
    assert fn == TrainerFunction("release_bucket")
    real_trainer_side._HELD_BUCKET.append(object())  # type: ignore[arg-type]
    fn(None)  # the real function, called with the trainer, drops the held bucket
    assert real_trainer_side._HELD_BUCKET == []
