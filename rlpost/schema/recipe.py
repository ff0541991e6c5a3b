"""The training recipe: data, rollout, algorithm, optimizer, eval, checkpoints."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from rlpost.schema.base import InvariantError, Section


class DataConfig(Section):
    prompt_data: str
    input_key: str = "input"
    label_key: str | None = None
    metadata_key: str = "metadata"
    apply_chat_template: bool = False
    apply_chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    shuffle: bool = False
    seed: int = 42
    max_prompt_len: PositiveInt | None = None


class RewardConfig(Section):
    type: str = "math"
    custom_function: str | None = None
    group: bool = False
    remote_url: str | None = None
    timeout_s: PositiveFloat = 30.0
    max_retries: NonNegativeInt = 3


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
    generate_function: str | None = None
    max_concurrency: PositiveInt = 512
    reward: RewardConfig = Field(default_factory=RewardConfig)

    @model_validator(mode="after")
    def check_temperature_positive(self) -> RolloutConfig:
        if self.temperature <= 0:
            raise InvariantError(
                f"temperature={self.temperature} must be > 0: GRPO needs sampled, diverse "
                "responses within a group, and the trainer divides logits by the temperature",
                fields=("temperature",),
                fix="use 1.0 (the seeds' value) or another positive value",
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
    advantage_estimator: Literal[
        "grpo", "gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"
    ] = "grpo"
    grpo_std_normalization: bool = True
    normalize_advantages: bool = False
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    use_kl_loss: bool = False
    kl_loss_coef: NonNegativeFloat = 0.0
    kl_loss_type: Literal["k1", "k2", "k3", "low_var_kl"] = "k1"
    kl_coef: NonNegativeFloat = 0.0
    entropy_coef: NonNegativeFloat = 0.0
    eps_clip: PositiveFloat = 0.2
    eps_clip_high: PositiveFloat | None = None
    eps_clip_c: PositiveFloat | None = None
    loss_reduction: Literal["sample_mean", "token_mean"] = "sample_mean"
    use_tis: bool = False
    tis_clip_low: NonNegativeFloat = 0.0
    tis_clip_high: PositiveFloat = 2.0

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


class EvalDataset(Section):
    name: str
    path: str
    input_key: str | None = None
    label_key: str | None = None
    n_samples_per_prompt: PositiveInt | None = None
    max_response_len: PositiveInt | None = None


class EvalConfig(Section):
    interval: PositiveInt | None = None
    datasets: list[EvalDataset] = Field(default_factory=list)
    n_samples_per_prompt: PositiveInt = 1
    max_response_len: PositiveInt | None = None
    temperature: float | None = None
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = None
    skip_before_train: bool = False

    @model_validator(mode="after")
    def check_interval_has_datasets(self) -> EvalConfig:
        if self.interval is not None and not self.datasets:
            raise InvariantError(
                f"interval={self.interval} asks for evaluation but no datasets are named",
                fields=("datasets",),
                fix="add datasets: [{name: aime, path: /path/aime-2024.jsonl}], or interval: null",
            )
        return self


class SaveConfig(Section):
    interval: PositiveInt | None = None
    keep_last: PositiveInt = 3
    save_hf_interval: PositiveInt | None = None
    save_optimizer: bool = True


class LoopConfig(Section):
    """How rollout and training interleave."""

    mode: Literal["sync", "async"] = "sync"
    update_weights_interval: PositiveInt = 1


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
    def check_batch_divides(self) -> RecipeConfig:
        samples = self.rollout.batch_size * self.rollout.n_samples_per_prompt
        gbs = self.train.global_batch_size
        if samples % gbs:
            divisors = [d for d in range(samples, 0, -1) if samples % d == 0][:3]
            raise InvariantError(
                f"rollout.batch_size x rollout.n_samples_per_prompt = "
                f"{self.rollout.batch_size} x {self.rollout.n_samples_per_prompt} = {samples} "
                f"samples per rollout is not a multiple of train.global_batch_size={gbs}; "
                "the trailing samples would be dropped every rollout",
                fields=("train.global_batch_size",),
                fix=f"set train.global_batch_size to a divisor of {samples} "
                f"(e.g. {', '.join(map(str, divisors))}), or change the rollout counts",
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
