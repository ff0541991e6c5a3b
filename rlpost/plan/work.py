"""The trainer's work per rollout, decided here: which forward passes run, and what they cost.

Every rollout's tokens go through up to three kinds of pass, counted in forward-equivalents
(a backward costs two forwards; a forward's FLOPs are rlpost.plan.flops'):

- the training forward and backward: 3, plus 1 more with full activation recompute, which
  runs every layer's forward again in the backward;
- the old policy's logprobs: 1, or 0 when the rollout is one optimizer step (the policy that
  is trained is then the old one, and the training forward's own detached logprobs serve);
  KL-in-reward estimators need them before training starts, so they always pay it;
- the reference model's logprobs: 1 on the rollouts it runs. It runs every rollout when its
  KL weighs in the loss or the reward; when it weighs nothing (use_kl_loss with
  kl_loss_coef 0, as in the seeds' recipes) only every `algo.kl_metric_interval` rollouts, to
  log the KL, and with 0 it is neither loaded nor run.

The torch trainer also packs a group's prompt once per micro-batch: the group's responses
attend to that one copy (the same logprobs, since a prompt's hidden states do not depend on
what follows it), so the layers run over prompt + n x response tokens instead of
n x (prompt + response). The compute figure stays an upper bound: it counts every sample's
prompt, since a micro-batch need not hold a whole group.

mode=eval trains nothing: its train ranks, when it starts any (`train_rank_work`), load the
policy's weights and send them to the engines, and run none of these passes.

The trainers and the loop read `Plan.work` and decide none of this themselves.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from rlpost.plan.backends import PROMPT_SHARING, resolve_trainer_backend
from rlpost.plan.batch import BatchPlan
from rlpost.plan.flops import TRAIN_FORWARDS, forward_flops
from rlpost.plan.layout import ParallelLayout
from rlpost.schema import RunConfig

TRAIN_PASSES = TRAIN_FORWARDS  # forward + backward
RECOMPUTE_PASSES = 1.0  # full recompute: the forward once more inside the backward


@dataclass(frozen=True)
class TrainWork:
    reference: str  # loss | reward | metric | off: why the reference model runs
    reference_interval: int  # rollouts between reference forwards; 0: never (not loaded)
    reuse_old_logprobs: bool  # the training forward's own logprobs are the old policy's
    steps_per_rollout: int
    passes_per_rollout: float  # forward-equivalents over the rollout's tokens (averaged)
    recompute_passes: float  # of which recompute: hardware work, not model work (MFU)
    passes_every_forward: float  # the same with old and reference forwards every rollout
    train_tflop_per_rollout: float  # all passes, recompute's too, at the longest samples
    share_prompts: bool  # a group's prompt is packed once per micro-batch (torch trainer)

    @property
    def load_reference(self) -> bool:
        return self.reference_interval > 0

    def reference_due(self, rollout: int) -> bool:
        """Whether rollout `rollout` (0-based) runs the reference forward."""
        return self.load_reference and rollout % self.reference_interval == 0

    @property
    def saved_fraction(self) -> float:
        """The share of the always-every-forward work this plan does not do."""
        if not self.passes_every_forward:  # mode=eval: no pass at all
            return 0.0
        return 1.0 - self.passes_per_rollout / self.passes_every_forward


NO_TRAIN_WORK = TrainWork(
    reference="off",
    reference_interval=0,
    reuse_old_logprobs=False,
    steps_per_rollout=0,
    passes_per_rollout=0.0,
    recompute_passes=0.0,
    passes_every_forward=0.0,
    train_tflop_per_rollout=0.0,
    share_prompts=False,
)
"""mode=eval: no train step, no logprob pass, no reference model."""


def _reference(cfg: RunConfig) -> str:
    algo = cfg.recipe.algo
    if algo.kl_in_loss:
        return "loss"
    if algo.kl_in_reward:
        return "reward"
    return "metric" if algo.kl_metric_interval else "off"


def plan_work(cfg: RunConfig, par: ParallelLayout, batch: BatchPlan) -> TrainWork:
    if cfg.mode == "eval":
        return NO_TRAIN_WORK
    algo = cfg.recipe.algo
    interval = algo.reference_interval
    reuse = batch.steps_per_rollout == 1 and not algo.kl_in_reward
    recompute = RECOMPUTE_PASSES if par.recompute == "full" else 0.0
    train = TRAIN_PASSES + recompute
    passes = train + (0.0 if reuse else 1.0) + (1.0 / interval if interval else 0.0)
    wants_reference = algo.use_kl_loss or algo.kl_in_reward or interval > 0
    every = train + 1.0 + (1.0 if wants_reference else 0.0)
    longest = forward_flops(cfg.model).over([batch.longest_sample_tokens], passes)
    return TrainWork(
        reference=_reference(cfg),
        reference_interval=interval,
        reuse_old_logprobs=reuse,
        steps_per_rollout=batch.steps_per_rollout,
        passes_per_rollout=passes,
        recompute_passes=recompute,
        passes_every_forward=every,
        train_tflop_per_rollout=batch.samples_per_rollout * longest / 1e12,
        share_prompts=resolve_trainer_backend(cfg, par) in PROMPT_SHARING
        and cfg.recipe.rollout.n_samples_per_prompt > 1,
    )


def starts_elsewhere(cfg: RunConfig) -> bool:
    """The policy starts from other weights than the ones the engines load at their start
    (model.load): the first rollout and the evaluation before training must not be
    sampled from the HF folder's."""
    load, served = cfg.model.load, cfg.model.hf_checkpoint
    return load is not None and _real(load) != _real(served)


def _real(path: str) -> str:
    return os.path.realpath(os.path.expanduser(path))


def evaluates_served_weights(cfg: RunConfig) -> bool:
    """mode=eval of model.hf_checkpoint's own weights (no run.resume, no other model.load):
    the engines load them as they start, and no train rank is needed to hand them over, so
    the run neither starts train ranks nor needs room for training."""
    return cfg.mode == "eval" and cfg.run.resume is None and not starts_elsewhere(cfg)


TRAIN, SEND_WEIGHTS, NO_TRAIN_RANK = "train", "send weights", "none"


def train_rank_work(cfg: RunConfig) -> str:
    """What the train ranks do: TRAIN; SEND_WEIGHTS in mode=eval of other weights than the
    engines load at their start (run.resume's checkpoint, model.load), which the train ranks
    load and send to the engines once, and nothing more; NO_TRAIN_RANK when the engines'
    own weights are evaluated."""
    if cfg.mode != "eval":
        return TRAIN
    return NO_TRAIN_RANK if evaluates_served_weights(cfg) else SEND_WEIGHTS


STEP_RULES = frozenset({"global_batch_over_dp", "micro_batch_within_step", "context_parallel"})
"""Rules of the train step's batches (their split over the data-parallel ranks, the packing
context parallelism needs), which an evaluation never runs."""

EVAL_SKIPPED_RULES = frozenset({"sglang_kv_cache_dtype", "rollout_feeds_engines", "async_loop"})
"""Rules every evaluation (mode=eval) skips, whatever its train ranks do, since their subject
is training's loss, rollouts or loop (a KV cache dtype the loss leaves uncorrected, a training
rollout too small for the engines, a loop that overlaps rollouts with train steps): an
evaluation only generates its sets, once."""


def skipped_rules(train_ranks: str) -> frozenset[str]:
    """The rules (scopes or names, rlpost.plan.checks.run_checks' `skip`) that what the train
    ranks do gives no reason to check: none in training; in an evaluation, the rules every
    evaluation skips, with the step's batch rules when the train ranks only send weights, or
    with every training rule when none starts."""
    if train_ranks == NO_TRAIN_RANK:
        return frozenset({"train"}) | EVAL_SKIPPED_RULES
    return STEP_RULES | EVAL_SKIPPED_RULES if train_ranks == SEND_WEIGHTS else frozenset()
