"""The reward section (recipe.rollout.reward): how responses are scored; the reward types."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from rlpost.schema.base import InvariantError, Section, refuse_unused

# The reward types rlpost registers (rlpost.rewards.hub; a test holds the two together), and
# those that grade a response against the sample's label. "model" is no per-sample type:
# reward.model's class scores whole batches (rlpost.rewards.model).
# The boxed_ types (slime's) grade the last \\boxed{} answer of a response with the named
# grader, and pay its floor where there is none. "random" (slime's) pays 0 or 1 by a coin
# flip, reading nothing of the sample: a baseline, and a check of the pipeline.
RewardType = Literal[
    "math",
    "deepscaler",
    "dapo",
    "f1",
    "gpqa",
    "boxed_f1",
    "boxed_gpqa",
    "random",
    "remote",
    "model",
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
        "score with a function of your own that calls IFBench's checkers (installed "
        "beforehand): recipe.rollout.reward.custom_function, or for an evaluation set its "
        "custom_reward_function; or use the remote type with a reward server that runs them",
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


class RewardConfig(Section):
    type: Annotated[RewardType, BeforeValidator(check_reward_type_known)] = "math"
    custom_function: str | None = Field(
        None,
        description="score every sample with this function, 'module.fn' with def fn(sample) "
        "-> float (async too) or verl's compute_score(data_source, solution_str, "
        "ground_truth, extra_info=None) (rlpost.rewards.hub); with group, def fn(samples) "
        "-> list: a number per sample, or a dict per sample whose 'score' is the reward "
        "(its other keys logged as rollout/reward_extra/<key>)",
    )
    group: bool = False
    remote_url: str | None = None
    timeout_s: PositiveFloat = 30.0
    max_retries: NonNegativeInt = 3
    model: str | None = Field(
        None,
        description="a reward model class by dotted path, built once per run as cls(ctx) "
        "(rlpost.rewards.model.RewardModelContext) and called as `async __call__(samples) "
        "-> list` on batches of samples: a number per sample, or a dict per sample whose "
        "'score' is the reward (its other keys logged as rollout/reward_extra/<key>); it "
        "scores every sample",
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
                    "async def __call__(self, samples) returning a number, or a dict whose "
                    "'score' is the reward, per sample)",
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
