"""What the engines generate in the work the cost model times (rlpost.plan.cost.rollout_time):
training's rollout, or in mode=eval every evaluation set, one after another.

An evaluation generates its sets in turn (rlpost.runtime.evaluation.evaluate), each set's every
prompt at once, its own n_samples_per_prompt each, at its own response length (the set's, else
recipe.eval's, else the rollout's), its prompts bounded by recipe.eval.max_prompt_len; training's
batch and data.max_prompt_len bound none of it.

How many prompts a set holds is its file's to say, and planning reads no data file (a plan is
made where the data may not be, and a parquet file takes pyarrow to count): a set whose path
has a row slice that counts its rows by its bounds alone (`@[0:500]`, `@[:500]`, `@[-100:]`)
is counted at that many, at most (a shorter file gives fewer); any other at
`EVAL_PROMPTS_PER_SET`, and the plan says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlpost.plan.batch import BatchPlan
from rlpost.schema import RecipeConfig, RunConfig
from rlpost.schema.prompt_file import split_prompt_path

EVAL_PROMPTS_PER_SET = 100
"""The prompts an evaluation set is timed at where its path's row slice does not count them."""


@dataclass(frozen=True)
class Generation:
    """One round the engines generate: its samples, all sent at once, and the bounds of a
    sample's prompt (0 where unset) and response."""

    name: str  # "rollout", or the evaluation set's name
    prompts: int
    samples: int
    prompt_tokens: int
    response_tokens: int
    prompts_from: str  # what gives `prompts`: the batch, the set's row slice, or the basis

    @property
    def longest_tokens(self) -> int:
        return self.prompt_tokens + self.response_tokens

    @property
    def samples_per_prompt(self) -> int:
        """A group's samples: what one request carries when a group's go out together."""
        return self.samples // max(1, self.prompts)

    def describe(self) -> str:
        n = self.samples_per_prompt
        prompt = self.prompt_tokens or "0 (unbounded: counted as 0)"
        return (
            f"{self.name}: {self.prompts} prompts ({self.prompts_from}) x {n} samples, prompts "
            f"up to {prompt} tokens, responses up to {self.response_tokens}"
        )


def sliced_rows(path: str) -> int | None:
    """The rows a prompt path's row slice selects at most, where its bounds alone say
    (`@[10:60]`: 50, `@[:500]`: 500, `@[-100:]`: 100); None without a slice, or where the count
    takes the file's length (`@[100:]`, `@[10:-5]`)."""
    rows = split_prompt_path(path).rows
    if rows is None:
        return None
    start: int | None = rows.start
    stop: int | None = rows.stop
    if stop is None:
        return -start if start is not None and start < 0 else None
    if start is None:
        return stop if stop >= 0 else None
    return max(0, stop - start) if (start < 0) == (stop < 0) else None


def eval_generations(recipe: RecipeConfig) -> tuple[Generation, ...]:
    """Every evaluation set as the engines generate it (the module's docstring)."""
    ev = recipe.eval
    found = []
    for i, dataset in enumerate(ev.datasets):
        counted = sliced_rows(dataset.path)
        prompts = EVAL_PROMPTS_PER_SET if counted is None else counted
        basis = (
            f"assumed: its file is not read when planning (a row slice such as @[0:{prompts}] "
            "sets the count)"
            if counted is None
            else "its row slice's, at most"
        )
        n = dataset.n_samples_per_prompt or ev.n_samples_per_prompt
        _, response = ev.response_len(i) or ("", recipe.rollout.max_response_len)
        found.append(
            Generation(dataset.name, prompts, prompts * n, ev.max_prompt_len or 0, response, basis)
        )
    return tuple(found)


def planned_generations(cfg: RunConfig, batch: BatchPlan) -> tuple[Generation, ...]:
    """What the engines generate in the work one iteration of the plan is: in mode=eval the
    evaluation sets, else training's rollout (the batch's samples, data.max_prompt_len and
    rollout.max_response_len)."""
    if cfg.mode == "eval":
        return eval_generations(cfg.recipe)
    recipe = cfg.recipe
    return (
        Generation(
            "rollout",
            batch.rollout_batch_size,
            batch.samples_per_rollout,
            recipe.data.max_prompt_len or 0,
            recipe.rollout.max_response_len,
            "recipe.rollout.batch_size",
        ),
    )
