"""The training loop as one pipeline with bounds: what each `recipe.loop.mode` means in numbers.

A producer draws prompts, generates and rewards groups, and queues the ones that pass the
dynamic-sampling filter; the trainer takes `rollout.batch_size` groups per train step. Three
numbers bound the producer (rlpost.runtime.pipeline enforces them):

- lookahead_steps L: a group may be started for train step s only once step s - L is done
  (trained, and its weights pushed when due). sync 0: nothing is generated while the trainer
  trains; async 1: rollout N+1 is generated while rollout N trains; fully_async: unbounded.
- max_staleness K: a trained token may be at most K policy versions older than the version
  being trained. sync: update_weights_interval - 1; async: update_weights_interval; fully_async:
  loop.max_staleness (default 4). Tokens a partial rollout carried over from an earlier
  rollout are outside it: a group cut short again is carried again.
- max_buffered_groups C: a draw starts only while fewer than C groups are generating or
  finished ahead of the trainer. A draw starts whole, so where filters drop groups (or the
  trainer takes batches that are not whole draws) up to C - 1 + draw groups are buffered at
  once; the queue's host memory is sized for that.

With a dynamic-sampling filter, a rollout whose batch is not full after
`max_draws_per_rollout` draws' worth of finished groups stops the run (verl's
max_num_gen_batches): a filter that keeps no group would draw forever.

The policy version is the number of train steps whose weights the engines serve; a sample
records the version of each of its tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlpost.config.sources import CONF_DIR
from rlpost.errors import Issue
from rlpost.plan.checks import PlanContext, check
from rlpost.schema import RunConfig
from rlpost.schema.loop import DEFAULT_MAX_STALENESS

# Host bytes per queued token: token id, rollout logprob, weight version and loss mask in
# Python lists (8-byte pointers to small ints / 24-byte floats), rounded up.
QUEUE_BYTES_PER_TOKEN = 96
GIB = float(1 << 30)


@dataclass(frozen=True)
class LoopPlan:
    mode: str
    update_weights_interval: int
    lookahead_steps: int | None  # None: unbounded (fully_async)
    max_staleness: int
    max_buffered_groups: int
    draw_groups: int
    # the most groups buffered at once: the bound, or one draw past it (`most_buffered`)
    most_buffered_groups: int
    stale_groups: str
    queue_host_gib: float
    # rollout.partial_rollout: groups cut short continue in a later rollout, their tokens so
    # far carried over from older policies, outside max_staleness (which counts the tokens
    # since a group last started)
    partial_rollout: bool = False
    # rollout.dynamic_sampling_filter: finished groups may be dropped, and a rollout stops the
    # run once `max_draws_per_rollout` draws' worth of groups finished without filling its
    # batch (None: no limit)
    dynamic_sampling: bool = False
    max_draws_per_rollout: int | None = None


def plan_loop(cfg: RunConfig, longest_sample_tokens: int) -> LoopPlan:
    loop, rollout = cfg.recipe.loop, cfg.recipe.rollout
    interval = loop.update_weights_interval
    draw = rollout.over_sampling_batch_size or rollout.batch_size
    lookahead: int | None
    if loop.mode == "sync":
        lookahead, staleness, buffered = 0, interval - 1, draw
    elif loop.mode == "async":
        lookahead, staleness, buffered = 1, interval, rollout.batch_size + draw
    else:
        lookahead = None
        staleness = DEFAULT_MAX_STALENESS if loop.max_staleness is None else loop.max_staleness
        buffered = loop.max_buffered_groups or rollout.batch_size + draw
    most = most_buffered(
        buffered,
        draw,
        rollout.batch_size,
        lookahead,
        whole_draws=not rollout.dynamic_sampling_filter and loop.mode != "fully_async",
    )
    samples = most * rollout.n_samples_per_prompt
    return LoopPlan(
        mode=loop.mode,
        update_weights_interval=interval,
        lookahead_steps=lookahead,
        max_staleness=staleness,
        max_buffered_groups=buffered,
        draw_groups=draw,
        most_buffered_groups=most,
        stale_groups=loop.stale_groups,
        queue_host_gib=samples * longest_sample_tokens * QUEUE_BYTES_PER_TOKEN / GIB,
        partial_rollout=rollout.partial_rollout,
        dynamic_sampling=bool(rollout.dynamic_sampling_filter),
        max_draws_per_rollout=rollout.max_draws_per_rollout
        if rollout.dynamic_sampling_filter
        else None,
    )


def most_buffered(
    bound: int, draw: int, batch: int, lookahead: int | None, whole_draws: bool
) -> int:
    """The most groups generating or queued at once under the pipeline's draw rule
    (rlpost.runtime.pipeline): a draw of `draw` groups starts while fewer than `bound` are
    buffered and, with a bounded lookahead L, while fewer than (L + 1) batches are (the
    trainer's step is the last one a new group may land in). So the count before a draw is at
    most the threshold less one, and after it one draw more. Where every count is a whole
    number of draws (no filter drops a group, no group is dropped stale, and each train step
    takes whole draws), the most is the threshold rounded up to whole draws."""
    threshold = bound if lookahead is None else min(bound, batch * (lookahead + 1))
    if whole_draws and batch % draw == 0:
        return -(-threshold // draw) * draw
    return threshold - 1 + draw


def asynchronous(cfg: RunConfig) -> bool:
    return cfg.recipe.loop.mode != "sync"


def default_colocate(cfg: RunConfig, sizes_given: bool) -> bool:
    """Colocated unless rollout GPUs are given or the loop overlaps rollout with training."""
    return not asynchronous(cfg) and not sizes_given


@check("async_loop")
def check_async_loop(ctx: PlanContext) -> list[Issue]:
    cfg, sizes = ctx.cfg, ctx.sizes
    mode = cfg.recipe.loop.mode
    issues = []
    if asynchronous(cfg) and sizes.colocate:
        par, total = ctx.parallel, sizes.total_gpus
        replica = par.tp * par.pp * par.cp
        train = max(replica, total // 4 // replica * replica)
        split = (
            f"layout.colocate=false layout.train.num_gpus={train} "
            f"layout.rollout.num_gpus={total - train}"
            if train < total
            else "layout.colocate=false with layout.train.num_gpus and layout.rollout.num_gpus"
        )
        shipped = f"{cfg.layout.name}_async"
        if (CONF_DIR / "layout" / f"{shipped}.yaml").is_file():
            split = f"layout={shipped} (ships for this model and hardware), or {split}"
        issues.append(
            Issue(
                "recipe.loop.mode",
                f"the {mode} loop generates while the trainer trains, which needs separate "
                f"train and rollout {ctx.devices(2)}, and the layout ({cfg.layout.name}) is "
                "colocated",
                f"decouple it, e.g. {split}, or layout=auto (it searches decoupled layouts "
                "only), or use recipe.loop.mode: sync",
                mode,
            )
        )
    if asynchronous(cfg) and cfg.run.deterministic:
        issues.append(
            Issue(
                "run.deterministic",
                f"the {mode} loop overlaps generation with training, so which weights sample "
                "which token depends on timing: its runs cannot repeat exactly",
                "use recipe.loop.mode: sync for exact, repeatable runs, or remove "
                "run.deterministic",
                True,
            )
        )
    return issues
