"""The whole resolved run: one typed object, validated once at the launcher."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    Field,
    ModelWrapValidatorHandler,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from rlpost.schema.base import (
    JOIN_FIX,
    InvariantError,
    LocalPath,
    Section,
    check_host_port,
    check_ip,
    ray_address_problem,
    refuse_unused,
)
from rlpost.schema.hardware import HardwareConfig, device_word
from rlpost.schema.layout import LayoutConfig
from rlpost.schema.model import GENERIC_FAMILY, ModelConfig
from rlpost.schema.recipe import RecipeConfig
from rlpost.schema.training_only import judging

# Faster than any engine decodes one sequence today (H100, small model, batch 1: ~200-300):
# a request timeout below max_response_len / this cannot be met by a full-length response.
FASTEST_DECODE_TOKENS_PER_S = 500
OnSigterm = Literal["save", "stop"]  # run.on_sigterm


def request_parts(
    max_prompt_len: int | None,
    response: str,
    alone: str = "",
    bound: str = "recipe.data.max_prompt_len",
) -> str:
    """What the longest request is made of, for a message: the prompt's bound (`bound`, the
    key) and the response, or the response alone (`alone`, else `response`) where the bound
    is unset (prompts add to it)."""
    if max_prompt_len is None:
        what = alone or response
        return f"{what} alone: {bound} is unset, and prompts add to it"
    name = "max_prompt_len" if bound == "recipe.data.max_prompt_len" else bound[len("recipe.") :]
    return f"{name} {max_prompt_len} + {response}"


class TrainerConfig(Section):
    backend: Literal["auto", "torch", "megatron"] = "auto"
    threads_per_rank: PositiveInt | None = None
    collective_timeout_s: PositiveFloat = Field(
        600.0,
        description="a collective (gloo, NCCL) or a call on the train ranks that takes longer "
        "fails, naming the rank that did not arrive; a checkpoint save or an HF export fails "
        "once it has written nothing for this long, the ranks' start and a checkpoint load "
        "once they have read nothing",
    )


class EngineConfig(Section):
    backend: Literal["auto", "sglang", "cpu"] = "auto"
    router_policy: Literal["round_robin", "random", "cache_aware", "power_of_two"] = "round_robin"
    request_timeout_s: PositiveFloat = 3600.0
    startup_timeout_s: PositiveFloat = Field(
        600.0,
        description="a model's load at the run's start: an engine server that does not "
        "answer within this long, and a reward model actor (reward.model_placement: actor) "
        "that has not built its class, fail the start",
    )
    max_batch_size: PositiveInt = 256
    weight_sync: Literal["auto", "disk", "tensor", "distributed"] = Field(
        "auto",
        description="auto: tensor (CUDA IPC) when colocated on GPUs, distributed (NCCL) when "
        "decoupled on GPUs, disk on CPU",
    )
    weight_bucket_mb: PositiveInt = Field(
        512, description="tensor and distributed sync send the weights in buckets of this size"
    )
    weight_probe: bool = Field(
        False,
        description="after each weight update, compare a probe prompt's logprobs between the "
        "trainer and every engine",
    )
    weight_probe_tolerance: PositiveFloat = Field(
        0.05, description="largest mean absolute logprob difference the probe accepts"
    )
    offload: bool | None = Field(
        None,
        description="colocated: engines release their memory and trainers offload theirs "
        "around training; null: on for colocated GPU runs, off otherwise",
    )
    fault_tolerance: bool = Field(
        False, description="health-check engines and restart any that die or hang"
    )
    health_check_interval_s: PositiveFloat = 30.0
    health_check_timeout_s: PositiveFloat = 30.0
    health_check_first_wait_s: NonNegativeFloat = Field(
        300.0, description="grace after an engine (re)starts before it is health-checked"
    )
    max_restarts_per_engine: NonNegativeInt = Field(
        3,
        description="an engine that needs more restarts than this in one launch is given up "
        "(a crash loop); the run goes on with the others while any are left",
    )

    @model_validator(mode="after")
    def check_dependent_settings_used(self) -> EngineConfig:
        if not self.fault_tolerance:
            for name in (
                "health_check_interval_s",
                "health_check_timeout_s",
                "health_check_first_wait_s",
                "max_restarts_per_engine",
            ):
                refuse_unused(
                    self,
                    name,
                    why="engines are health-checked only with fault_tolerance: true",
                    fix=f"set fault_tolerance: true, or remove {name}",
                )
        if not self.weight_probe:
            refuse_unused(
                self,
                "weight_probe_tolerance",
                why="the probe runs only with weight_probe: true",
                fix="set weight_probe: true, or remove weight_probe_tolerance",
            )
        return self


class PlanOptions(Section):
    format: Literal["table", "json", "script"] = Field(
        "table",
        description="mode=plan: table or json; mode=slime_args: table (bash arrays), json, or "
        "script (a complete slime launch script)",
    )
    memory_check: Literal["refuse", "warn"] = Field(
        "refuse",
        description="a training launch whose plan does not fit in memory: refuse it before "
        "anything starts, or warn and launch anyway (the estimate is conservative)",
    )


# What wandb.init refuses (wandb/sdk/wandb_settings.py, validate_project and validate_run_id),
# checked here so that a bad name stops the launch, not the run once its engines are up.
WANDB_PROJECT_FORBIDDEN = "/\\#?%:"
WANDB_PROJECT_MAX_CHARS = 128
WANDB_RUN_ID_FORBIDDEN = ":;,#?/'"


def _without(value: str, forbidden: str) -> str:
    return "".join(c for c in value if c not in forbidden)


class WandbConfig(Section):
    enabled: bool = False
    mode: Literal["online", "offline"] = "offline"
    project: str = Field(
        "rlpost",
        description="the project alone; the entity (team or user) comes from WANDB_ENTITY, "
        "else the API key's default entity",
    )
    group: str | None = None
    run_id: str | None = None

    @model_validator(mode="after")
    def check_settings_need_enabled(self) -> WandbConfig:
        if not self.enabled:
            for name in ("mode", "project", "group", "run_id"):
                refuse_unused(
                    self,
                    name,
                    why="wandb logging is off (enabled: false)",
                    fix=f"set enabled: true, or remove {name}",
                )
        return self

    @model_validator(mode="after")
    def check_project_name_wandb_accepts(self) -> WandbConfig:
        entity, slash, name = self.project.rpartition("/")
        if slash and entity and name and "/" not in entity:
            raise InvariantError(
                f"'{self.project}' is an entity/project path: wandb takes the project name "
                "alone and refuses '/' in it, after the engines and trainers have started",
                fields=("project",),
                fix=f"set project: {name}, and the entity in the environment: "
                f"WANDB_ENTITY={entity}",
            )
        found = sorted(set(self.project) & set(WANDB_PROJECT_FORBIDDEN))
        if found or len(self.project) > WANDB_PROJECT_MAX_CHARS:
            why = (
                f"it holds {' '.join(found)}, which wandb refuses in a project name"
                if found
                else f"wandb takes at most {WANDB_PROJECT_MAX_CHARS} characters, not "
                f"{len(self.project)}"
            )
            shorter = _without(self.project, WANDB_PROJECT_FORBIDDEN)[:WANDB_PROJECT_MAX_CHARS]
            raise InvariantError(
                f"'{self.project}' is not a wandb project name: {why}",
                fields=("project",),
                fix=f"set project: {shorter or 'rlpost'} (no {' '.join(WANDB_PROJECT_FORBIDDEN)})",
            )
        return self

    @model_validator(mode="after")
    def check_run_id_wandb_accepts(self) -> WandbConfig:
        run_id = self.run_id
        if run_id is None:
            return self
        found = sorted(set(run_id) & set(WANDB_RUN_ID_FORBIDDEN))
        if found or not run_id.strip() or run_id != run_id.strip():
            why = (
                f"it holds {' '.join(found)}, which wandb refuses in a run id"
                if found
                else "wandb refuses an empty run id, or one that starts or ends with a space"
            )
            fixed = _without(run_id, WANDB_RUN_ID_FORBIDDEN).strip()
            raise InvariantError(
                f"'{run_id}' is not a wandb run id: {why}",
                fields=("run_id",),
                fix=f"set run_id: {fixed}" if fixed else "remove run_id (wandb makes one)",
            )
        return self


class TrackingConfig(Section):
    tensorboard: bool = True
    wandb: WandbConfig = Field(default_factory=WandbConfig)


class RunOptions(Section):
    dir: LocalPath | None = Field(None, description="null: the Hydra output directory")
    seed: int = 1234
    resume: LocalPath | None = Field(None, description="auto, or a checkpoint directory")
    deterministic: bool = False
    progress: bool = True
    dump_rollouts: bool = Field(
        False,
        description="write each rollout's samples as the trainer gets them (tokens, the "
        "engines' logprobs, rewards, status) to <run.dir>/rollouts/rollout_<id>.jsonl, one "
        "line per sample (rlpost.runtime.rollout_dump)",
    )
    on_sigterm: OnSigterm = Field(
        "save",
        description="SIGTERM (a scheduler's time limit or preemption, `docker stop`, `kill`): "
        "save, a checkpoint of every rollout the run has finished (at once while the trainer "
        "waits for generation, else once the rollout being trained is done; the evaluation "
        "and HF export due after it wait for the resumed run, which does them first), then stop; "
        "stop, end at once, keeping the checkpoints saved so far. Exit status 143 either "
        "way; a second SIGTERM ends the run at once",
    )
    max_restarts: NonNegativeInt = Field(
        0,
        description="when a train rank, an engine (without engine.fault_tolerance), the router "
        "or the driver's actors die mid-run, start again from the newest complete checkpoint "
        "(from scratch before the first), up to this many times in one launch",
    )
    ray_address: str | None = Field(
        None,
        description="join a running Ray cluster: auto (the one this machine belongs to) or "
        "its head's host:port; null: RAY_ADDRESS when set, else start Ray on this machine "
        "(single-node hardware only)",
    )
    node_address: str | None = Field(
        None,
        description="this machine's address in the Ray cluster, where the launch runs (plan "
        "node 0); null: the address Ray finds by routing towards the head",
    )

    @model_validator(mode="after")
    def check_addresses(self) -> RunOptions:
        why = ray_address_problem(self.ray_address) if self.ray_address else None
        if why is not None:
            raise InvariantError(why, fields=("ray_address",), fix=JOIN_FIX)
        if self.ray_address not in (None, "auto"):
            check_host_port(self.ray_address, "ray_address", "auto, or the head's host:port")
        if self.node_address is not None:
            check_ip(self.node_address, "node_address")
        return self


LAUNCH_MODES = frozenset({"train", "eval"})
"""The modes that start a run (engines, trainers, a run directory); the others only print."""

# mode=eval refuses run.resume=auto (its run directory is a new one): a run.resume that names
# no usable checkpoint is refused in mode=eval (by validation, and by the launch's hash check)
# with this fix, which names the weights it evaluates without a checkpoint instead
EVAL_RESUME_FIX = (
    "point run.resume at a complete checkpoint (<run.dir>/ckpt/rollout_<n>) or at a run "
    "directory, or remove run.resume to evaluate model.load (else model.hf_checkpoint)"
)


class RunConfig(Section):
    mode: Literal["train", "eval", "plan", "slime_args"] = Field(
        "train",
        description="train; eval: evaluate the policy once on recipe.eval.datasets (model.load "
        "or model.hf_checkpoint, or the checkpoint run.resume names) and train nothing; plan "
        "and slime_args print",
    )
    model: ModelConfig
    recipe: RecipeConfig
    hardware: HardwareConfig
    layout: LayoutConfig = Field(default_factory=LayoutConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    plan: PlanOptions = Field(default_factory=PlanOptions)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    run: RunOptions = Field(default_factory=RunOptions)

    @model_validator(mode="wrap")
    @classmethod
    def judge_by_mode(cls, data: Any, handler: ModelWrapValidatorHandler[RunConfig]) -> RunConfig:
        """Every section validates knowing the run's mode: a mode=eval run's training-only
        settings go unread, and the rules that judge only them pass it
        (rlpost.schema.training_only.training_rule; the rules below read self.mode)."""
        mode = data.get("mode") if isinstance(data, Mapping) else getattr(data, "mode", None)
        with judging(mode):
            return handler(data)

    @model_validator(mode="after")
    def check_format_fits_mode(self) -> RunConfig:
        if self.mode in LAUNCH_MODES:
            printer = "mode=slime_args" if self.plan.format == "script" else "mode=plan"
            refuse_unused(
                self.plan,
                "format",
                why="it is how mode=plan and mode=slime_args print, and a launch "
                f"(mode={self.mode}) prints neither",
                fix=f"add {printer} to print in that format, or remove plan.format",
                prefix="plan.",
            )
        if self.plan.format == "script" and self.mode != "slime_args":
            raise InvariantError(
                f"plan.format=script writes a slime launch script, which mode={self.mode} "
                "does not print",
                fields=("plan.format",),
                fix="use mode=slime_args with it, or plan.format=table or json",
            )
        return self

    @model_validator(mode="after")
    def check_colocated_has_no_rollout_gpus(self) -> RunConfig:
        """Judged here, not in LayoutConfig, to name the hardware's devices as it does."""
        layout = self.layout
        if layout.colocate and layout.rollout.num_gpus:
            devices = device_word(self.hardware.kind, 2)
            raise InvariantError(
                f"colocate: true shares the train {devices} with the engines, but "
                f"rollout.num_gpus={layout.rollout.num_gpus} asks for separate ones",
                fields=("layout.rollout.num_gpus",),
                fix="remove layout.rollout.num_gpus (colocated), or set layout.colocate: false "
                "(decoupled)",
            )
        return self

    @model_validator(mode="after")
    def check_slime_builds_the_model(self) -> RunConfig:
        if self.mode == "slime_args" and self.model.family == GENERIC_FAMILY:
            raise InvariantError(
                f"slime trains with megatron-core, which has no layer spec for model "
                f"{self.model.name} (family generic, {self.model.hf_architecture}): its "
                "arguments would describe a different network",
                fields=("mode",),
                fix="train it here with trainer.backend=torch (mode=train), or export a model "
                "of a family megatron-core expresses",
            )
        return self

    @model_validator(mode="after")
    def check_context_fits(self) -> RunConfig:
        """Training's prompts are bounded by data.max_prompt_len and the evaluation sets'
        by eval.max_prompt_len: each bound + its response must fit the model's positions
        (in mode=eval, the evaluation sets' alone: training's lengths bound nothing it
        generates)."""
        recipe, context = self.recipe, self.model.max_position_embeddings
        data, ev = recipe.data, recipe.eval
        evaluating = self.mode == "eval"
        eval_parts = request_parts(
            ev.max_prompt_len, "response", "the response", "recipe.eval.max_prompt_len"
        )
        requests = [
            (f"recipe.{key}", length, eval_parts)
            for key, length in (
                recipe.eval_set_requests() if evaluating else recipe.eval_requests()
            )
        ]
        if not evaluating:
            trained = (data.max_prompt_len or 0) + recipe.rollout.max_response_len
            parts = request_parts(data.max_prompt_len, "response", "the response")
            requests.insert(0, ("recipe.rollout.max_response_len", trained, parts))
        window = self.model.sliding_window
        errors = []
        for key, length, parts in requests:
            if length > context:
                errors.append(
                    InvariantError(
                        f"prompt + response can reach {length} tokens ({parts}), beyond "
                        f"model.max_position_embeddings={context}",
                        fields=(key,),
                        fix=f"lower it so prompt + response <= {context}",
                    )
                )
            elif window is not None and length > window:
                errors.append(
                    InvariantError(
                        f"prompt + response can reach {length} tokens ({parts}), beyond "
                        f"model.sliding_window={window}: the trainers attend over the whole "
                        "sample, where the checkpoint's attention would see only its window",
                        fields=(key,),
                        fix=f"lower it so prompt + response <= {window} (within the window, "
                        "windowed attention is full attention)",
                    )
                )
        if errors:  # every request the context cannot hold: the training's and each set's
            raise InvariantError.all_of(errors)
        return self

    @model_validator(mode="after")
    def check_kl_loss_has_reference(self) -> RunConfig:
        if self.mode == "eval":  # no reference model is loaded: nothing is trained
            return self
        algo = self.recipe.algo
        if algo.reference_interval and not self.model.ref_load:
            what = (
                "recipe.algo.kl_loss_coef"
                if algo.kl_in_loss
                else "recipe.algo.kl_coef"
                if algo.kl_in_reward
                else "recipe.algo.kl_metric_interval"
            )
            raise InvariantError(
                f"{what} needs a frozen reference model, and model.ref_load is not set",
                fields=("model.ref_load",),
                fix="set model.ref_load (an HF folder or a torch_dist checkpoint; the initial "
                "policy, e.g. ${model.hf_checkpoint}), or turn the KL term off",
            )
        return self

    @model_validator(mode="after")
    def check_stop_tokens_in_vocabulary(self) -> RunConfig:
        vocab = self.model.vocab_size
        outside = [t for t in self.recipe.rollout.stop_token_ids if not 0 <= t < vocab]
        if outside:
            raise InvariantError(
                f"stop token ids {outside} are outside the model's vocabulary of {vocab} "
                "tokens: generation could never stop on them",
                fields=("recipe.rollout.stop_token_ids",),
                fix=f"use token ids in 0..{vocab - 1} (the tokenizer's eos or end-of-turn "
                "ids), or remove them",
            )
        return self

    @model_validator(mode="after")
    def check_cpu_offload_on_gpus(self) -> RunConfig:
        optim = self.recipe.optim
        if self.hardware.kind == "cpu":
            for name in () if self.mode == "eval" else ("cpu_offload", "precision_aware_optimizer"):
                refuse_unused(
                    optim,
                    name,
                    why=f"hardware {self.hardware.name} is a CPU machine: the optimizer "
                    "already lives in host memory, in fp32",
                    fix=f"remove recipe.optim.{name}",
                    prefix="recipe.optim.",
                )
            refuse_unused(
                self.layout.train.fsdp,
                "cpu_offload",
                why=f"hardware {self.hardware.name} is a CPU machine: the shards, gradients "
                "and optimizer state already live in host memory",
                fix="remove layout.train.fsdp.cpu_offload",
                prefix="layout.train.fsdp.",
            )
        return self

    @model_validator(mode="after")
    def check_eval_mode_has_what_it_evaluates(self) -> RunConfig:
        if self.mode != "eval":
            return self
        if not self.recipe.eval.datasets:
            raise InvariantError(
                "mode=eval evaluates the policy on recipe.eval.datasets, and none are named",
                fields=("recipe.eval.datasets",),
                fix="add recipe.eval.datasets=[{name: aime, path: /path/aime-2024.jsonl}]",
            )
        if self.run.resume == "auto":
            raise InvariantError(
                "mode=eval writes a run directory of its own and evaluates the weights it is "
                "given: run.resume=auto would look for a checkpoint in that new directory",
                fields=("run.resume",),
                fix="name the checkpoint to evaluate (run.resume=runs/my_run/ckpt/rollout_40), "
                "or remove run.resume to evaluate model.load (else model.hf_checkpoint)",
            )
        return self

    @model_validator(mode="after")
    def check_auto_resume_has_a_dir(self) -> RunConfig:
        # mode=plan plans this training launch and is refused as the launch would be;
        # mode=slime_args writes slime's launch, which saves and resumes in ./slime/ when
        # run.dir is unset (rlpost.plan.slime_args)
        planned = self.mode in ("train", "plan")
        if planned and self.run.resume == "auto" and self.run.dir is None:
            raise InvariantError(
                "run.resume=auto continues the newest checkpoint in run.dir, and run.dir is "
                "not set: each launch then writes to a new dated directory "
                "(runs/<date>/<time>), which holds no checkpoint, so every launch starts "
                "again at rollout 0",
                fields=("run.resume",),
                fix="set run.dir to the run's directory (e.g. run.dir=runs/my_run) on every "
                "launch of the run, or point run.resume at a checkpoint",
            )
        return self

    @model_validator(mode="after")
    def check_request_timeout_fits_a_response(self) -> RunConfig:
        recipe = self.recipe
        longest = max(
            [recipe.rollout.max_response_len] + [n for _, n in recipe.eval.response_lens()]
        )
        fastest_s = longest / FASTEST_DECODE_TOKENS_PER_S
        timeout = self.engine.request_timeout_s
        if timeout < fastest_s:
            raise InvariantError(
                f"engine.request_timeout_s={timeout:g} is shorter than a {longest}-token "
                f"response takes even at {FASTEST_DECODE_TOKENS_PER_S} tokens/s per sequence "
                f"({fastest_s:.0f} s): long responses would time out mid-rollout, every one of "
                "them, and the run fails or trains on what is left",
                fields=("engine.request_timeout_s",),
                fix=f"raise engine.request_timeout_s well above {fastest_s:.0f} (the default is "
                "3600), or lower max_response_len",
            )
        return self

    @model_validator(mode="after")
    def check_restarts_have_checkpoints(self) -> RunConfig:
        interval, rollouts = self.recipe.save.interval, self.recipe.rollout.num_rollout
        if self.mode == "eval":  # a restart evaluates the same weights again
            return self
        if self.run.max_restarts and (interval is None or interval >= rollouts):
            said = "is null" if interval is None else f"is {interval}, of {rollouts} rollouts"
            # a resumed launch (a fork of another run's checkpoint too) restarts where it began
            again = (
                "at rollout 0"
                if self.run.resume is None
                else f"where the launch began (run.resume={self.run.resume})"
            )
            raise InvariantError(
                f"run.max_restarts={self.run.max_restarts} restarts a failed run from its "
                f"newest checkpoint, and recipe.save.interval {said}: no checkpoint is written "
                f"before the end, so every restart begins again {again}",
                fields=("recipe.save.interval",),
                fix=f"set recipe.save.interval below {rollouts} (e.g. "
                f"{20 if rollouts > 20 else max(1, rollouts // 2)}: a checkpoint every so many "
                "rollouts), or run.max_restarts: 0",
            )
        return self

    @model_validator(mode="after")
    def check_precision_aware_optimizer_is_distributed(self) -> RunConfig:
        if self.mode == "eval":  # no optimizer is built: nothing is trained
            return self
        if self.recipe.optim.precision_aware_optimizer and not (
            self.layout.train.distributed_optimizer
        ):
            raise InvariantError(
                "recipe.optim.precision_aware_optimizer keeps Adam's state in the distributed "
                "optimizer's shards, and layout.train.distributed_optimizer is false: "
                "megatron-core refuses the pair when the trainers start",
                fields=("layout.train.distributed_optimizer",),
                fix="set layout.train.distributed_optimizer: true (the default), or "
                "recipe.optim.precision_aware_optimizer: false",
            )
        return self

    @model_validator(mode="after")
    def check_cpu_offload_is_distributed(self) -> RunConfig:
        if self.mode == "eval":  # no optimizer is built: nothing is trained
            return self
        if self.recipe.optim.cpu_offload and not self.layout.train.distributed_optimizer:
            raise InvariantError(
                "recipe.optim.cpu_offload runs Adam on the host for the distributed "
                "optimizer's shards, and layout.train.distributed_optimizer is false: "
                "megatron-core's plain optimizer replaces the offloaded optimizer's parameter "
                "groups with its own, and the first optimizer step fails (a KeyError), after "
                "the first rollout",
                fields=("layout.train.distributed_optimizer",),
                fix="set layout.train.distributed_optimizer: true (the default), or "
                "recipe.optim.cpu_offload: false",
            )
        return self

    @model_validator(mode="after")
    def check_mtp_training_has_layers(self) -> RunConfig:
        train = self.recipe.train
        if not train.mtp_training:
            return self
        if self.model.mtp_num_layers == 0:
            raise InvariantError(
                f"recipe.train.mtp_training is on, but model {self.model.name!r} has "
                "model.mtp_num_layers=0: there are no multi-token-prediction layers to train",
                fields=("recipe.train.mtp_training",),
                fix="set recipe.train.mtp_training: false, or model.mtp_num_layers to the "
                "checkpoint's MTP layer count (the HF config's num_nextn_predict_layers)",
            )
        if self.trainer.backend == "torch":
            raise InvariantError(
                "recipe.train.mtp_training needs the Megatron trainer, which builds the MTP "
                "layers; trainer.backend=torch trains the main model only",
                fields=("trainer.backend",),
                fix="set trainer.backend=megatron, or recipe.train.mtp_training: false",
            )
        if self.model.family == GENERIC_FAMILY:
            raise InvariantError(
                "recipe.train.mtp_training needs the Megatron trainer, which builds the MTP "
                f"layers, and model {self.model.name!r} is family generic: only the torch "
                "trainer builds it, and it trains the main model only",
                fields=("recipe.train.mtp_training",),
                fix="set recipe.train.mtp_training: false",
            )
        return self
