"""The settings only training reads, which mode=eval leaves unread.

mode=eval evaluates the weights the engines serve once (model.hf_checkpoint's, or model.load's
or run.resume's, which the train ranks load and send to the engines before the evaluation)
and trains nothing: no optimizer, loss, train step, checkpoint or training rollout. What it
does read of the recipe, and so is not listed: the eval section's sets and sampling, with the
rollout's sampling settings, stop tokens, generate function, turns and reward as their
fallbacks (rlpost.runtime.evaluation.load_eval_sets); the data section's prompt format,
which is the eval sets' too (the training prompts themselves are neither checked nor
loaded: rlpost.preflight.data_files.check_data, rlpost.runtime.train.load_inputs); and what
shapes the engines and train ranks: rollout.max_concurrency, loop.mode (an overlapping
loop's default placement), train.mtp_training (the MTP layers built, loaded and sent), and
rollout.max_response_len (the response length of a set that names none, nor eval does). The
engines' context and KV cache hold the evaluation sets' own longest request
(rlpost.plan.engine_memory.longest_request), and layout=auto times the sets' own generation
(rlpost.plan.generation), not training's.

A mode=eval launch refuses these keys on its command line (rlpost.config.eval_mode); set in a
file (a training recipe reused for evaluation), they are kept, and the plan notes them as
unread. tests/config/test_eval_mode.py changes each and checks that the evaluation's plan
and evaluation sets stay the same.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel


@dataclass(frozen=True)
class TrainingOnly:
    """Keys of `section` (all of it when `keys` is empty) that only training reads; `what`
    names them in a plan note."""

    section: str
    why: str
    keys: tuple[str, ...] = ()
    what: str = ""

    def covers(self, key: str) -> bool:
        if not self.keys:
            return _at_or_below(key, self.section)
        return any(_at_or_below(key, f"{self.section}.{name}") for name in self.keys)


TRAINING_ONLY: tuple[TrainingOnly, ...] = (
    TrainingOnly(
        "recipe.optim",
        "the optimizer and its learning-rate schedule: the train ranks build no optimizer",
    ),
    TrainingOnly(
        "recipe.algo",
        "the loss, the advantages and the KL terms: nothing is trained, and no reference "
        "model is loaded",
    ),
    TrainingOnly(
        # mtp_training is read: it decides whether the MTP layers are built, loaded and sent
        "recipe.train",
        "the train step's batches and MTP loss: no train step runs",
        (
            "global_batch_size",
            "micro_batch_size",
            "use_dynamic_batch_size",
            "max_tokens_per_gpu",
            "balance_data",
            "mtp_loss_scaling_factor",
        ),
        "batch settings",
    ),
    TrainingOnly(
        "recipe.save",
        "checkpoints and HF exports of the trained policy: an evaluation writes neither",
    ),
    TrainingOnly(
        # loop.mode is read: an overlapping loop gives engines and train ranks GPUs of their own
        "recipe.loop",
        "the bounds between rollouts and train steps: no training rollout is generated, and "
        "the weights reach the engines once",
        ("update_weights_interval", "max_staleness", "max_buffered_groups", "stale_groups"),
        "bounds",
    ),
    TrainingOnly(
        # sampling, stop tokens, generate function, turns, reward, max_concurrency and
        # max_response_len (a set's fallback) are read by the evaluation
        "recipe.rollout",
        "training rollouts: the evaluation generates every group of its sets once, each set "
        "at its own samples per prompt, with no filter, over-sampling or partial rollout",
        (
            "num_rollout",
            "batch_size",
            "n_samples_per_prompt",
            "over_sampling_batch_size",
            "dynamic_sampling_filter",
            "max_draws_per_rollout",
            "partial_rollout",
            "mask_offpolicy_in_partial_rollout",
            "buffer_filter",
        ),
        "training-rollout settings",
    ),
    TrainingOnly(
        # the prompt format (keys, chat template) is read: the evaluation sets take it
        "recipe.data",
        "where and in which order training draws its prompts, and how long they may be: an "
        "evaluation neither reads nor draws them, only its sets' prompts (bounded by "
        "recipe.eval.max_prompt_len)",
        ("prompt_data", "source", "source_settings", "shuffle", "seed", "max_prompt_len"),
        "training prompts",
    ),
    TrainingOnly(
        "recipe.eval",
        "when training evaluates: mode=eval evaluates once",
        ("interval", "skip_before_train"),
        "schedule",
    ),
    TrainingOnly(
        "run",
        "what a SIGTERM saves: an evaluation has no rollout to save and stops at once, its "
        "metrics unlogged (rlpost.runtime.evaluation)",
        ("on_sigterm",),
        "SIGTERM setting",
    ),
)
"""Every config key mode=eval never reads, by section, with the reason."""


_EVALUATING: ContextVar[bool] = ContextVar("evaluating", default=False)

SectionT = TypeVar("SectionT", bound=BaseModel)


@contextmanager
def judging(mode: object) -> Iterator[None]:
    """While a RunConfig of `mode` validates: training_rule's rules pass a mode=eval config,
    whose training-only settings go unread (a training recipe reused for evaluation keeps
    them as they are)."""
    token = _EVALUATING.set(mode == "eval")
    try:
        yield
    finally:
        _EVALUATING.reset(token)


def evaluating() -> bool:
    """Whether the RunConfig being validated is a mode=eval run's (False for a section
    validated on its own: it is judged as training's)."""
    return _EVALUATING.get()


def training_rule(rule: Callable[[SectionT], SectionT]) -> Callable[[SectionT], SectionT]:
    """A cross-field rule whose subject is only training (TRAINING_ONLY's settings): it
    judges a run that trains, and passes a mode=eval run, which never reads what it judges.
    Put it under @model_validator(mode="after")."""

    @functools.wraps(rule)
    def judged(section: SectionT) -> SectionT:
        return section if evaluating() else rule(section)

    return judged


def _at_or_below(key: str, prefix: str) -> bool:
    return key == prefix or key.startswith(f"{prefix}.")


def training_only(key: str) -> TrainingOnly | None:
    """The entry of TRAINING_ONLY that `key` (a dotted path) falls under, if any."""
    return next((entry for entry in TRAINING_ONLY if entry.covers(key)), None)


def set_training_only(root: BaseModel) -> list[str]:
    """What `root` (a RunConfig) sets of TRAINING_ONLY (keys that are required or differ from
    their defaults), compactly: a whole section by its name (`recipe.optim`), else the one key
    set (`recipe.rollout.num_rollout`) or what the keys are (`recipe.train's batch
    settings`)."""
    found = []
    for entry in TRAINING_ONLY:
        section = _at(root, entry.section)
        fields = type(section).model_fields
        given = [
            name
            for name in entry.keys or tuple(fields)
            if fields[name].is_required()
            or getattr(section, name) != fields[name].get_default(call_default_factory=True)
        ]
        if not given:
            continue
        if not entry.keys:
            found.append(entry.section)
        elif len(given) == 1:
            found.append(f"{entry.section}.{given[0]}")
        else:
            found.append(f"{entry.section}'s {entry.what}")
    return found


def _at(root: BaseModel, dotted: str) -> BaseModel:
    node = root
    for part in dotted.split("."):
        node = getattr(node, part)
    return node
