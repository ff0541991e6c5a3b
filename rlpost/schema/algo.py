"""The algorithm section (recipe.algo): the advantage estimator, the loss and its KL terms."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    model_validator,
)

from rlpost.schema.base import InvariantError, Section, refuse_unused
from rlpost.schema.training_only import training_rule

# What each advantage estimator reads (rlpost.algo.advantages registers them; a test holds
# the two together). Group baselines subtract the group's mean reward, so a group of one
# sample always gets advantage zero.
AdvantageEstimatorName = Literal[
    "grpo", "gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"
]
GROUP_BASELINE_ESTIMATORS = frozenset({"grpo", "gspo", "reinforce_plus_plus_baseline"})
KL_REWARD_ESTIMATORS = frozenset({"reinforce_plus_plus", "reinforce_plus_plus_baseline"})
DISCOUNTING_ESTIMATORS = frozenset({"reinforce_plus_plus"})
WHITENING_ESTIMATORS = frozenset({"reinforce_plus_plus", "reinforce_plus_plus_baseline"})
STD_SCALING_ESTIMATORS = frozenset({"grpo"})

# The widest clip epsilon that still binds on gspo's sequence ratios (its paper: 3e-4, 4e-4).
GSPO_MAX_CLIP = 0.01

OffPolicyCorrection = Literal["none", "tis", "decoupled_ppo"]


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
    @training_rule
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
    @training_rule
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
    @training_rule
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
    @training_rule
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
    @training_rule
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
    @training_rule
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
    @training_rule
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
    @training_rule
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
    @training_rule
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
    @training_rule
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
