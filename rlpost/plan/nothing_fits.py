"""The layout search's report when nothing fits: what would (CPU Adam, a shorter
max_tokens_per_gpu, the torch trainer's remedies, more GPUs), as one planning error."""

from __future__ import annotations

from dataclasses import replace

from rlpost.errors import Issue, UserError
from rlpost.plan.candidates import LayoutSearch, TrainOption, describe_grid, describe_train
from rlpost.plan.engine_memory import longest_request
from rlpost.plan.remedies import (
    MAX_TRAIN_GPUS,
    fsdp_fixes,
    megatron_fewest_gpus,
    shorter_tokens,
    slot_fix,
)
from rlpost.plan.search_space import with_adam
from rlpost.plan.split_options import MARGIN_FRACTION, SplitOptions
from rlpost.plan.work import SEND_WEIGHTS, TRAIN, train_rank_work
from rlpost.schema import RunConfig
from rlpost.schema.hardware import device_word


def suggestions(cfg: RunConfig, splits: list[SplitOptions]) -> list[str]:
    """Nothing fits: what would (CPU Adam, a shorter max_tokens_per_gpu, more GPUs); in
    mode=eval, what the evaluation holds alone: the weights its train ranks send, if any
    start, and the engines'."""
    found = []
    device = device_word(cfg.hardware.kind)
    trains = [t for s in splits for t, _ in s.rejected_trains]
    work = train_rank_work(cfg)
    if trains and work == SEND_WEIGHTS:
        least = min(trains, key=lambda t: t.memory.total_gib)
        budget = cfg.hardware.gpu_memory_gib * (1 - MARGIN_FRACTION)
        found.append(
            f"the train ranks that load the evaluated weights and send them to the engines "
            f"need {least.memory.total_gib:.1f} GiB per {device} of {budget:.1f} usable at the "
            f"least ({describe_grid(least.parallel, least.fsdp)}): use a larger hardware "
            "profile, or evaluate a Hugging Face folder of the weights (model.hf_checkpoint, "
            "without model.load or run.resume), which the engines load themselves"
        )
    elif trains and work == TRAIN:
        rejected = [pair for s in splits for pair in s.rejected_trains]
        least, why = min(rejected, key=lambda pair: pair[0].memory.total_gib)
        split = next(s for s in splits if any(t is least for t, _ in s.rejected_trains))
        colocate = split.sizes.colocate
        budget = cfg.hardware.gpu_memory_gib * (1 - MARGIN_FRACTION)
        leanest = least.describe()
        if least.memory.total_gib <= budget:  # its GPUs hold it: something else does not
            found.append(f"the leanest training layout ({leanest}) {why}")
        else:
            found.append(
                f"the leanest training layout ({leanest}) "
                f"needs {least.memory.total_gib:.1f} GiB per {device} of {budget:.1f} usable"
            )
        if least.fsdp is not None:  # each remedy tried on the torch trainer's estimate
            if least.memory.total_gib > budget:
                remedies = fsdp_fixes(cfg, least.parallel, colocate, budget)  # what it accepts
                found.append("for the torch trainer, " + remedies)
        else:
            static = least.memory.total_gib - least.memory.activations_gib - least.memory.logits_gib
            tokens = cfg.recipe.train.max_tokens_per_gpu
            if static < budget < least.memory.total_gib and tokens:
                adam = with_adam(cfg, least.cpu_offload)
                fits = shorter_tokens(adam, least.parallel, colocate, budget)
                if fits:
                    found.append(
                        f"recipe.train.max_tokens_per_gpu={fits[0]} fits it ({fits[1]:.1f} GiB)"
                    )
            found.append(_more_megatron_gpus(cfg, split, least, budget))
    engines = [e for s in splits for e, _ in s.rejected_engines]
    if engines and not any(s.engines for s in splits):
        response = longest_request(cfg).response_key
        found.append(
            "no engine holds one sample: give the rollout more GPUs, raise "
            f"layout.rollout.sglang.mem_fraction_static or shorten {response}"
        )
    return found


def _more_megatron_gpus(
    cfg: RunConfig, split: SplitOptions, least: TrainOption, budget: float
) -> str:
    """The fewest GPUs on which megatron-core's estimate fits a split of the model, with the
    leanest layout's recompute and optimizer (rlpost.plan.remedies.megatron_fewest_gpus),
    counted as a profile needs them: the engines' GPUs too where the leanest layout has its
    own."""
    hw = cfg.hardware
    device, devices = device_word(hw.kind), device_word(hw.kind, 2)
    t = cfg.layout.train  # the first and last stages as the user sets them, not the search
    par = replace(
        least.parallel,
        num_layers_in_first_pipeline_stage=t.num_layers_in_first_pipeline_stage,
        num_layers_in_last_pipeline_stage=t.num_layers_in_last_pipeline_stage,
    )
    found = megatron_fewest_gpus(
        with_adam(cfg, least.cpu_offload), par, split.sizes.colocate, budget
    )
    if found is None:
        nothing = (
            f"no split of the model over up to {MAX_TRAIN_GPUS} {devices} of "
            f"{hw.gpu_memory_gib:g} GiB fits megatron-core's estimate: "
        )
        if hw.kind != "gpu":  # a device slot's memory is nominal
            return nothing + slot_fix(least.memory.total_gib / (1 - MARGIN_FRACTION))
        return nothing + "use GPUs with more memory"
    grid, need = found
    rollout = 0 if split.sizes.colocate else split.sizes.rollout_gpus
    total = grid.world + rollout
    nodes = -(-total // hw.gpus_per_node)
    engines = f", besides the engines' {rollout}" if rollout else ""
    return (
        f"megatron-core's estimate fits training on {grid.world} {devices}{engines} "
        f"({describe_train(grid, least.cpu_offload, on_gpu=hw.kind == 'gpu')}: {need:.1f} GiB "
        f"per {device}, and the host's memory per node): use a hardware profile with {total} "
        f"{devices} of {hw.gpu_memory_gib:g} GiB ({nodes} node(s) of {hw.gpus_per_node})"
    )


def nothing_fits(search: LayoutSearch) -> UserError:
    lines = "; ".join(search.suggestions) or "see the rejected layouts in mode=plan"
    return UserError(
        [
            Issue(
                "layout",
                f"no layout fits: {search.enumerated} candidates searched, none passes every "
                "check with its memory",
                lines,
                "auto",
            )
        ],
        title="planning error",
    )
