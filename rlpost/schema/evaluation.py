"""The eval section (recipe.eval): the evaluation sets, when they run and how they sample."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BeforeValidator,
    Field,
    PositiveInt,
    model_validator,
)

from rlpost.schema.base import InvariantError, Section, refuse_unused
from rlpost.schema.prompt_file import PromptPath
from rlpost.schema.reward import check_reward_type_known
from rlpost.schema.rollout import GREEDY_BELOW, check_top_k
from rlpost.schema.training_only import training_rule

# What an evaluation set may grade with in place of rollout.reward.type: a rule-based type or
# the reward server (a reward model scores every sample, whatever its set).
EvalRewardType = Annotated[
    Literal[
        "math", "deepscaler", "dapo", "f1", "gpqa", "boxed_f1", "boxed_gpqa", "random", "remote"
    ],
    BeforeValidator(check_reward_type_known),
]


class EvalDataset(Section):
    name: str
    path: PromptPath = Field(
        description="a jsonl or parquet file, optionally with a row slice: "
        "/data/test.parquet@[0:500] (as slime's --eval-prompt-data and eval config take it)"
    )
    reward_type: EvalRewardType | None = Field(
        None,
        description="grade this set's every line with this reward type, whatever "
        "rollout.reward.type and a line's metadata rm_type say (slime's eval config's "
        "rm_type)",
    )
    custom_reward_function: str | None = Field(
        None,
        description="score this set's every sample with this function, 'module.fn' with "
        "def fn(sample) -> float (async too) or verl's compute_score(data_source, solution_str, "
        "ground_truth, extra_info=None), before eval.custom_reward_function and any "
        "other scorer (slime's eval config's custom_rm_path)",
    )
    input_key: str | None = None
    label_key: str | Literal[False] | None = Field(
        None,
        description="the field holding a line's label (null: the data section's label_key; "
        "false: the set's lines have none, for a set scored without one: a custom reward "
        "function, the random type, a reward model; slime's eval config's label_key: null)",
    )
    tool_key: str | Literal[False] | None = Field(
        None,
        description="the field holding a line's tools (null: the data section's tool_key; "
        "false: the set's lines are rendered without tools, whatever field they hold; "
        "slime's eval config's tool_key: null)",
    )
    n_samples_per_prompt: PositiveInt | None = None
    max_response_len: PositiveInt | None = None


# What only an evaluation set reads of this section: how each set is sampled, and whether
# one evaluation runs before training. With no set named, nothing reads them
# (EvalConfig.unread_set_settings).
SET_SETTINGS = (
    "n_samples_per_prompt",
    "max_response_len",
    "temperature",
    "top_p",
    "top_k",
    "skip_before_train",
)


class EvalConfig(Section):
    interval: PositiveInt | None = None
    datasets: list[EvalDataset] = Field(default_factory=list)
    n_samples_per_prompt: PositiveInt = 1
    max_response_len: PositiveInt | None = None
    max_prompt_len: PositiveInt | None = Field(
        None,
        description="leave out of every evaluation set the prompts longer than this many "
        "tokens, as data.max_prompt_len does for training (slime's --eval-max-prompt-len); "
        "null evaluates every prompt, each then checked against the engines' context before "
        "the run starts",
    )
    temperature: float | None = None
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = None
    skip_before_train: bool = False
    custom_reward_function: str | None = Field(
        None,
        description="score the evaluation sets' samples with this function, 'module.fn' "
        "with def fn(sample) -> float (async too) or verl's compute_score(data_source, "
        "solution_str, ground_truth, extra_info=None), in place of rollout.reward's (a set's own "
        "custom_reward_function first; slime's eval config's defaults.custom_rm_path)",
    )

    def reward_function(self, index: int) -> tuple[str, str] | None:
        """The function that scores datasets[index], with the key (below recipe) that names
        it: the set's own, else this section's; None where the set is scored otherwise. In
        slime's order: a custom function scores before any reward type."""
        own = self.datasets[index].custom_reward_function
        if own:
            return f"eval.datasets.{index}.custom_reward_function", own
        if self.custom_reward_function:
            return "eval.custom_reward_function", self.custom_reward_function
        return None

    def unread_set_settings(self) -> list[str]:
        """SET_SETTINGS this section gives other than their defaults while it names no
        evaluation set, so that nothing reads them. Not refused here: a recipe's own values
        stay when a run turns its evaluation off (datasets: [] with interval: null); a
        command line that gives one is refused (rlpost.config.eval_sets) and the plan notes
        a file's."""
        if self.datasets:
            return []
        fields = type(self).model_fields
        return [name for name in SET_SETTINGS if getattr(self, name) != fields[name].get_default()]

    def response_len(self, index: int) -> tuple[str, int] | None:
        """datasets[index]'s response length, with the key (below recipe) that sets it: the
        set's own, else this section's; None where the set runs at the rollout's."""
        own = self.datasets[index].max_response_len
        if own:
            return f"eval.datasets.{index}.max_response_len", own
        if self.max_response_len:
            return "eval.max_response_len", self.max_response_len
        return None

    def response_lens(self) -> list[tuple[str, int]]:
        """The response lengths the evaluation sets run at, each with the key that sets it
        (`response_len`); sets at the rollout's are not listed, and this section's only once."""
        found = (self.response_len(i) for i in range(len(self.datasets)))
        return list(dict(f for f in found if f is not None).items())

    @model_validator(mode="after")
    def check_set_defaults_are_read(self) -> EvalConfig:
        """This section's n_samples_per_prompt and max_response_len are the sets' defaults:
        when every set names its own, neither is read."""
        if not self.datasets:
            return self
        for name in ("n_samples_per_prompt", "max_response_len"):
            if all(getattr(d, name) is not None for d in self.datasets):
                refuse_unused(
                    self,
                    name,
                    why=f"every one of eval.datasets sets its own {name}, which it runs at",
                    fix=f"remove eval.{name} (~recipe.eval.{name} on the command line), or "
                    f"the sets' own to take it",
                )
        return self

    @model_validator(mode="after")
    def check_reward_types_are_read(self) -> EvalConfig:
        """A custom function scores a set before any reward type, as in slime, so the set's
        reward_type beside one would grade nothing."""
        errors = []
        for i, dataset in enumerate(self.datasets):
            scorer = self.reward_function(i)
            if dataset.reward_type is None or scorer is None:
                continue
            key, path = scorer
            fix = (
                "remove reward_type from the set (the function reads a line's rm_type as "
                "sample.metadata['rm_type']), or remove the set's custom_reward_function"
                if key.startswith("eval.datasets.")
                else "remove reward_type from the set (the function reads a line's rm_type as "
                "sample.metadata['rm_type']), or name the function on the sets it scores "
                "(eval.datasets[].custom_reward_function) in place of eval.custom_reward_function"
            )
            errors.append(
                InvariantError(
                    f"datasets.{i}.reward_type={dataset.reward_type}: {key}={path} scores the "
                    f"set's every sample before any reward type (as slime's custom_rm_path does), "
                    "so the reward type grades nothing",
                    fields=(f"datasets.{i}.reward_type",),
                    fix=fix,
                )
            )
        if errors:
            raise InvariantError.all_of(errors)
        return self

    @model_validator(mode="after")
    def check_reward_function_has_datasets(self) -> EvalConfig:
        if not self.datasets:
            refuse_unused(
                self,
                "custom_reward_function",
                why="it scores the evaluation sets, and none is named",
                fix="name the sets in datasets, or remove custom_reward_function",
            )
        elif all(d.custom_reward_function for d in self.datasets):
            refuse_unused(
                self,
                "custom_reward_function",
                why="every one of eval.datasets names its own custom_reward_function, which "
                "scores it",
                fix="remove eval.custom_reward_function, or the sets' own to take it",
            )
        return self

    @model_validator(mode="after")
    def check_prompt_bound_has_datasets(self) -> EvalConfig:
        if not self.datasets:
            refuse_unused(
                self,
                "max_prompt_len",
                why="it bounds the prompts of the evaluation sets, and none is named",
                fix="name the sets in datasets, or remove max_prompt_len",
            )
        return self

    @model_validator(mode="after")
    @training_rule
    def check_interval_has_datasets(self) -> EvalConfig:
        if self.interval is not None and not self.datasets:
            raise InvariantError(
                f"interval={self.interval} asks for evaluation but no datasets are named",
                fields=("datasets",),
                fix="add datasets: [{name: aime, path: /path/aime-2024.jsonl}], or interval: null",
            )
        return self

    @model_validator(mode="after")
    def check_datasets_are_evaluated(self) -> EvalConfig:
        if self.datasets and self.interval is None and self.skip_before_train:
            raise InvariantError(
                "datasets are named but never evaluated: interval is null (no evaluation "
                "during or after training) and skip_before_train skips the one before it",
                fields=("interval",),
                fix="set interval (e.g. 20: every 20 rollouts and after the last), or remove "
                "skip_before_train to evaluate once before training",
            )
        return self

    @model_validator(mode="after")
    def check_sampling(self) -> EvalConfig:
        if self.temperature is not None and self.temperature < 0:
            raise InvariantError(
                f"temperature={self.temperature} is negative; the engines refuse it at the "
                "first evaluation, after the run has started",
                fields=("temperature",),
                fix="use 0 (greedy, with n_samples_per_prompt: 1), a positive value, or null "
                "(the rollout's temperature)",
            )
        if self.top_k is not None:
            check_top_k(self.top_k, "top_k")
        return self

    @property
    def greedy_by(self) -> tuple[str, str] | None:
        """What makes evaluation decode greedily (the most likely token every step), and how:
        a temperature below GREEDY_BELOW, or top_k=1; None where it samples (a null
        temperature is the rollout's, above GREEDY_BELOW; a null top_k the rollout's, which
        cuts nothing)."""
        if self.temperature is not None and self.temperature < GREEDY_BELOW:
            how = f"the engines' below {GREEDY_BELOW:g}"
            return f"temperature={self.temperature:g}", f"greedy decoding ({how})"
        if self.top_k == 1:
            return "top_k=1", "greedy decoding (one token kept each step)"
        return None

    @model_validator(mode="after")
    def check_greedy_samples_differ(self) -> EvalConfig:
        if self.greedy_by is None:
            return self
        setting, decoding = self.greedy_by
        many = [("n_samples_per_prompt", self.n_samples_per_prompt)] + [
            (f"datasets.{i}.n_samples_per_prompt", d.n_samples_per_prompt)
            for i, d in enumerate(self.datasets)
        ]
        errors = []
        for field, n in many:
            if n is not None and n > 1:
                errors.append(
                    InvariantError(
                        f"{field.rsplit('.', 1)[-1]}={n} with {setting}: {decoding} gives the same "
                        f"response {n} times, so the accuracy is one sample's and the evaluation "
                        f"costs {n}x",
                        fields=(field,),
                        fix="use n_samples_per_prompt: 1 for greedy evaluation, or sample: a "
                        "temperature above 0 (e.g. 0.6) and top_k -1 or above 1, to average "
                        "several samples",
                    )
                )
        if errors:
            raise InvariantError.all_of(errors)
        return self

    @model_validator(mode="after")
    def check_greedy_ignores_cuts(self) -> EvalConfig:
        if self.greedy_by is None:
            return self
        setting, decoding = self.greedy_by
        why = (
            f"{setting} means {decoding}, which picks the most likely token each step, and no "
            "top_p or top_k cut removes that token"
        )
        fix = "remove it for greedy evaluation, or sample with a temperature above 0 (e.g. 0.6)"
        if self.top_p is not None and self.top_p < 1:
            refuse_unused(self, "top_p", why=why, fix=fix)
        if self.top_k is not None and self.top_k > 1:
            refuse_unused(self, "top_k", why=why, fix=fix)
        return self

    @model_validator(mode="after")
    def check_dataset_names_unique(self) -> EvalConfig:
        names = [d.name for d in self.datasets]
        errors = []
        for i, name in enumerate(names):
            if name in names[:i]:
                errors.append(
                    InvariantError(
                        f"two eval datasets are named {name!r}: their metrics are logged under "
                        f"eval/{name}/..., so one overwrites the other",
                        fields=(f"datasets.{i}.name",),
                        fix=f"give each dataset its own name (e.g. {name}_{i})",
                    )
                )
        if errors:
            raise InvariantError.all_of(errors)
        return self
