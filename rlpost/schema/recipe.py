"""The training recipe: its sections (data, rollout and its reward, algo, optim, train, eval,
save, loop; each in a module of its own) and the rules that join them."""

from __future__ import annotations

import math
from typing import get_args

from pydantic import Field, model_validator

from rlpost.schema.algo import GROUP_BASELINE_ESTIMATORS, AdvantageEstimatorName, AlgoConfig
from rlpost.schema.base import InvariantError, Section, refuse_unused
from rlpost.schema.data import DataConfig
from rlpost.schema.evaluation import EvalConfig, EvalDataset
from rlpost.schema.loop import DEFAULT_MAX_STALENESS, LoopConfig
from rlpost.schema.optim import OptimConfig
from rlpost.schema.reward import GRADER_FLOOR, GRADER_MARKERS, LABELLED_REWARD_TYPES, RewardConfig
from rlpost.schema.rollout import RolloutConfig
from rlpost.schema.save import SaveConfig
from rlpost.schema.train import TrainConfig
from rlpost.schema.training_only import evaluating, training_rule

# The recipe's sections, importable from here as well as from their own modules.
__all__ = [
    "AlgoConfig",
    "DataConfig",
    "EvalConfig",
    "EvalDataset",
    "LoopConfig",
    "OptimConfig",
    "RecipeConfig",
    "RewardConfig",
    "RolloutConfig",
    "SaveConfig",
    "TrainConfig",
]

# The shipped filter that keeps groups whose rewards differ (rlpost.filters).
NONZERO_STD_FILTER = "rlpost.filters.check_reward_nonzero_std"


def prompts_filling_steps(prompts: int, n: int, gbs: int) -> str:
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
        errors = []
        for i, dataset in enumerate(self.eval.datasets):
            if dataset.reward_type is not None and scorer is not None:
                errors.append(
                    InvariantError(
                        f"eval.datasets.{i}.reward_type={dataset.reward_type}: {scorer} scores "
                        "every sample, whatever its set, and never reads it",
                        fields=(f"eval.datasets.{i}.reward_type",),
                        fix="remove reward_type from the set, or grade with a rule-based "
                        "rollout.reward.type",
                    )
                )
        if errors:
            raise InvariantError.all_of(errors)
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
    @training_rule
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
                f"{prompts_filling_steps(step_prompts, n, gbs)}",
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
                f"{prompts_filling_steps(prompts, n, gbs)}",
            )
        return self

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps over the whole run (each rollout's samples / global batch)."""
        per_rollout = self.rollout.batch_size * self.rollout.n_samples_per_prompt
        return self.rollout.num_rollout * max(1, per_rollout // self.train.global_batch_size)

    @model_validator(mode="after")
    @training_rule
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
    @training_rule
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
    @training_rule
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
    @training_rule
    def check_staleness_spans_the_pushes(self) -> RecipeConfig:
        loop = self.loop
        if loop.mode != "fully_async":
            return self
        interval, given = loop.update_weights_interval, loop.max_staleness
        bound = DEFAULT_MAX_STALENESS if given is None else given
        # an evaluation pushes the weights too, so the longest stretch without a push is
        # the shorter of the two intervals
        evaluations = self.eval.interval if self.eval.datasets else None
        gap = min(interval, evaluations) if evaluations else interval
        if bound + 1 >= gap:
            return self
        named = f"max_staleness={given}"
        if given is None:
            named = f"max_staleness (unset: {DEFAULT_MAX_STALENESS})"
        pushes = f"loop.update_weights_interval={interval}" + (
            f", eval.interval={evaluations}" if evaluations else ""
        )
        raise InvariantError(
            f"loop.{named} is below {gap - 1}: with the weights pushed every {gap} steps "
            f"({pushes}), a group for the step {bound + 1} after a push is more than {bound} "
            "versions old whenever it is generated, so none can be trained there and the run "
            "waits at that step for good",
            fields=("loop.max_staleness" if given is not None else "loop.update_weights_interval",),
            fix=f"use loop.max_staleness >= {gap - 1}, or push weights more often "
            f"(loop.update_weights_interval <= {bound + 1})",
        )

    @model_validator(mode="after")
    @training_rule
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
        draw = self.rollout.over_sampling_batch_size
        if self.loop.mode == "fully_async" and buffered is not None and draw and buffered < draw:
            raise InvariantError(
                f"loop.max_buffered_groups={buffered} is below "
                f"rollout.over_sampling_batch_size={draw}: the producer starts a draw's "
                f"{draw} groups at once, so a single draw puts more groups ahead of the "
                f"trainer than the {buffered} the bound (and the plan's queue memory) allows",
                fields=("loop.max_buffered_groups",),
                fix=f"set loop.max_buffered_groups >= {draw} (its default is {batch + draw}, a "
                "batch and a draw), lower over_sampling_batch_size, or remove "
                "max_buffered_groups",
            )
        return self

    @model_validator(mode="after")
    @training_rule
    def check_reward_has_labels(self) -> RecipeConfig:
        """Training's samples are graded against data.label_key's field. An evaluation's sets
        read their own label_key (null: data.label_key's), and check_eval_sets_have_labels
        holds each set that training's reward grades to one."""
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

    def eval_label_grader(self, index: int) -> tuple[str, str] | None:
        """(key, reward type) of what grades eval.datasets[index] against a line's label, or
        None where its scorer reads no label. In slime's order: a custom function (the set's
        or the evaluation's) scores before any type, then the set's reward_type, then
        training's scorer."""
        if self.eval.reward_function(index) is not None:
            return None
        own = self.eval.datasets[index].reward_type
        if own is not None:
            key = f"eval.datasets.{index}.reward_type"
            return (key, own) if own in LABELLED_REWARD_TYPES else None
        reward = self.rollout.reward
        return ("rollout.reward.type", reward.type) if reward.needs_label else None

    @model_validator(mode="after")
    def check_eval_sets_have_labels(self) -> RecipeConfig:
        """A set that reads no label (label_key false, or null with no data.label_key) must
        be scored by something that needs none."""
        errors = []
        for i, dataset in enumerate(self.eval.datasets):
            grader = self.eval_label_grader(i)
            if grader is None:
                continue
            key, kind = grader
            if dataset.label_key is False:
                value, why = "false", "the set reads no label from its lines"
                fix = (
                    f"set eval.datasets.{i}.label_key to the field holding the answer (null: "
                    "data.label_key), or score the set without a label: its own "
                    "custom_reward_function, or reward_type: random"
                )
            elif dataset.label_key is None and self.data.label_key is None:
                value, why = "null", "neither the set's label_key nor data.label_key is set"
                fix = (
                    f"set eval.datasets.{i}.label_key (or data.label_key) to the field holding "
                    "the answer, or score the set with its own custom_reward_function"
                )
            else:
                continue
            errors.append(
                InvariantError(
                    f"eval.datasets.{i}.label_key={value}: {key}={kind} grades the "
                    f"set's every response against the line's label, and {why}: every sample "
                    "would fail",
                    fields=(f"eval.datasets.{i}.label_key",),
                    fix=fix,
                )
            )
        if errors:
            raise InvariantError.all_of(errors)
        return self

    def eval_requests(self) -> list[tuple[str, int]]:
        """The longest request (prompt + response) of each evaluation set that can outgrow
        training's, keyed by what sets its response length (one entry a key): the prompt
        counts eval.max_prompt_len (0 where unset: the prompts add to it, and are checked
        once tokenized); a set at the rollout's response length is listed under
        eval.max_prompt_len, and only when that is set (else training's bound covers it)."""
        found: dict[str, int] = {}
        for key, tokens in self.eval_set_requests():
            if key != "rollout.max_response_len":
                found[key] = tokens
            elif self.eval.max_prompt_len:
                found["eval.max_prompt_len"] = tokens
        return list(found.items())

    def eval_set_requests(self) -> list[tuple[str, int]]:
        """The longest request (prompt + response) of every evaluation set, keyed by what sets
        its response length (the set's, the eval section's, else the rollout's; one entry a
        key): all an evaluation (mode=eval) generates. The prompt counts eval.max_prompt_len
        (0 where unset: the prompts add to it, and are checked once tokenized); training's
        data.max_prompt_len does not bound the sets' prompts."""
        prompt = self.eval.max_prompt_len or 0
        found: dict[str, int] = {}
        for i in range(len(self.eval.datasets)):
            key, response = self.eval.response_len(i) or (
                "rollout.max_response_len",
                self.rollout.max_response_len,
            )
            found[key] = prompt + response
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
        # an evaluation generates its sets' groups only
        groups = (
            []
            if evaluating()
            else [("rollout.n_samples_per_prompt", self.rollout.n_samples_per_prompt)]
        )
        groups += [
            (f"eval.datasets.{i}.n_samples_per_prompt", d.n_samples_per_prompt)
            if d.n_samples_per_prompt is not None
            else ("eval.n_samples_per_prompt", self.eval.n_samples_per_prompt)
            for i, d in enumerate(self.eval.datasets)
        ]
        if not groups:
            return self
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
    @training_rule
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
    @training_rule
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
    @training_rule
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
    @training_rule
    def check_kl_loss_has_coef_type(self) -> RecipeConfig:
        if self.algo.kl_loss_coef > 0 and not self.algo.use_kl_loss:
            raise InvariantError(
                f"algo.kl_loss_coef={self.algo.kl_loss_coef} has no effect because "
                "algo.use_kl_loss is false",
                fields=("algo.kl_loss_coef",),
                fix="set algo.use_kl_loss: true, or algo.kl_loss_coef: 0",
            )
        return self
