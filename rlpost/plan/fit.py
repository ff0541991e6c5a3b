"""The plan's verdicts as issues a training launch stops on: its memory (plan.memory_check),
and its training time against the timeout a train call is held to."""

from __future__ import annotations

import math

from rlpost.errors import Issue
from rlpost.plan.fsdp import FsdpTrainMemory
from rlpost.plan.memory import gib_text
from rlpost.plan.plan import Plan
from rlpost.plan.remedies import (
    data_parallel_fixes,
    fsdp_fixes,
    megatron_fixes,
    megatron_sender_fixes,
    sender_fixes,
    slot_fix,
)
from rlpost.schema import RunConfig
from rlpost.schema.hardware import device_word

ANYWAY = "; or set plan.memory_check=warn to launch anyway"


def memory_issues(cfg: RunConfig, plan: Plan) -> list[Issue]:
    """One Issue per part of the run (training, rollout, host) that does not fit (`cfg` is
    what `plan` was built from: the remedies are tried on its estimates)."""
    m = plan.memory
    device = device_word(plan.hardware_kind)
    issues = []
    if not m.train_fits and plan.starts_train_ranks:
        fix = _train_fix(cfg, plan)
        need = "training needs" if plan.trains else "sending the weights to the engines needs"
        issues.append(
            Issue(
                "layout.train",
                f"{need} {m.train.total_gib:.2f} GiB per {device} and {plan.hardware} has "
                f"{m.gpu_gib:.2f} (short by {gib_text(-m.train_margin_gib)}; see mode=plan)",
                fix + ANYWAY,
            )
        )
    if not m.rollout_fits:
        issues.append(
            Issue("layout.rollout", _rollout_shortfall(plan), _rollout_fix(plan) + ANYWAY)
        )
    if not m.host_fits and plan.starts_train_ranks:  # the trainers' (offload, reference)
        issues.append(
            Issue(
                "hardware.host_memory_gib",
                f"each node needs {m.host.total_gib:.2f} GiB of host memory and has "
                f"{m.host.host_gib:.2f} (short by {-m.host_margin_gib:.2f} GiB)",
                "use more nodes, or a machine with more host memory" + ANYWAY,
            )
        )
    return issues


def _train_fix(cfg: RunConfig, plan: Plan) -> str:
    """What lowers a train rank's peak, each remedy tried on the estimate of the plan's
    trainer (rlpost.plan.remedies): megatron-core's, which splits the model (tp, pp, cp, ep)
    and offloads its optimizer; the torch trainer's on GPUs, sized as FSDP2; mode=eval's
    ranks, which only send the weights; the torch trainer's on a CPU profile, data parallel
    with nominal figures, its optimizer in host memory already. A remedy the layout has on
    already is not named."""
    m, par = plan.memory, plan.parallel
    colocate = plan.placement.colocate
    if plan.trainer_backend == "megatron":
        if plan.trains:
            return megatron_fixes(cfg, par, colocate)
        return megatron_sender_fixes(cfg, par, colocate)  # mode=eval: the weights to send
    if isinstance(m.train, FsdpTrainMemory):
        if plan.trains:
            return fsdp_fixes(cfg, par, colocate)
        return sender_fixes(cfg, par, colocate)  # mode=eval: the shards to send
    if plan.trains:
        return data_parallel_fixes(cfg, par, colocate)
    return slot_fix(m.train.total_gib)  # mode=eval: the weights to send, in a larger slot


def _rollout_shortfall(plan: Plan) -> str:
    m = plan.memory
    r = m.rollout
    short = f"short by {gib_text(-m.rollout_margin_gib)}; see mode=plan"
    if r.holds_one_sample:
        device = device_word(plan.hardware_kind)
        return f"an engine {device} needs {r.total_gib:.2f} GiB and has {m.gpu_gib:.2f} ({short})"
    pool = f"{r.mem_fraction_static} x {m.gpu_gib} GiB"
    where = "the static pool" if plan.hardware_kind == "gpu" else "the CPU engine's share"
    held = (
        f"the weights ({r.weights_gib:.2f} GiB) exceed {where} ({pool}) by "
        f"{gib_text(-r.kv_cache_gib)}"
        if r.kv_cache_gib < 0
        else f"the KV cache left in {where} ({pool}) holds {r.kv_cache_tokens_per_gpu:,} tokens"
    )
    return f"{held}: no room for one {r.longest_sample_tokens:,}-token sample ({short})"


def _rollout_fix(plan: Plan) -> str:
    """What the engines take: SGLang's TP and static pool on GPUs; the CPU engine has neither
    (one device slot per engine, no SGLang options), only the slot's nominal memory. A peak
    over the GPU comes down with a smaller pool; a KV cache short of one sample grows with a
    larger one or smaller weight shards, and a shorter sample needs less of it."""
    m = plan.memory
    r = m.rollout
    on_gpu = plan.hardware_kind == "gpu"
    if r.total_gib > m.gpu_gib and on_gpu:
        return (
            "lower layout.rollout.sglang.mem_fraction_static (what the pool leaves holds the "
            "activations, CUDA graphs and a colocated trainer's residue)"
        )
    if on_gpu:
        fixes = [
            "use more GPUs per engine (layout.rollout.gpus_per_engine)",
            "raise layout.rollout.sglang.mem_fraction_static",
        ]
    else:
        fixes = [
            "use a smaller model",
            "raise hardware.gpu_memory_gib (a device slot's nominal share of host memory)",
        ]
    if r.kv_cache_gib > 0:
        response, prompt = r.longest_sample_keys
        fixes.append(f"shorten {response} (or {prompt})")
    return ", ".join(fixes[:-1]) + " or " + fixes[-1]


TIMEOUT_HEADROOM = 2.0
"""How many times the cost model's training seconds per rollout trainer.collective_timeout_s
must allow: the model is calibrated on few runs, and a first step compiles and autotunes."""


def timeout_issues(cfg: RunConfig, plan: Plan) -> list[Issue]:
    """trainer.collective_timeout_s holds every call on the train ranks, a rollout's training
    included: one the cost model predicts near or past it would fail the run after its first
    rollout. GPU profiles only (on CPU the figures are nominal)."""
    timeout, train_s = cfg.trainer.collective_timeout_s, plan.prediction.train_s
    if not plan.trains or plan.hardware_kind != "gpu" or train_s * TIMEOUT_HEADROOM <= timeout:
        return []
    enough = math.ceil(train_s * 3 / 60) * 60
    return [
        Issue(
            "trainer.collective_timeout_s",
            f"a rollout's training is predicted at {train_s:.0f} s (see mode=plan) and every "
            f"call on the train ranks fails past {timeout:g} s: the run would stop at its "
            f"first train step, or at a slow one (less than {TIMEOUT_HEADROOM:g}x headroom)",
            f"raise trainer.collective_timeout_s to {enough} or more, or train less per "
            "rollout (recipe.train.global_batch_size, max_response_len)",
            value=timeout,
        )
    ]
