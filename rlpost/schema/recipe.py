"""The training recipe: data, rollout, algorithm, optimizer, eval, checkpoints."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BeforeValidator,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from rlpost.schema.base import InvariantError, LocalPath, Section, refuse_unused

# The reward types rlpost registers (rlpost.rewards.hub; a test holds the two together), and
# those that grade a response against the sample's label. "model" is no per-sample type:
# reward.model's class scores whole batches (rlpost.rewards.model).
# The boxed_ types (slime's) grade the last \\boxed{} answer of a response with the named
# grader, and pay its floor where there is none.
RewardType = Literal[
    "math", "deepscaler", "dapo", "f1", "gpqa", "boxed_f1", "boxed_gpqa", "remote", "model"
]
LABELLED_REWARD_TYPES = frozenset(
    {"math", "deepscaler", "dapo", "f1", "gpqa", "boxed_f1", "boxed_gpqa"}
)
# what a rule-based grader must find written in a response, with the answer after it
# (rlpost.rewards.answers), and what it pays when it does not
GRADER_MARKERS: dict[str, tuple[str, ...]] = {
    "math": ("\\boxed",),
    "deepscaler": ("</think>", "\\boxed"),
    "dapo": ("Answer:",),
    "boxed_f1": ("\\boxed",),
    "boxed_gpqa": ("\\boxed",),
}
GRADER_FLOOR = {
    "math": 0.0,
    "deepscaler": 0.0,
    "dapo": -1.0,
    "f1": 0.0,
    "gpqa": 0.0,
    "boxed_f1": 0.0,
    "boxed_gpqa": 0.0,
}
# slime's reward types that rlpost does not register: why, and what to use instead
UNREGISTERED_REWARD_TYPES: dict[str, tuple[str, str]] = {
    "ifbench": (
        "slime's ifbench grades with AllenAI's IFBench instruction checkers, which slime "
        "clones from GitHub and pip-installs while the run is under way; rlpost ships no "
        "such checker and installs nothing during a run",
        "score with custom_function: a function of your own that calls IFBench's checkers "
        "(installed beforehand), or type: remote with a reward server that runs them",
    ),
    "boxed_math": (
        "math grades the last \\boxed{} answer already, and slime's boxed_math looks for a "
        "box inside the boxed answer, which is never there: it pays 0 for every response",
        "use math",
    ),
    "boxed_deepscaler": (
        "deepscaler grades what follows </think>, which a boxed answer never holds: every "
        "response would score 0",
        "use deepscaler (it grades the last box after </think>), or math",
    ),
    "boxed_dapo": (
        "dapo grades the answer after 'Answer:', which a boxed answer never holds: every "
        "response would score -1",
        "use dapo (it reads a box after 'Answer:' too), or math",
    ),
    "boxed_remote": (
        "the reward server is sent the whole sample, never a boxed answer",
        "use remote, and have the server read the last box",
    ),
}


def check_reward_type_known(value: Any) -> Any:
    """A reward type slime has and rlpost does not register is refused with the reason
    (before the list of known types would be: that says what, not why)."""
    if isinstance(value, str) and value in UNREGISTERED_REWARD_TYPES:
        why, fix = UNREGISTERED_REWARD_TYPES[value]
        raise InvariantError(f"reward type {value!r} is not available: {why}", fields=(), fix=fix)
    return value


# What each advantage estimator reads (rlpost.algo.advantages registers them; a test holds
# the two together). Group baselines subtract the group's mean reward, so a group of one
# sample always gets advantage zero.
AdvantageEstimatorName = Literal[
    "grpo", "gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"
]
GROUP_BASELINE_ESTIMATORS = frozenset({"grpo", "gspo", "reinforce_plus_plus_baseline"})
KL_REWARD_ESTIMATORS = frozenset({"reinforce_plus_plus", "reinforce_plus_plus_baseline"})
GREEDY_BELOW = 1e-6
"""SGLang decodes greedily at any temperature below this (its _SAMPLING_EPS), as the CPU engine
does."""
DISCOUNTING_ESTIMATORS = frozenset({"reinforce_plus_plus"})
WHITENING_ESTIMATORS = frozenset({"reinforce_plus_plus", "reinforce_plus_plus_baseline"})
STD_SCALING_ESTIMATORS = frozenset({"grpo"})

# The shipped filter that keeps groups whose rewards differ (rlpost.filters).
NONZERO_STD_FILTER = "rlpost.filters.check_reward_nonzero_std"

# The widest clip epsilon that still binds on gspo's sequence ratios (its paper: 3e-4, 4e-4).
GSPO_MAX_CLIP = 0.01

OffPolicyCorrection = Literal["none", "tis", "decoupled_ppo"]
LoopMode = Literal["sync", "async", "fully_async"]


def check_top_k(top_k: int, field: str) -> None:
    if top_k == 0 or top_k < -1:
        raise InvariantError(
            f"top_k={top_k} keeps no token to sample from (SGLang takes -1 for "
            '"all tokens", or a positive count)',
            fields=(field,),
            fix="use -1 (no top-k cut, the seeds' value) or a positive integer",
        )


# The arguments rlpost passes to tokenizer.apply_chat_template itself (rlpost.data.prompts).
TEMPLATE_CALL_ARGUMENTS = frozenset(
    {"conversation", "add_generation_prompt", "tokenize", "continue_final_message", "tools"}
)


class DataConfig(Section):
    prompt_data: LocalPath | None = Field(
        None, description="a jsonl file of prompts (required unless `source` is set)"
    )
    source: str | None = Field(
        None,
        description="a data source class by dotted path (slime's RolloutDataSource): "
        "get_samples(n), add_samples(groups), state_dict(), load_state_dict(state); "
        "built as cls(ctx) with rlpost.data.source.SourceContext",
    )
    source_settings: dict[str, Any] = Field(
        default_factory=dict, description="the data source class's own settings (ctx.settings)"
    )
    input_key: str = "input"
    label_key: str | None = None
    metadata_key: str = "metadata"
    tool_key: str | None = Field(
        "tools",
        description="the field of a prompt line that holds its tools (a list of tool schemas, "
        "or a JSON string of one), passed to the chat template as `tools` and kept in the "
        "line's metadata as 'tools', as slime's --tool-key; null reads no tools",
    )
    apply_chat_template: bool = False
    apply_chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    shuffle: bool = False
    seed: int = 42
    max_prompt_len: PositiveInt | None = None

    @model_validator(mode="after")
    def check_prompts_have_a_source(self) -> DataConfig:
        if self.prompt_data is None and self.source is None:
            raise InvariantError(
                "no prompts: neither prompt_data (a jsonl file) nor source (a data source "
                "class) is set",
                fields=("prompt_data",),
                fix="set prompt_data: /path/train.jsonl, or source: my_pkg.data.MySource",
            )
        if self.source is None:
            refuse_unused(
                self,
                "source_settings",
                why="the jsonl source reads no settings",
                fix="set source to the class that reads them, or remove source_settings",
            )
        return self

    @model_validator(mode="after")
    def check_seed_orders_a_shuffle(self) -> DataConfig:
        if self.source is None and not self.shuffle:
            refuse_unused(
                self,
                "seed",
                why="the jsonl source draws the prompts in the file's order when shuffle is "
                "false, and seed only orders its shuffle (every seed gives the same order)",
                fix="set shuffle: true to draw the prompts in the seed's order, or remove seed",
            )
        return self

    @model_validator(mode="after")
    def check_template_kwargs_have_a_template(self) -> DataConfig:
        if not self.apply_chat_template:
            refuse_unused(
                self,
                "apply_chat_template_kwargs",
                why="they are passed to the tokenizer's chat template, and apply_chat_template "
                "is false: prompts are sent as written",
                fix="set apply_chat_template: true, or remove apply_chat_template_kwargs",
            )
        return self

    @model_validator(mode="after")
    def check_template_kwargs_are_the_templates(self) -> DataConfig:
        own = sorted(self.apply_chat_template_kwargs.keys() & TEMPLATE_CALL_ARGUMENTS)
        if own:
            raise InvariantError(
                f"{', '.join(own)} {'is' if len(own) == 1 else 'are'} set by rlpost itself when "
                "it renders a prompt (a generation prompt, as text, with the line's tools); "
                "passed again, every prompt would fail with 'got multiple values for keyword "
                "argument'",
                fields=("apply_chat_template_kwargs",),
                fix=f"remove {', '.join(own)}; apply_chat_template_kwargs are the template's "
                "own variables (enable_thinking, ...)"
                + ("; tools come from each prompt line's tool_key field" if "tools" in own else ""),
            )
        return self


class RewardConfig(Section):
    type: Annotated[RewardType, BeforeValidator(check_reward_type_known)] = "math"
    custom_function: str | None = None
    group: bool = False
    remote_url: str | None = None
    timeout_s: PositiveFloat = 30.0
    max_retries: NonNegativeInt = 3
    model: str | None = Field(
        None,
        description="a reward model class by dotted path, built once per run as cls(ctx) "
        "(rlpost.rewards.model.RewardModelContext) and called as `async __call__(samples) "
        "-> list[float]` on batches of samples; it scores every sample",
    )
    model_settings: dict[str, Any] = Field(
        default_factory=dict, description="the reward model's own settings (ctx.settings)"
    )
    model_placement: Literal["driver", "actor"] = Field(
        "driver",
        description="driver: in the launching process; actor: a Ray actor on a device slot "
        "of its own (a GPU on GPU hardware), taken from the hardware by the plan",
    )
    model_batch_size: PositiveInt = Field(
        64, description="samples per reward model call at most (groups are never split)"
    )

    @property
    def posts_to_server(self) -> bool:
        return self.type == "remote" and not self.custom_function

    @property
    def needs_label(self) -> bool:
        """Whether scoring compares responses with the sample's label."""
        return self.type in LABELLED_REWARD_TYPES and not self.custom_function

    @property
    def device_slots(self) -> int:
        """Device slots the reward model takes from the hardware."""
        return 1 if self.type == "model" and self.model_placement == "actor" else 0

    @model_validator(mode="after")
    def check_model_scores_alone(self) -> RewardConfig:
        if self.type == "model":
            if not self.model:
                raise InvariantError(
                    "reward type 'model' scores with a reward model class, and model is not set",
                    fields=("model",),
                    fix="set model: my_pkg.rm.MyRewardModel (a class built as cls(ctx) with "
                    "async def __call__(self, samples) -> list[float])",
                )
            why = "reward type 'model' scores every sample with reward.model"
            fix = "remove it, or choose another reward type"
            for name in ("custom_function", "group"):
                refuse_unused(self, name, why=why, fix=fix)
        else:
            why = f"reward type {self.type!r} uses no reward model class"
            fix = "set type: model, or remove it"
            for name in ("model", "model_settings", "model_placement", "model_batch_size"):
                refuse_unused(self, name, why=why, fix=fix)
        return self

    @model_validator(mode="after")
    def check_group_has_function(self) -> RewardConfig:
        if self.group and not self.custom_function:
            raise InvariantError(
                "group rewards call custom_function with a whole group, and custom_function "
                "is not set",
                fields=("group",),
                fix="set custom_function to 'module.fn' with def fn(samples) -> list[float], "
                "or group: false",
            )
        return self

    @model_validator(mode="after")
    def check_remote_has_url(self) -> RewardConfig:
        if self.posts_to_server and not self.remote_url:
            raise InvariantError(
                "reward type 'remote' posts each sample to a reward server, and remote_url is "
                "not set",
                fields=("remote_url",),
                fix="set remote_url: http://host:port/path",
            )
        return self  # a URL nothing posts to: RecipeConfig.check_remote_url_is_read

    @model_validator(mode="after")
    def check_remote_url_is_http(self) -> RewardConfig:
        url = self.remote_url
        if url is None:
            return self
        scheme, _, rest = url.partition("://")
        host = rest.split("/", 1)[0].rsplit("@", 1)[-1]
        if scheme not in ("http", "https") or not host:
            raise InvariantError(
                f"remote_url={_redacted(url)!r} is not an http(s) URL with a host",
                fields=("remote_url",),
                fix="write it as http://host:port/path or https://host/path",
            )
        return self


def _redacted(url: str) -> str:
    """The URL without a password (user:pass@host -> user:***@host)."""
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    if "@" not in authority:
        return url
    credentials, _, host = authority.rpartition("@")
    user = credentials.split(":", 1)[0]
    return f"{scheme}{sep}{user}:***@{host}{slash}{path}"


class RolloutConfig(Section):
    num_rollout: PositiveInt
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
    def check_generate_settings_have_a_reader(self) -> RolloutConfig:
        if not self.generate_function:
            why = "the default generate function takes one turn and reads no settings"
            fix = "set generate_function to a multi-turn generate function, or remove it"
            refuse_unused(self, "max_turns", why=why, fix=fix)
            refuse_unused(self, "generate_settings", why=why, fix=fix)
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
    def check_partial_rollout_needs_over_sampling(self) -> RolloutConfig:
        if self.buffer_filter and not self.partial_rollout:
            raise InvariantError(
                "buffer_filter is set but partial_rollout is off, so no group ever reaches "
                "the buffer it filters",
                fields=("buffer_filter",),
                fix="set partial_rollout: true, or remove buffer_filter",
            )
        return self


class AlgoConfig(Section):
    advantage_estimator: AdvantageEstimatorName = "grpo"
    grpo_std_normalization: bool = True
    normalize_advantages: bool = False
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    use_kl_loss: bool = False
    kl_loss_coef: NonNegativeFloat = 0.0
    kl_loss_type: Literal["k1", "k2", "k3", "low_var_kl"] = "k1"
    kl_coef: NonNegativeFloat = 0.0
    kl_metric_interval: NonNegativeInt = Field(
        0,
        description="measure the policy's KL to the reference every N rollouts when it "
        "weighs in neither the loss nor the reward (0: never; the reference model is then "
        "neither loaded nor run). Where the KL weighs, it is measured every rollout",
    )
    entropy_coef: NonNegativeFloat = 0.0
    eps_clip: PositiveFloat = 0.2
    eps_clip_high: PositiveFloat | None = None
    eps_clip_c: PositiveFloat | None = None
    loss_reduction: Literal["sample_mean", "token_mean"] = "sample_mean"
    off_policy_correction: OffPolicyCorrection = Field(
        "none",
        description="how the loss corrects for tokens sampled by another policy than the one "
        "trained (the engines' numerics, or an older version in the async loops): tis "
        "multiplies by the importance weight pi_old/pi_rollout clamped to [tis_clip_low, "
        "tis_clip_high]; decoupled_ppo clips the ratio against the proximal policy "
        "(recomputed at train time) and weighs by pi_prox/pi_behaviour, dropping tokens whose "
        "weight exceeds behaviour_weight_cap",
    )
    tis_clip_low: NonNegativeFloat = 0.0
    tis_clip_high: PositiveFloat = 2.0
    behaviour_weight_cap: PositiveFloat = 5.0

    @property
    def kl_in_reward(self) -> bool:
        """The estimator puts a KL penalty into the reward (needs the reference's logprobs)."""
        return self.kl_coef > 0 and self.advantage_estimator in KL_REWARD_ESTIMATORS

    @property
    def kl_in_loss(self) -> bool:
        """A KL term with a weight in the loss (use_kl_loss with kl_loss_coef 0 weighs
        nothing: the seeds' recipes log a KL that way)."""
        return self.use_kl_loss and self.kl_loss_coef > 0

    @property
    def reference_interval(self) -> int:
        """Rollouts between reference forwards: 1 where the KL weighs in the loss or the
        reward, kl_metric_interval where it is only measured; 0: the reference never runs."""
        if self.kl_in_loss or self.kl_in_reward:
            return 1
        return self.kl_metric_interval

    @model_validator(mode="after")
    def check_kl_metric_interval(self) -> AlgoConfig:
        if self.kl_in_loss or self.kl_in_reward:
            where = "loss (kl_loss_coef > 0)" if self.kl_in_loss else "reward (kl_coef > 0)"
            refuse_unused(
                self,
                "kl_metric_interval",
                why=f"the KL weighs in the {where}, so it is measured every rollout",
                fix="remove it",
            )
        return self

    @model_validator(mode="after")
    def check_kl_counted_once(self) -> AlgoConfig:
        if self.kl_in_reward and self.kl_in_loss:
            raise InvariantError(
                f"kl_coef={self.kl_coef} puts the KL to the reference into the reward, and "
                f"kl_loss_coef={self.kl_loss_coef} (use_kl_loss) into the loss as well: the "
                "reference pulls twice, at a strength neither coefficient states",
                fields=("kl_coef",),
                fix="keep one: kl_coef: 0 (the KL in the loss), or use_kl_loss: false (the KL "
                "in the reward)",
            )
        return self

    @model_validator(mode="after")
    def check_kl_loss_has_a_gradient(self) -> AlgoConfig:
        if self.kl_in_loss and self.kl_loss_type == "k1":
            raise InvariantError(
                f"kl_loss_type=k1 with kl_loss_coef={self.kl_loss_coef}: as a loss, k1 = log "
                "pi - log pi_ref has the gradient of log pi alone, zero in expectation, so the "
                "reference never pulls on the policy and the term only adds noise",
                fields=("kl_loss_type",),
                fix="use kl_loss_type: low_var_kl (the seeds' choice) or k3; k1 is the "
                "estimator for a KL in the reward (kl_coef)",
            )
        return self

    @model_validator(mode="after")
    def check_estimator_reads_its_settings(self) -> AlgoConfig:
        name = self.advantage_estimator
        fix = "remove it, or pick an estimator that uses it"
        if name not in KL_REWARD_ESTIMATORS:
            refuse_unused(
                self,
                "kl_coef",
                why=f"{name} does not put a KL penalty into the reward (only "
                f"{', '.join(sorted(KL_REWARD_ESTIMATORS))} do); the KL loss term is "
                "use_kl_loss with kl_loss_coef",
                fix="use use_kl_loss: true with kl_loss_coef, or remove kl_coef",
            )
        if name not in DISCOUNTING_ESTIMATORS:
            refuse_unused(self, "gamma", why=f"{name} does not discount returns", fix=fix)
        if name not in STD_SCALING_ESTIMATORS:
            refuse_unused(
                self,
                "grpo_std_normalization",
                why=f"only grpo divides by the group's reward std, and the estimator is {name}",
                fix=fix,
            )
        if name in WHITENING_ESTIMATORS:
            refuse_unused(
                self,
                "normalize_advantages",
                why=f"{name} always whitens its advantages",
                fix="remove it",
            )
        return self

    @model_validator(mode="after")
    def check_tis_settings(self) -> AlgoConfig:
        correction = self.off_policy_correction
        if correction != "tis":
            for name in ("tis_clip_low", "tis_clip_high"):
                refuse_unused(
                    self,
                    name,
                    why=f"off_policy_correction is {correction}, not tis",
                    fix=f"set off_policy_correction: tis, or remove {name}",
                )
        if correction != "decoupled_ppo":
            refuse_unused(
                self,
                "behaviour_weight_cap",
                why=f"off_policy_correction is {correction}, not decoupled_ppo",
                fix="set off_policy_correction: decoupled_ppo, or remove behaviour_weight_cap",
            )
        if correction == "tis" and self.tis_clip_low >= self.tis_clip_high:
            raise InvariantError(
                f"tis_clip_low={self.tis_clip_low} is not below tis_clip_high="
                f"{self.tis_clip_high}: every importance weight would be clamped to one value",
                fields=("tis_clip_low",),
                fix="use a low bound below the high one (e.g. 0.0 and 2.0)",
            )
        low, high = self.tis_clip_low, self.tis_clip_high
        if correction == "tis" and not low <= 1.0 <= high:
            bound, key = (high, "tis_clip_high") if high < 1.0 else (low, "tis_clip_low")
            raise InvariantError(
                f"the importance weights' range [{low:g}, {high:g}] does not hold 1, the weight "
                "of a token the trained policy would sample as the engines did: every "
                f"on-policy token's loss would be scaled by {bound:g}, as by a learning rate "
                f"{bound:g}x the one set",
                fields=(key,),
                fix="bound the weights around 1: tis_clip_low <= 1 <= tis_clip_high (slime's "
                "defaults: 0 and 2)",
            )
        return self

    @model_validator(mode="after")
    def check_clips_are_epsilons(self) -> AlgoConfig:
        # 1.0 is a deliberate "no low clip"; above it, 1 + eps or another coefficient was meant
        if self.eps_clip > 1.0:
            raise InvariantError(
                f"eps_clip={self.eps_clip} is the epsilon of the ratio's range [1 - eps_clip, "
                f"1 + eps_clip], and 1 - {self.eps_clip} < 0: the low side never clips, so "
                "negative-advantage tokens are pushed down without bound (eps_clip_c is the "
                "dual-clip coefficient)",
                fields=("eps_clip",),
                fix="write the epsilon, not 1 + epsilon: e.g. 0.2 (the seeds' value)",
            )
        high = self.eps_clip_high
        if high is not None and high < self.eps_clip:
            raise InvariantError(
                f"eps_clip_high={high} is below eps_clip={self.eps_clip}: clip-higher widens "
                "the upper side of the ratio's range (DAPO), and this narrows it instead",
                fields=("eps_clip_high",),
                fix=f"use a value >= {self.eps_clip} (DAPO: 0.28 with eps_clip 0.2), or remove "
                "eps_clip_high for a symmetric range",
            )
        if high is not None and high > 1.0:
            raise InvariantError(
                f"eps_clip_high={high} is an epsilon (the ratio's upper bound is 1 + "
                f"eps_clip_high = {1 + high:g}), not the bound itself: a token's probability "
                f"could grow {1 + high:g}x in one update",
                fields=("eps_clip_high",),
                fix=f"write the epsilon: e.g. {high - 1:.2f} for a bound of {high:g}, or 0.28 "
                "(DAPO's clip-higher, the seeds' value)",
            )
        return self

    @model_validator(mode="after")
    def check_behaviour_cap_keeps_on_policy_tokens(self) -> AlgoConfig:
        cap = self.behaviour_weight_cap
        if self.off_policy_correction == "decoupled_ppo" and cap <= 1.0:
            raise InvariantError(
                f"behaviour_weight_cap={cap} drops every token whose weight "
                "pi_prox/pi_behaviour exceeds it, "
                "and a token the trained policy sampled itself has a weight of about 1: "
                f"{'about half' if cap == 1.0 else 'nearly all'} of the tokens would be dropped",
                fields=("behaviour_weight_cap",),
                fix="use a cap above 1 (e.g. 5.0, the default)",
            )
        return self

    @model_validator(mode="after")
    def check_dual_clip_above_one(self) -> AlgoConfig:
        if self.eps_clip_c is not None and self.eps_clip_c <= 1.0:
            raise InvariantError(
                f"eps_clip_c={self.eps_clip_c} must be > 1: dual clip bounds the loss of "
                "negative-advantage tokens at eps_clip_c times the advantage",
                fields=("eps_clip_c",),
                fix="use 3.0 (a common value) or null to turn dual clip off",
            )
        return self

    @model_validator(mode="after")
    def check_sequence_clip_is_narrow(self) -> AlgoConfig:
        # gspo clips exp(mean log ratio) of a whole response, which moves about 1/length as
        # much as one token's ratio; its paper clips at 3e-4 and 4e-4
        wide = [
            (name, value)
            for name, value in (("eps_clip", self.eps_clip), ("eps_clip_high", self.eps_clip_high))
            if value is not None and value > GSPO_MAX_CLIP
        ]
        if self.advantage_estimator == "gspo" and wide:
            name, value = wide[0]
            raise InvariantError(
                f"{name}={value} with advantage_estimator=gspo: gspo clips each response's "
                "sequence ratio (the mean of its tokens' log ratios), which moves far less "
                "than a token's ratio, so a range of token-level width never binds and the "
                "update is unclipped",
                fields=(name,),
                fix="use gspo's own range: eps_clip: 3e-4 and eps_clip_high: 4e-4 (the GSPO "
                f"paper's; at most {GSPO_MAX_CLIP})",
            )
        return self

    @model_validator(mode="after")
    def check_sequence_loss_averages_sequences(self) -> AlgoConfig:
        if self.advantage_estimator == "gspo" and self.loss_reduction == "token_mean":
            raise InvariantError(
                "loss_reduction=token_mean with advantage_estimator=gspo: gspo's objective is "
                "a mean over responses (one ratio and one advantage each), and token_mean "
                "weighs each response by its token count, so long responses outweigh short "
                "ones in proportion to their length",
                fields=("loss_reduction",),
                fix="use loss_reduction: sample_mean (each response's token mean, then the "
                "mean over responses), or advantage_estimator: grpo for token-level ratios",
            )
        return self


class OptimConfig(Section):
    optimizer: Literal["adam"] = "adam"
    lr: PositiveFloat = 1e-6
    min_lr: NonNegativeFloat = 0.0
    lr_decay_style: Literal["constant", "linear", "cosine"] = "constant"
    lr_warmup_steps: NonNegativeInt = 0
    lr_decay_steps: PositiveInt | None = None
    weight_decay: NonNegativeFloat = 0.0
    adam_beta1: float = Field(0.9, ge=0.0, lt=1.0)
    adam_beta2: float = Field(0.999, ge=0.0, lt=1.0)
    adam_eps: PositiveFloat = 1e-8
    clip_grad: NonNegativeFloat = 1.0
    cpu_offload: bool = False
    overlap_cpu_optimizer_d2h_h2d: bool = False
    precision_aware_optimizer: bool = False

    @model_validator(mode="after")
    def check_schedule(self) -> OptimConfig:
        if self.lr_decay_style == "constant":
            why = "lr_decay_style is constant"
            for name in ("lr_decay_steps", "min_lr"):
                refuse_unused(
                    self,
                    name,
                    why=why,
                    fix=f"set lr_decay_style: linear or cosine, or remove {name}",
                )
            return self
        if self.lr_decay_steps is None:
            raise InvariantError(
                f"lr_decay_style={self.lr_decay_style} decays the learning rate to min_lr by "
                "step lr_decay_steps, which is not set",
                fields=("lr_decay_steps",),
                fix="set lr_decay_steps (e.g. the run's optimizer steps), or use "
                "lr_decay_style: constant",
            )
        if self.lr_decay_steps <= self.lr_warmup_steps:
            raise InvariantError(
                f"lr_decay_steps={self.lr_decay_steps} must exceed lr_warmup_steps="
                f"{self.lr_warmup_steps}: decay starts when warmup ends",
                fields=("lr_decay_steps",),
                fix=f"set lr_decay_steps above {self.lr_warmup_steps}",
            )
        if self.min_lr > self.lr:
            raise InvariantError(
                f"min_lr={self.min_lr} is above lr={self.lr}: the schedule would raise the "
                "learning rate while it 'decays'",
                fields=("min_lr",),
                fix=f"set min_lr below {self.lr} (e.g. {self.lr / 10:g})",
            )
        return self

    @model_validator(mode="after")
    def check_offload_options(self) -> OptimConfig:
        if not self.cpu_offload:
            refuse_unused(
                self,
                "overlap_cpu_optimizer_d2h_h2d",
                why="it overlaps the copies of a CPU-offloaded optimizer, and cpu_offload is off",
                fix="set cpu_offload: true, or remove it",
            )
        return self


class TrainConfig(Section):
    global_batch_size: PositiveInt
    micro_batch_size: PositiveInt = 1
    use_dynamic_batch_size: bool = False
    max_tokens_per_gpu: PositiveInt | None = None
    balance_data: bool = False
    mtp_training: bool = Field(
        False,
        description="train the model's multi-token-prediction layers (model.mtp_num_layers) "
        "beside the policy, so a speculative decoder that drafts with them keeps up with it",
    )
    mtp_loss_scaling_factor: PositiveFloat = Field(
        0.2, description="weight of the MTP loss (mean over MTP layers) beside the policy loss"
    )

    @model_validator(mode="after")
    def check_batching_settings_used(self) -> TrainConfig:
        if self.use_dynamic_batch_size:
            refuse_unused(
                self,
                "micro_batch_size",
                why="use_dynamic_batch_size packs micro-batches by max_tokens_per_gpu, not by "
                "a sample count",
                fix="remove micro_batch_size (or set it to 1), or use_dynamic_batch_size: false",
            )
        else:
            refuse_unused(
                self,
                "max_tokens_per_gpu",
                why="micro-batches hold micro_batch_size samples each when "
                "use_dynamic_batch_size is false",
                fix="set use_dynamic_batch_size: true to pack by tokens, or "
                "max_tokens_per_gpu: null",
            )
        return self

    @model_validator(mode="after")
    def check_mtp_settings_used(self) -> TrainConfig:
        if not self.mtp_training:
            refuse_unused(
                self,
                "mtp_loss_scaling_factor",
                why="it weighs the multi-token-prediction loss, and mtp_training is off",
                fix="set mtp_training: true, or remove mtp_loss_scaling_factor",
            )
        return self

    @model_validator(mode="after")
    def check_dynamic_batch_has_cap(self) -> TrainConfig:
        if self.use_dynamic_batch_size and self.max_tokens_per_gpu is None:
            raise InvariantError(
                "use_dynamic_batch_size packs samples into micro-batches up to "
                "max_tokens_per_gpu, which is not set",
                fields=("max_tokens_per_gpu",),
                fix="set max_tokens_per_gpu (the seeds use 4608-16384 on H100), "
                "or use_dynamic_batch_size: false",
            )
        return self


# What an evaluation set may grade with in place of rollout.reward.type: a rule-based type or
# the reward server (a reward model scores every sample, whatever its set).
EvalRewardType = Annotated[
    Literal["math", "deepscaler", "dapo", "f1", "gpqa", "boxed_f1", "boxed_gpqa", "remote"],
    BeforeValidator(check_reward_type_known),
]


class EvalDataset(Section):
    name: str
    path: LocalPath
    reward_type: EvalRewardType | None = Field(
        None,
        description="grade this set's every line with this reward type, whatever "
        "rollout.reward.type and a line's metadata rm_type say (slime's eval config's "
        "rm_type)",
    )
    input_key: str | None = None
    label_key: str | None = None
    tool_key: str | None = Field(
        None, description="the field holding a line's tools (null: the data section's tool_key)"
    )
    n_samples_per_prompt: PositiveInt | None = None
    max_response_len: PositiveInt | None = None


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
        for field, n in many:
            if n is not None and n > 1:
                raise InvariantError(
                    f"{field.rsplit('.', 1)[-1]}={n} with {setting}: {decoding} gives the same "
                    f"response {n} times, so the accuracy is one sample's and the evaluation "
                    f"costs {n}x",
                    fields=(field,),
                    fix="use n_samples_per_prompt: 1 for greedy evaluation, or sample: a "
                    "temperature above 0 (e.g. 0.6) and top_k -1 or above 1, to average "
                    "several samples",
                )
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
        for i, name in enumerate(names):
            if name in names[:i]:
                raise InvariantError(
                    f"two eval datasets are named {name!r}: their metrics are logged under "
                    f"eval/{name}/..., so one overwrites the other",
                    fields=(f"datasets.{i}.name",),
                    fix=f"give each dataset its own name (e.g. {name}_{i})",
                )
        return self


class SaveConfig(Section):
    interval: PositiveInt | None = None
    keep_last: PositiveInt = 3
    save_hf_interval: PositiveInt | None = None
    save_optimizer: bool = True


class LoopConfig(Section):
    """How rollout and training interleave: one pipeline (a producer of rewarded groups, a
    bounded queue, the trainer) whose bounds each mode sets.

    - sync: rollout N is generated with the weights after N train steps.
    - async (slime's train_async.py): rollout N+1 is generated while rollout N trains; samples
      are at most `update_weights_interval` policy versions old.
    - fully_async: a producer generates continuously into a queue of `max_buffered_groups`
      groups; the trainer takes a batch as soon as one is there; a group whose oldest token
      would be more than `max_staleness` versions behind the trained version is dropped or
      regenerated (`stale_groups`). Weight updates interrupt generation: requests are
      paused, the weights swapped, and generation continues under the new version.
    """

    mode: LoopMode = "sync"
    update_weights_interval: PositiveInt = Field(
        1,
        description="rollouts between weight updates to the engines (slime's "
        "--update-weights-interval); an evaluation updates them too",
    )
    max_staleness: NonNegativeInt | None = Field(
        None,
        description="fully_async: policy versions a trained token may lag behind the trained "
        "version (null: 4); sync and async derive it (interval - 1, interval)",
    )
    max_buffered_groups: PositiveInt | None = Field(
        None,
        description="fully_async: groups generated or generating ahead of the trainer (slime's "
        "--async-buffer-size; null: two rollouts' worth); async derives it",
    )
    stale_groups: Literal["drop", "regenerate"] = Field(
        "regenerate",
        description="fully_async: a group past max_staleness is dropped, or its prompt is "
        "generated again under the current weights (both counted)",
    )

    @model_validator(mode="after")
    def check_bounds_belong_to_fully_async(self) -> LoopConfig:
        if self.mode != "fully_async":
            for name in ("max_staleness", "max_buffered_groups", "stale_groups"):
                refuse_unused(
                    self,
                    name,
                    why=f"loop.mode {self.mode} sets the pipeline's bounds itself (sync: "
                    "generation waits for the weights; async: one rollout ahead, at most "
                    "update_weights_interval versions old)",
                    fix=f"set mode: fully_async, or remove {name}",
                )
        elif self.max_staleness is not None and self.max_staleness + 1 < (
            self.update_weights_interval
        ):
            raise InvariantError(
                f"max_staleness={self.max_staleness} is below update_weights_interval - 1 = "
                f"{self.update_weights_interval - 1}: with weights pushed every "
                f"{self.update_weights_interval} steps, groups generated right after a push "
                "would already be too old to train",
                fields=("max_staleness",),
                fix=f"use max_staleness >= {self.update_weights_interval - 1}, or push weights "
                "more often",
            )
        return self


def _prompts_filling_steps(prompts: int, n: int, gbs: int) -> str:
    """A rollout.batch_size for a fix, with the whole optimizer steps its samples fill."""
    steps = prompts * n // gbs
    return f"{prompts} prompts ({prompts} x {n} = {prompts * n} samples: {steps} step" + (
        "s per rollout)" if steps > 1 else " per rollout)"
    )


class RecipeConfig(Section):
    name: str
    description: str = ""
    data: DataConfig
    rollout: RolloutConfig
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    train: TrainConfig
    eval: EvalConfig = Field(default_factory=EvalConfig)
    save: SaveConfig = Field(default_factory=SaveConfig)
    loop: LoopConfig = Field(default_factory=LoopConfig)

    @model_validator(mode="after")
    def check_eval_reward_types_are_read(self) -> RecipeConfig:
        reward = self.rollout.reward
        scorer = (
            "the reward model (rollout.reward.type=model)"
            if reward.type == "model"
            else "the group function (rollout.reward.group)"
            if reward.group
            else None
        )
        for i, dataset in enumerate(self.eval.datasets):
            if dataset.reward_type is not None and scorer is not None:
                raise InvariantError(
                    f"eval.datasets.{i}.reward_type={dataset.reward_type}: {scorer} scores "
                    "every sample, whatever its set, and never reads it",
                    fields=(f"eval.datasets.{i}.reward_type",),
                    fix="remove reward_type from the set, or grade with a rule-based "
                    "rollout.reward.type",
                )
        return self

    @model_validator(mode="after")
    def check_remote_url_is_read(self) -> RecipeConfig:
        """The reward server's URL serves reward type 'remote' and every evaluation set
        graded 'remote': one of them without it would fail every sample it scores, and a URL
        none of them posts to is never read."""
        reward = self.rollout.reward
        remote_sets = [
            i for i, dataset in enumerate(self.eval.datasets) if dataset.reward_type == "remote"
        ]
        if remote_sets and not reward.remote_url:
            i = remote_sets[0]
            raise InvariantError(
                f"eval.datasets.{i}.reward_type=remote posts each of the set's samples to a "
                "reward server, and rollout.reward.remote_url is not set: every one would fail",
                fields=(f"eval.datasets.{i}.reward_type",),
                fix="set rollout.reward.remote_url: http://host:port/path (the server every "
                "remote set and sample posts to), or give the set a rule-based reward_type",
            )
        if not reward.posts_to_server and not remote_sets:
            why = (
                "only reward type 'remote' (without custom_function) and evaluation sets "
                "with reward_type: remote talk to a reward server"
            )
            fix = "remove it, or set type: remote"
            refuse_unused(reward, "remote_url", why=why, fix=fix, prefix="rollout.reward.")
            refuse_unused(reward, "max_retries", why=why, fix=fix, prefix="rollout.reward.")
        return self

    @model_validator(mode="after")
    def check_batch_divides(self) -> RecipeConfig:
        n = self.rollout.n_samples_per_prompt
        samples = self.rollout.batch_size * n
        gbs = self.train.global_batch_size
        # Prompt counts whose samples fill whole steps are the multiples of this one.
        step_prompts = gbs // math.gcd(gbs, n)
        if gbs > samples:
            raise InvariantError(
                f"train.global_batch_size={gbs} is more than the {samples} samples a rollout "
                f"makes (rollout.batch_size x rollout.n_samples_per_prompt = "
                f"{self.rollout.batch_size} x {n}): no optimizer step would ever fill, and the "
                "run would train nothing",
                fields=("train.global_batch_size",),
                fix=f"set train.global_batch_size to {samples} (one step per rollout) or a "
                f"divisor of it, or raise rollout.batch_size to "
                f"{_prompts_filling_steps(step_prompts, n, gbs)}",
            )
        if samples % gbs:
            divisors = [d for d in range(samples, 0, -1) if samples % d == 0][:3]
            prompts = max(1, round(self.rollout.batch_size / step_prompts)) * step_prompts
            raise InvariantError(
                f"rollout.batch_size x rollout.n_samples_per_prompt = "
                f"{self.rollout.batch_size} x {n} = {samples} "
                f"samples per rollout is not a multiple of train.global_batch_size={gbs}; "
                "the trailing samples would be dropped every rollout",
                fields=("train.global_batch_size",),
                fix=f"set train.global_batch_size to a divisor of {samples} "
                f"(e.g. {', '.join(map(str, divisors))}), or rollout.batch_size to "
                f"{_prompts_filling_steps(prompts, n, gbs)}",
            )
        return self

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps over the whole run (each rollout's samples / global batch)."""
        per_rollout = self.rollout.batch_size * self.rollout.n_samples_per_prompt
        return self.rollout.num_rollout * max(1, per_rollout // self.train.global_batch_size)

    @model_validator(mode="after")
    def check_groups_carry_signal(self) -> RecipeConfig:
        name, n = self.algo.advantage_estimator, self.rollout.n_samples_per_prompt
        if n == 1 and name in GROUP_BASELINE_ESTIMATORS:
            others = sorted(set(get_args(AdvantageEstimatorName)) - GROUP_BASELINE_ESTIMATORS)
            raise InvariantError(
                f"rollout.n_samples_per_prompt=1 with algo.advantage_estimator={name}: {name} "
                "subtracts each group's mean reward, so a group of one sample always gets "
                "advantage 0 and the run trains nothing",
                fields=("rollout.n_samples_per_prompt",),
                fix="sample several responses per prompt (the seeds use 8), or use an "
                f"estimator that works with groups of one: {', '.join(others)}",
            )
        return self

    @model_validator(mode="after")
    def check_filter_can_pass_groups(self) -> RecipeConfig:
        rollout = self.rollout
        if rollout.dynamic_sampling_filter == NONZERO_STD_FILTER and (
            rollout.n_samples_per_prompt == 1
        ):
            raise InvariantError(
                f"rollout.dynamic_sampling_filter={NONZERO_STD_FILTER} keeps groups whose "
                "rewards differ, and with rollout.n_samples_per_prompt=1 every group holds one "
                "reward: every group is dropped, and the rollout draws prompts forever",
                fields=("rollout.dynamic_sampling_filter",),
                fix="sample several responses per prompt (e.g. n_samples_per_prompt: 8), or "
                "remove the filter (and over_sampling_batch_size)",
            )
        return self

    @model_validator(mode="after")
    def check_decay_spans_run(self) -> RecipeConfig:
        optim, steps = self.optim, self.optimizer_steps
        decay, rollouts = optim.lr_decay_steps, self.rollout.num_rollout
        if decay is not None and decay == rollouts < steps:
            raise InvariantError(
                f"optim.lr_decay_steps={decay} is the run's rollouts, and it counts optimizer "
                f"steps: with {steps // rollouts} steps a rollout the decay ends at rollout "
                f"{-(-decay * rollouts // steps)} of {rollouts}, and the rest of the run "
                f"trains at min_lr={optim.min_lr:g}",
                fields=("optim.lr_decay_steps",),
                fix=f"set optim.lr_decay_steps: {steps} (the run's optimizer steps)",
            )
        if decay is not None and decay < steps and optim.min_lr == 0:
            raise InvariantError(
                f"optim.lr_decay_steps={decay} ends the decay {steps - decay} optimizer steps "
                f"before the run's {steps} ({self.rollout.num_rollout} rollouts), and min_lr is "
                f"0: the last {steps - decay} steps would train with a learning rate of 0",
                fields=("optim.lr_decay_steps",),
                fix=f"set optim.lr_decay_steps: {steps} (the run's optimizer steps), or a "
                "min_lr above 0 to hold after the decay",
            )
        if decay is not None and decay > steps:
            share = (steps - optim.lr_warmup_steps) / (decay - optim.lr_warmup_steps)
            raise InvariantError(
                f"optim.lr_decay_steps={optim.lr_decay_steps} is beyond the run's {steps} "
                f"optimizer steps ({self.rollout.num_rollout} rollouts): the run ends "
                f"{share:.0%} of the way through the {optim.lr_decay_style} decay, and the "
                f"learning rate never reaches min_lr={optim.min_lr:g}",
                fields=("optim.lr_decay_steps",),
                fix=f"set optim.lr_decay_steps: {steps} (the run's optimizer steps), or more "
                "rollouts",
            )
        return self

    @model_validator(mode="after")
    def check_buffer_holds_a_batch(self) -> RecipeConfig:
        buffered, batch = self.loop.max_buffered_groups, self.rollout.batch_size
        if self.loop.mode == "fully_async" and buffered is not None and buffered < batch:
            raise InvariantError(
                f"loop.max_buffered_groups={buffered} is below rollout.batch_size={batch}: "
                f"the trainer waits for {batch} finished groups, and the producer stops "
                f"drawing at {buffered}, so the run hangs before its first step",
                fields=("loop.max_buffered_groups",),
                fix=f"set loop.max_buffered_groups >= {batch} (e.g. {2 * batch}, two rollouts' "
                "worth), or remove it",
            )
        return self

    @model_validator(mode="after")
    def check_reward_has_labels(self) -> RecipeConfig:
        reward = self.rollout.reward
        if not reward.needs_label:
            return self
        if self.data.label_key is None:
            raise InvariantError(
                f"rollout.reward.type={reward.type} grades each response against the "
                "prompt's label, and data.label_key is not set: every sample would fail",
                fields=("data.label_key",),
                fix="set data.label_key to the jsonl field holding the answer (the seeds use "
                "label), or use a reward that needs no label",
            )
        return self

    def eval_requests(self) -> list[tuple[str, int]]:
        """The longest request (prompt + response) of each evaluation set that can outgrow
        training's, keyed by what sets its response length (one entry a key): the prompt
        counts eval.max_prompt_len (0 where unset: the prompts add to it, and are checked
        once tokenized); a set at the rollout's response length is listed under
        eval.max_prompt_len, and only when that is set (else training's bound covers it)."""
        ev = self.eval
        prompt = ev.max_prompt_len or 0
        found: dict[str, int] = {}
        for i, dataset in enumerate(ev.datasets):
            if dataset.max_response_len:
                found[f"eval.datasets.{i}.max_response_len"] = prompt + dataset.max_response_len
            elif ev.max_response_len:
                found["eval.max_response_len"] = prompt + ev.max_response_len
            elif ev.max_prompt_len:
                found["eval.max_prompt_len"] = prompt + self.rollout.max_response_len
        return list(found.items())

    def rule_graders(self) -> list[tuple[str, str]]:
        """(key, reward type) for each rule-based grader the run uses: the rollout's type,
        unless a custom or group function scores in its place, and each evaluation set's own
        (a set without one is graded as training is)."""
        reward = self.rollout.reward
        graders: list[tuple[str, str]] = []
        if reward.type in LABELLED_REWARD_TYPES and not (reward.custom_function or reward.group):
            graders.append(("rollout.reward.type", reward.type))
        graders += [
            (f"eval.datasets.{i}.reward_type", d.reward_type)
            for i, d in enumerate(self.eval.datasets)
            if d.reward_type in LABELLED_REWARD_TYPES
        ]
        return graders

    @model_validator(mode="after")
    def check_stops_leave_the_answer(self) -> RecipeConfig:
        """A stop string the grader's marker holds (or that holds it) ends every response
        at or right after the marker, before the answer the grader reads after it."""
        for key, kind in self.rule_graders():
            for marker in GRADER_MARKERS.get(kind, ()):
                for stop in self.rollout.stop:
                    if stop.casefold() in marker.casefold() or marker.casefold() in stop.casefold():
                        raise InvariantError(
                            f"{key}={kind} grades the answer a response writes after "
                            f"'{marker}', and rollout.stop holds '{stop}': generation stops "
                            "there (the stop string ends the text), before any answer, so "
                            f"every response it grades scores {GRADER_FLOOR[kind]:g} and no "
                            "group has a signal",
                            fields=("rollout.stop",),
                            fix=f"remove '{stop}' from rollout.stop; the end-of-turn token "
                            "ends a response",
                        )
        return self

    @model_validator(mode="after")
    def check_reward_model_batch_holds_a_group(self) -> RecipeConfig:
        """A reward model call never splits a group, so a group larger than model_batch_size
        goes out whole: the bound would not hold."""
        reward = self.rollout.reward
        if reward.type != "model":
            return self
        groups = [("rollout.n_samples_per_prompt", self.rollout.n_samples_per_prompt)]
        groups += [
            (f"eval.datasets.{i}.n_samples_per_prompt", d.n_samples_per_prompt)
            if d.n_samples_per_prompt is not None
            else ("eval.n_samples_per_prompt", self.eval.n_samples_per_prompt)
            for i, d in enumerate(self.eval.datasets)
        ]
        key, largest = max(groups, key=lambda kv: kv[1])
        if reward.model_batch_size < largest:
            raise InvariantError(
                f"rollout.reward.model_batch_size={reward.model_batch_size} is below {key}="
                f"{largest}: a reward model call never splits a group, so each of those "
                f"groups goes out as one call of {largest} samples, over the bound",
                fields=("rollout.reward.model_batch_size",),
                fix=f"set rollout.reward.model_batch_size: {largest} or more (a multiple of "
                "the group size packs whole groups)",
            )
        return self

    @model_validator(mode="after")
    def check_warmup_fits_run(self) -> RecipeConfig:
        warmup, steps = self.optim.lr_warmup_steps, self.optimizer_steps
        if warmup >= steps:
            raise InvariantError(
                f"optim.lr_warmup_steps={warmup} is not below the run's {steps} optimizer "
                f"steps ({self.rollout.num_rollout} rollouts): the run would end before the "
                "learning rate reaches optim.lr",
                fields=("optim.lr_warmup_steps",),
                fix=f"use fewer warmup steps (e.g. {max(0, steps // 20)}), or more rollouts",
            )
        return self

    @model_validator(mode="after")
    def check_partial_rollout_has_groups_to_keep(self) -> RecipeConfig:
        rollout = self.rollout
        # groups are cut short when dynamic sampling has enough, or (fully_async) when they
        # fall behind the staleness bound
        cuts_groups = rollout.dynamic_sampling_filter is not None or self.loop.mode == (
            "fully_async"
        )
        if rollout.partial_rollout and not cuts_groups:
            raise InvariantError(
                "partial_rollout keeps groups a rollout cut short for a later one, and "
                "without dynamic_sampling_filter (or loop.mode fully_async) no group is ever "
                "cut short: every group the loop starts is trained",
                fields=("rollout.partial_rollout",),
                fix="set rollout.dynamic_sampling_filter (with over_sampling_batch_size), or "
                "partial_rollout: false",
            )
        if rollout.mask_offpolicy_in_partial_rollout and not rollout.partial_rollout:
            raise InvariantError(
                "mask_offpolicy_in_partial_rollout masks the tokens a partial rollout "
                "generated under an older policy, and partial_rollout is off",
                fields=("rollout.mask_offpolicy_in_partial_rollout",),
                fix="set rollout.partial_rollout: true, or remove it",
            )
        return self

    @model_validator(mode="after")
    def check_thinking_reward_has_thinking(self) -> RecipeConfig:
        """deepscaler pays 0 for a response without </think>, and a thinking-off template
        never has the model write one. The rollout's reward.type grades only where no custom
        function scores in its place; an evaluation set's reward_type grades its every line."""
        if self.data.apply_chat_template_kwargs.get("enable_thinking") is not False:
            return self
        names = {f"eval.datasets.{i}.reward_type": d.name for i, d in enumerate(self.eval.datasets)}
        for field, kind in self.rule_graders():
            if kind == "deepscaler":
                so = (
                    f"the {names[field]} accuracy reads 0"
                    if field in names
                    else "no group has a signal"
                )
                raise InvariantError(
                    f"{field}=deepscaler grades only the text after the response's last "
                    "</think>, and data.apply_chat_template_kwargs.enable_thinking=false "
                    "writes the (empty) thinking block into the prompt: no response has one, "
                    f"every reward is 0 and {so}",
                    fields=(field,),
                    fix=f"use {field}: math (it grades the whole response), or remove "
                    "enable_thinking: false",
                )
        return self

    @model_validator(mode="after")
    def check_engines_get_new_weights(self) -> RecipeConfig:
        interval, rollouts = self.loop.update_weights_interval, self.rollout.num_rollout
        if interval > 1 and interval >= rollouts:
            raise InvariantError(
                f"loop.update_weights_interval={interval} is not below the run's {rollouts} "
                "rollouts: the engines keep the starting weights for every rollout (an "
                "evaluation aside), so the run trains on samples of a policy it left behind",
                fields=("loop.update_weights_interval",),
                fix="use 1 (every rollout, the seeds' value) or an interval well below "
                "rollout.num_rollout",
            )
        return self

    @model_validator(mode="after")
    def check_kl_metric_recurs(self) -> RecipeConfig:
        """A KL measured only where it weighs nothing runs at rollouts 0, N, 2N, ... (0-based):
        with N at or past the run's length that is rollout 0 alone, before any update."""
        interval, rollouts = self.algo.kl_metric_interval, self.rollout.num_rollout
        if self.algo.reference_interval == interval > 0 and interval >= rollouts:
            raise InvariantError(
                f"algo.kl_metric_interval={interval} is not below the run's {rollouts} rollouts: "
                f"the KL is measured at rollouts 0, {interval}, ... and so only at rollout 0, "
                "before the first update, where the policy has not moved from where it "
                "started; the reference model is still loaded and held for the whole run "
                "for that one figure",
                fields=("algo.kl_metric_interval",),
                fix=f"use an interval below rollout.num_rollout (e.g. "
                f"{max(1, rollouts // 10)}), or 0 to not measure the KL",
            )
        return self

    @model_validator(mode="after")
    def check_kl_loss_has_coef_type(self) -> RecipeConfig:
        if self.algo.kl_loss_coef > 0 and not self.algo.use_kl_loss:
            raise InvariantError(
                f"algo.kl_loss_coef={self.algo.kl_loss_coef} has no effect because "
                "algo.use_kl_loss is false",
                fields=("algo.kl_loss_coef",),
                fix="set algo.use_kl_loss: true, or algo.kl_loss_coef: 0",
            )
        return self
