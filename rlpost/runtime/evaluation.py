"""Evaluation on named datasets: n samples per prompt, accuracy = mean reward.

Every group of every eval set is generated and scored once: no dynamic-sampling filter, no
over-sampling, so the accuracy is exact whatever the training recipe filters. Only
recipe.eval.max_prompt_len, where set, leaves prompts out (as slime's --eval-max-prompt-len).
"""

from __future__ import annotations

import functools
import logging
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from rlpost.data.prompts import ChatTokenizer
from rlpost.data.source import Group, load_eval_groups
from rlpost.errors import Issue, Location, UserError
from rlpost.plan.table import render_table
from rlpost.rewards import compute_rewards
from rlpost.runtime.metrics import AFTER_ROLLOUT, reward_extra_means
from rlpost.runtime.rollout.manager import GroupRunner, SamplingSettings, all_or_none
from rlpost.schema import RecipeConfig
from rlpost.schema.evaluation import EvalConfig
from rlpost.schema.reward import RewardConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalSet:
    name: str
    groups: list[Group]
    sampling: SamplingSettings
    path: str = ""
    dropped: int = 0  # prompts left out over recipe.eval.max_prompt_len
    # how the set is scored where not as training is: its own custom function (the set's,
    # else recipe.eval's), or its own reward_type (and no custom function), as a reward
    # config; None: scored as training is
    reward: RewardConfig | None = None


@dataclass(frozen=True)
class EvalReport:
    rollout_id: int
    accuracy: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


def eval_response_len(recipe: RecipeConfig, index: int) -> tuple[str, int]:
    """The response length of recipe.eval.datasets[index]'s requests, and the key that sets
    it: the dataset's own, else the eval section's (EvalConfig.response_len), else the
    rollout's."""
    found = recipe.eval.response_len(index)
    if found is None:
        return "recipe.rollout.max_response_len", recipe.rollout.max_response_len
    key, value = found
    return f"recipe.{key}", value


def load_eval_sets(
    recipe: RecipeConfig, tokenizer: ChatTokenizer, stop_token_ids: Sequence[int]
) -> list[EvalSet]:
    """Every evaluation set, its prompts over recipe.eval.max_prompt_len left out; a
    UserError naming each set none of whose prompts is left."""
    ev, rollout = recipe.eval, recipe.rollout
    sets, empty = [], []
    for i, dataset in enumerate(ev.datasets):
        everything = load_eval_groups(
            dataset.path,
            recipe.data,
            tokenizer,
            n_samples_per_prompt=dataset.n_samples_per_prompt or ev.n_samples_per_prompt,
            input_key=dataset.input_key,
            label_key=dataset.label_key,
            tool_key=dataset.tool_key,
        )
        groups = [g for g in everything if fits(g, ev.max_prompt_len)]
        dropped = len(everything) - len(groups)
        if dropped and groups:  # said where the person launching sees it, not only in a log
            logger.warning(
                "eval set %s (%s): left out %d of %d prompts over recipe.eval.max_prompt_len="
                "%s tokens",
                dataset.name, dataset.path, dropped, len(everything), ev.max_prompt_len,
            )  # fmt: skip
        elif dropped:
            empty.append(_all_too_long(i, dataset.name, dataset.path, everything, ev))
        reward = None
        if dataset.reward_type is not None:  # over a line's own rm_type, as slime's does
            for sample in (s for group in groups for s in group):
                sample.metadata["rm_type"] = dataset.reward_type
            update: dict[str, object] = {"type": dataset.reward_type, "custom_function": None}
            reward = rollout.reward.model_copy(update=update)
        function = ev.reward_function(i)
        if function is not None:  # before any reward type (the schema refuses the set's own)
            update = {"custom_function": function[1], "group": False}
            reward = rollout.reward.model_copy(update=update)
        sampling = SamplingSettings(
            max_new_tokens=eval_response_len(recipe, i)[1],
            temperature=ev.temperature if ev.temperature is not None else rollout.temperature,
            top_p=ev.top_p if ev.top_p is not None else rollout.top_p,
            top_k=ev.top_k if ev.top_k is not None else rollout.top_k,
            stop=tuple(rollout.stop),
            stop_token_ids=tuple(stop_token_ids),
            skip_special_tokens=rollout.skip_special_tokens,
        )
        sets.append(EvalSet(dataset.name, groups, sampling, str(dataset.path), dropped, reward))
    if empty:
        raise UserError(empty, title="data error")
    return sets


def fits(group: Group, max_prompt_len: int | None) -> bool:
    return max_prompt_len is None or len(group[0].prompt_ids) <= max_prompt_len


def _all_too_long(
    index: int, name: str, path: str, groups: Sequence[Group], ev: EvalConfig
) -> Issue:
    shortest = min(len(g[0].prompt_ids) for g in groups)
    return Issue(
        "recipe.eval.max_prompt_len",
        f"evaluation set {name!r} (recipe.eval.datasets.{index}) has no prompt of at most "
        f"{ev.max_prompt_len} tokens: its {len(groups)} prompts run from {shortest} tokens "
        "up, so it would evaluate nothing",
        f"raise recipe.eval.max_prompt_len to at least {shortest} (within the engines' "
        "context, less the set's response length), or remove the set",
        value=ev.max_prompt_len,
        location=Location(file=str(path)),
    )


async def evaluate(
    runner: GroupRunner,
    eval_sets: Sequence[EvalSet],
    rollout_id: int,
    weight_version: int,
    reward_seed: int | None = None,
) -> EvalReport:
    """Every eval group generated and scored once, by engines serving `weight_version`; a
    set with a reward of its own is scored by it (with `reward_seed`, the run's in
    deterministic mode), the others by the runner's.
    `rollout_id` is the rollouts trained before it (the table's "after rollout"): it is
    logged as eval/after_rollout, since a step's record carries the evaluation after it
    under the step's own rollout_id, one less."""
    accuracy: dict[str, float] = {}
    metrics: dict[str, float] = {
        "eval/weight_version": float(weight_version),
        AFTER_ROLLOUT: float(rollout_id),
    }
    for eval_set in eval_sets:
        groups = [[s.fresh() for s in g] for g in eval_set.groups]
        params = eval_set.sampling.to_sglang()
        own = eval_set.reward
        scored = (
            None
            if own is None
            else functools.partial(compute_rewards, config=own, seed=reward_seed)
        )
        # one group that fails stops the others (they would go on sending requests to the
        # engines of a run that is ending)
        done = await all_or_none(
            runner.run(g, params, runner.client_for(g), scored) for g in groups
        )
        samples = [s for g in done for s in g]
        rewards = [float(s.reward or 0.0) for s in samples]
        lengths = [sum(s.loss_mask) for s in samples]
        accuracy[eval_set.name] = statistics.fmean(rewards)
        metrics[f"eval/{eval_set.name}/accuracy"] = accuracy[eval_set.name]
        metrics[f"eval/{eval_set.name}/response_len_mean"] = statistics.fmean(lengths)
        metrics[f"eval/{eval_set.name}/num_samples"] = float(len(rewards))
        metrics.update(reward_extra_means(samples, f"eval/{eval_set.name}"))
    return EvalReport(rollout_id, accuracy, metrics)


def format_eval_table(reports: Sequence[EvalReport]) -> str:
    """Accuracy per dataset at each evaluation (the first is before any training)."""
    if not reports:
        return ""
    names = list(reports[0].accuracy)
    rows = [
        [str(r.rollout_id), *(f"{r.accuracy[n]:.3f}" if n in r.accuracy else None for n in names)]
        for r in reports
    ]
    return render_table(["after rollout", *names], rows, title="eval accuracy")
