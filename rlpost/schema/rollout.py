"""The rollout section (recipe.rollout): what each rollout generates, and how it samples."""

from __future__ import annotations

from typing import Any

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from rlpost.schema.base import InvariantError, Section, refuse_unused
from rlpost.schema.reward import RewardConfig
from rlpost.schema.training_only import training_rule

DEFAULT_MAX_DRAWS = 32
"""Draws a rollout may take to fill its batch through the dynamic sampling filter. verl's DAPO
scripts allow 10 draws of three batches' prompts (30 batches' worth); 32 allow as much without
over-sampling. A filter that keeps no group (rewards all equal, a filter's bug) would draw
forever."""

DEFAULT_EPISODE_TIMEOUT_S = 3600.0
"""A generate function call's own time (its tools and environments; its requests to the engines
not counted) past which the run stops. An hour: the most an episode's tools together may
plausibly take (a sandbox's test run per turn, over several turns), the same bound
engine.request_timeout_s sets one request; a tool that hangs costs an hour, not the run."""

GREEDY_BELOW = 1e-6
"""SGLang decodes greedily at any temperature below this (its _SAMPLING_EPS), as the CPU engine
does."""


def check_top_k(top_k: int, field: str) -> None:
    if top_k == 0 or top_k < -1:
        raise InvariantError(
            f"top_k={top_k} keeps no token to sample from (SGLang takes -1 for "
            '"all tokens", or a positive count)',
            fields=(field,),
            fix="use -1 (no top-k cut, the seeds' value) or a positive integer",
        )


class RolloutConfig(Section):
    num_rollout: NonNegativeInt
    batch_size: PositiveInt = Field(description="prompts per rollout")
    n_samples_per_prompt: PositiveInt = 1
    max_response_len: PositiveInt
    temperature: float = 1.0
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = -1
    stop: list[str] = Field(default_factory=list)
    stop_token_ids: list[int] = Field(default_factory=list)
    skip_special_tokens: bool = False
    over_sampling_batch_size: PositiveInt | None = None
    dynamic_sampling_filter: str | None = None
    max_draws_per_rollout: PositiveInt | None = Field(
        DEFAULT_MAX_DRAWS,
        description="the most draws (over_sampling_batch_size prompts each, else "
        "batch_size) a rollout may take to fill its batch through the dynamic_sampling_filter; "
        "past them the run stops, naming the filter (verl's "
        "algorithm.filter_groups.max_num_gen_batches; null: no limit)",
    )
    partial_rollout: bool = False
    mask_offpolicy_in_partial_rollout: bool = False
    buffer_filter: str | None = None
    generate_function: str | None = Field(
        None,
        description="async def fn(sample, ctx) -> Sample, by dotted path: multi-turn and "
        "tool-using rollouts (rlpost.runtime.rollout.context.GenerateContext)",
    )
    max_turns: PositiveInt = Field(
        1,
        description="policy turns a generate function may take per sample (ctx.max_turns); "
        "every turn counts in max_response_len",
    )
    episode_timeout_s: PositiveFloat | None = Field(
        DEFAULT_EPISODE_TIMEOUT_S,
        description="the most seconds one call of the generate function may run besides its "
        "requests to the engines (its tools, its environment, whatever else it awaits); past "
        "them the run stops, naming the function and the sample (null: no limit)",
    )
    generate_settings: dict[str, Any] = Field(
        default_factory=dict,
        description="the generate function's own settings (ctx.settings): tool URLs, "
        "timeouts, prompts",
    )
    max_concurrency: PositiveInt | None = Field(
        None,
        description="generate requests in flight over all engines (null: 512 per engine, "
        "slime's --sglang-server-concurrency default)",
    )
    reward: RewardConfig = Field(default_factory=RewardConfig)

    @model_validator(mode="after")
    @training_rule
    def check_runs_a_rollout(self) -> RolloutConfig:
        if self.num_rollout == 0:
            raise InvariantError(
                "num_rollout=0 runs no rollout, so a training run would train and evaluate "
                "nothing (an evaluation alone is a mode of its own, not a run of 0 rollouts)",
                fields=("num_rollout",),
                fix="set num_rollout >= 1; to evaluate model.hf_checkpoint (or model.load) "
                "alone, use mode=eval",
            )
        return self

    @model_validator(mode="after")
    def check_generate_settings_have_a_reader(self) -> RolloutConfig:
        if not self.generate_function:
            why = "the default generate function takes one turn and reads no settings"
            fix = "set generate_function to a multi-turn generate function, or remove it"
            refuse_unused(self, "max_turns", why=why, fix=fix)
            refuse_unused(self, "generate_settings", why=why, fix=fix)
            refuse_unused(
                self,
                "episode_timeout_s",
                why="the default generate function awaits nothing but its request to the "
                "engines, which engine.request_timeout_s bounds",
                fix="set generate_function to a generate function of your own, or remove "
                "episode_timeout_s",
            )
        return self

    @model_validator(mode="after")
    def check_temperature_positive(self) -> RolloutConfig:
        if self.temperature <= 0:
            raise InvariantError(
                f"temperature={self.temperature} must be > 0: GRPO needs sampled, diverse "
                "responses within a group, and the trainer divides logits by the temperature",
                fields=("temperature",),
                fix="use 1.0 (the seeds' value) or another positive value",
            )
        if self.temperature < GREEDY_BELOW:
            raise InvariantError(
                f"temperature={self.temperature:g} is below {GREEDY_BELOW:g}, where the engines "
                "decode greedily: a group's samples are one response n times, their advantages "
                "0, and the trainer divides the logits by a temperature nobody sampled at",
                fields=("temperature",),
                fix="use 1.0 (the seeds' value) or another temperature well above 0",
            )
        return self

    @model_validator(mode="after")
    def check_top_k(self) -> RolloutConfig:
        check_top_k(self.top_k, "top_k")
        return self

    @model_validator(mode="after")
    def check_sampling_untruncated(self) -> RolloutConfig:
        # The trainer scores each token under the full softmax of logits / temperature; it
        # does not replay the engines' top-p/top-k cut (TRL measured vLLM's importance weight
        # at the kept mass: 0.90 at top_p 0.9, 0.17 at top_k 50).
        cuts = [f"top_p={self.top_p}"] if self.top_p < 1 else []
        cuts += [f"top_k={self.top_k}"] if self.top_k > 0 else []
        if cuts:
            raise InvariantError(
                f"{' and '.join(cuts)} makes the engines sample from the truncated, "
                "renormalised distribution, and the trainer scores each token under the full "
                "one: the loss trains a policy nobody sampled from, and importance weights "
                "between the two (off_policy_correction, the async loops) compare "
                "probabilities over different sets of tokens",
                fields=("top_p" if self.top_p < 1 else "top_k",),
                fix="sample rollouts untruncated: top_p: 1.0 and top_k: -1 (the seeds' "
                "values); evaluation may truncate (eval.top_p, eval.top_k)",
            )
        return self

    @model_validator(mode="after")
    def check_stop_strings_not_empty(self) -> RolloutConfig:
        if "" in self.stop:
            kept = [s for s in self.stop if s]
            raise InvariantError(
                f"stop={self.stop!r} holds an empty string, which every text contains: each "
                "response would stop after its first token",
                fields=("stop",),
                fix=f"remove the empty string (stop: {kept!r}); an unset environment "
                "variable in an interpolation is a common source",
            )
        return self

    @model_validator(mode="after")
    @training_rule
    def check_over_sampling_has_filter(self) -> RolloutConfig:
        over = self.over_sampling_batch_size
        if over is not None and over > self.batch_size and not self.dynamic_sampling_filter:
            raise InvariantError(
                f"over_sampling_batch_size={over} starts {over} groups per draw for "
                f"batch_size={self.batch_size}, and no dynamic_sampling_filter is set: every "
                "group passes, so the extra groups are generated only to be aborted",
                fields=("over_sampling_batch_size",),
                fix="set dynamic_sampling_filter (e.g. "
                "rlpost.filters.check_reward_nonzero_std), or remove over_sampling_batch_size",
            )
        return self

    @model_validator(mode="after")
    @training_rule
    def check_over_sampling_covers_batch(self) -> RolloutConfig:
        over = self.over_sampling_batch_size
        if over is not None and over < self.batch_size:
            raise InvariantError(
                f"over_sampling_batch_size={over} is below batch_size={self.batch_size}: "
                "dynamic sampling draws over-sampling batches until batch_size groups pass",
                fields=("over_sampling_batch_size",),
                fix=f"set over_sampling_batch_size >= {self.batch_size} "
                f"(e.g. {2 * self.batch_size})",
            )
        return self

    @model_validator(mode="after")
    @training_rule
    def check_draw_limit_has_a_filter(self) -> RolloutConfig:
        if not self.dynamic_sampling_filter:
            refuse_unused(
                self,
                "max_draws_per_rollout",
                why="it bounds the draws a dynamic_sampling_filter may drop, and none is set: "
                "every group drawn is kept",
                fix="set dynamic_sampling_filter, or remove max_draws_per_rollout",
            )
        return self

    @model_validator(mode="after")
    @training_rule
    def check_partial_rollout_needs_over_sampling(self) -> RolloutConfig:
        if self.buffer_filter and not self.partial_rollout:
            raise InvariantError(
                "buffer_filter is set but partial_rollout is off, so no group ever reaches "
                "the buffer it filters",
                fields=("buffer_filter",),
                fix="set partial_rollout: true, or remove buffer_filter",
            )
        return self
