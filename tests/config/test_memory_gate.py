"""A training launch whose plan does not fit in memory stops before anything starts."""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from rlpost.errors import Issue, UserError
from rlpost.plan import build_plan
from rlpost.plan.fit import memory_issues, timeout_issues
from rlpost.schema import RunConfig

REPO = Path(__file__).resolve().parents[2]
ComposeRun = Callable[..., RunConfig]


def test_the_default_and_the_seed_runs_fit(compose_run: ComposeRun) -> None:
    default = compose_run()
    assert memory_issues(default, build_plan(default)) == []
    seed = compose_run("model=glm4.5-355b-a32b", "recipe=grpo_dapo", "hardware=h100x64")
    assert memory_issues(seed, build_plan(seed)) == []


def test_each_part_that_does_not_fit_is_an_issue(compose_run: ComposeRun) -> None:
    # the KL logged every rollout keeps the reference weights in host memory
    cfg = compose_run("model=qwen3-8b", "hardware=cpu", "recipe.algo.kl_metric_interval=1")
    issues = memory_issues(cfg, build_plan(cfg))
    assert [i.key for i in issues] == ["layout.train", "layout.rollout", "hardware.host_memory_gib"]
    assert all("plan.memory_check=warn" in i.fix for i in issues)
    # a KL that weighs nothing and is never logged: no reference weights anywhere
    cfg = compose_run("model=qwen3-8b", "hardware=cpu")
    unlogged = build_plan(cfg)
    assert unlogged.memory.host.reference_weights_gib == 0.0
    assert [i.key for i in memory_issues(cfg, unlogged)] == ["layout.train", "layout.rollout"]


def test_the_launch_refuses_it_with_exit_2_and_no_traceback(tmp_path: Path) -> None:
    command = [sys.executable, "launch.py", "model=qwen3-8b", f"run.dir={tmp_path / 'run'}"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "training needs" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "run" / "ckpt").exists()


def test_validate_runs_the_same_gate_for_a_training_config(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from rlpost.cli.main import main

    with pytest.raises(SystemExit) as caught:
        main(["validate", "--no-local-checks", "model=qwen3-8b"])
    assert caught.value.code == 2 and "memory problems" in capsys.readouterr().err
    warned = ["validate", "--no-local-checks", "model=qwen3-8b", "plan.memory_check=warn"]
    assert main(warned) in (0, None)


def test_a_train_call_predicted_near_its_timeout_is_refused(
    compose_run: ComposeRun, capsys: pytest.CaptureFixture[str]
) -> None:
    """trainer.collective_timeout_s holds a rollout's whole training: the cost model's figure
    needs twice that room (qwen3-4b on one H200: about 261 s)."""
    from rlpost.cli.main import main

    one_gpu = ("model=qwen3-4b", "recipe=grpo_dapo", "hardware=h200x1")
    plan = build_plan(compose_run(*one_gpu))
    assert 200 < plan.prediction.train_s < 300
    assert timeout_issues(compose_run(*one_gpu), plan) == []  # the default 600 s
    tight = compose_run(*one_gpu, "trainer.collective_timeout_s=400")
    (issue,) = timeout_issues(tight, build_plan(tight))
    assert (issue.key, issue.value) == ("trainer.collective_timeout_s", 400)
    assert f"predicted at {plan.prediction.train_s:.0f} s" in issue.message
    assert "raise trainer.collective_timeout_s to 840 or more" in issue.fix
    cpu = compose_run("trainer.collective_timeout_s=1")  # nominal CPU figures: no verdict
    assert timeout_issues(cpu, build_plan(cpu)) == []
    with pytest.raises(SystemExit) as caught:
        main(["validate", "--no-local-checks", *one_gpu, "trainer.collective_timeout_s=400"])
    err = capsys.readouterr().err
    assert caught.value.code == 2 and "launch problem" in err and "collective_timeout_s" in err


def test_a_rollout_that_does_not_fit_on_cpu_says_what_is_short_and_a_fix_cpu_takes(
    compose_run: ComposeRun,
) -> None:
    from rlpost.plan import render_plan

    cfg = compose_run("model=qwen3-4b", "hardware=cpu")
    plan = build_plan(cfg)
    (issue,) = [i for i in memory_issues(cfg, plan) if i.key == "layout.rollout"]
    excess = plan.memory.rollout.weights_gib - 0.9 * 8.0
    assert f"exceed the CPU engine's share (0.9 x 8.0 GiB) by {excess:.2f} GiB" in issue.message
    assert f"(short by {excess:.2f} GiB" in issue.message and excess >= 0.01
    text = render_plan(plan, "table")
    assert f"rollout: DOES NOT FIT, short by {excess:.2f} GiB" in text
    assert "-0." not in text.split("rollout: DOES NOT FIT")[1].split("host")[0]
    # neither SGLang's knob nor engine TP: the CPU engine takes neither
    assert "mem_fraction_static" not in issue.fix and "gpus_per_engine" not in issue.fix
    assert "max_response_len" not in issue.fix  # no sample fits while the weights overfill
    assert "hardware.gpu_memory_gib" in issue.fix
    roomier = compose_run("model=qwen3-4b", "hardware=cpu", "hardware.gpu_memory_gib=9")
    assert [i.key for i in memory_issues(roomier, build_plan(roomier))] == ["layout.train"]


def test_a_shortfall_under_a_hundredth_of_a_gib_is_not_short_by_zero(
    compose_run: ComposeRun,
) -> None:
    from rlpost.plan import render_plan

    # the weights leave a KV cache of a few tokens, short of one 16-token sample by some MiB
    cfg = compose_run("model=qwen3-4b", "hardware=cpu", "hardware.gpu_memory_gib=8.325")
    plan = build_plan(cfg)
    (issue,) = [i for i in memory_issues(cfg, plan) if i.key == "layout.rollout"]
    short = -plan.memory.rollout_margin_gib
    assert 0 < short < 0.005
    assert f"short by {short * 1024:.2f} MiB" in issue.message
    assert "short by 0.00" not in issue.message + render_plan(plan, "table")


def test_a_rollout_that_does_not_fit_on_gpus_names_the_sglang_fix_that_helps(
    compose_run: ComposeRun,
) -> None:
    tight = ("model=qwen3-8b", "hardware=h100x8", "layout.rollout.gpus_per_engine=1")

    def rollout_issues(fraction: float) -> list[Issue]:
        option = f"layout.rollout.sglang.mem_fraction_static={fraction}"
        cfg = compose_run(*tight, option)
        issues = memory_issues(cfg, build_plan(cfg))
        return [i for i in issues if i.key == "layout.rollout"]

    (small_pool,) = rollout_issues(0.2)  # the weight shard overfills the pool
    assert "raise layout.rollout.sglang.mem_fraction_static" in small_pool.fix
    assert "layout.rollout.gpus_per_engine" in small_pool.fix
    (large_pool,) = rollout_issues(0.8)  # the peak over the GPU: less pool, not more
    assert "an engine GPU needs" in large_pool.message
    assert large_pool.fix.startswith("lower layout.rollout.sglang.mem_fraction_static")
    assert rollout_issues(0.5) == []


def test_training_that_does_not_fit_on_cpu_names_no_optimizer_offload(
    compose_run: ComposeRun,
) -> None:
    cfg = compose_run("model=qwen3-4b", "hardware=cpu")
    plan = build_plan(cfg)
    (issue,) = [i for i in memory_issues(cfg, plan) if i.key == "layout.train"]
    assert "offload" not in issue.fix  # recipe.optim.cpu_offload is refused on a CPU profile
    assert "hardware.gpu_memory_gib=" in issue.fix
    need = math.ceil(plan.memory.train.total_gib)
    roomier = compose_run("model=qwen3-4b", f"hardware.gpu_memory_gib={need}")
    assert memory_issues(roomier, build_plan(roomier)) == []


def validate_refusal(capsys: pytest.CaptureFixture[str], *overrides: str) -> str:
    """`rlpost validate`'s refusal of `overrides`: exit 2, no traceback."""
    from rlpost.cli.main import main

    with pytest.raises(SystemExit) as caught:
        main(["validate", "--no-local-checks", *overrides])
    err = capsys.readouterr().err
    assert caught.value.code == 2 and "Traceback" not in err, err
    return err


def train_fix(err: str) -> str:
    """The fix of the refusal's layout.train memory issue."""
    block = err.split("\n  layout.train ", 1)[1]
    return block.split("\n    fix: ", 1)[1].split("\n", 1)[0]


# a 70B-shaped model that transformers builds (family generic): the torch trainer's alone
GENERIC_70B = (
    "model=llama3.1-8b",
    "model.name=big",
    "model.family=generic",
    "model.hf_architecture=MistralForCausalLM",
    "model.rope_scaling=null",
    "model.hidden_size=8192",
    "model.num_layers=80",
    "model.num_attention_heads=64",
    "model.ffn_hidden_size=28672",
    "recipe=grpo_dapo",
    "hardware=h100x8",
)


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_the_torch_trainers_refusal_on_cpu_names_no_model_parallelism(
    backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The torch trainer is data parallel only: on a CPU profile its remedies are recompute,
    shorter micro-batches and a larger slot, each tried on its estimate (qwen3-4b's weights
    and Adam alone overfill an 8 GiB slot: only the slot is named); megatron's split the
    model."""
    cpu = ("model=qwen3-4b", "hardware=cpu")
    fix = train_fix(validate_refusal(capsys, *cpu, f"trainer.backend={backend}"))
    assert fix.startswith(
        "hardware.gpu_memory_gib=66 (a device slot's nominal share of host memory); or set "
    )
    assert "tp" not in fix.split(";")[0] and "pp" not in fix
    # megatron-core's split is tried too: none of qwen3-4b's fits two 8 GiB slots
    fix = train_fix(validate_refusal(capsys, *cpu, "trainer.backend=megatron"))
    assert fix.startswith(
        "hardware.gpu_memory_gib=66 (a device slot's nominal share of host memory)"
    )
    assert "layout.train.tp" not in fix


def test_the_torch_trainers_refusal_on_gpus_names_what_is_not_on_already(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """GPU profiles recompute every layer by default: the fix leaves it out, and with the
    shards offloaded already, offload too."""
    given = (*GENERIC_70B, "layout.train.dp=8")
    fix = train_fix(validate_refusal(capsys, *given))
    assert fix.startswith("any one of: layout.train.fsdp.cpu_offload: true (")
    assert "recompute" not in fix and "tp" not in fix.split(";")[0]
    offloaded = (
        *given,
        "layout.train.fsdp.cpu_offload=true",
        "recipe.train.max_tokens_per_gpu=1000000",
    )
    fix = train_fix(validate_refusal(capsys, *offloaded))
    assert fix.startswith("recipe.train.max_tokens_per_gpu=38912 (")
    assert "cpu_offload" not in fix


def train_refusal(compose_run: ComposeRun, *overrides: str) -> Issue:
    """The layout.train memory issue of `overrides`' plan."""
    cfg = compose_run(*overrides)
    (issue,) = [i for i in memory_issues(cfg, build_plan(cfg)) if i.key == "layout.train"]
    return issue


def fits(compose_run: ComposeRun, *overrides: str) -> bool:
    cfg = compose_run(*overrides)
    return build_plan(cfg).memory.train_fits


# qwen3-8b's shape on 8 H100s, data parallel, with micro-batches of 262,144 tokens: the
# activations and logits (not the shards) overfill each GPU
LONG_MICRO_BATCHES = (
    "model=qwen3-8b",
    "recipe=grpo_dapo",
    "hardware=h100x8",
    "layout.train.dp=8",
    "recipe.train.max_tokens_per_gpu=262144",
)
AS_GENERIC = ("model.family=generic", "model.hf_architecture=Qwen3ForCausalLM")


def test_the_torch_trainers_refusal_on_gpus_names_only_the_remedies_that_fit(
    compose_run: ComposeRun,
) -> None:
    """Each remedy is tried on the estimate: offloading the shards or more GPUs leave the
    activations as they are and still do not fit, so only the shorter micro-batch is named,
    and it fits."""
    given = (*LONG_MICRO_BATCHES, *AS_GENERIC)
    issue = train_refusal(compose_run, *given)
    remedy = "recipe.train.max_tokens_per_gpu=121856"  # the longest that fits, in steps of 512
    assert issue.fix.startswith(f"{remedy} (")
    for unfit in ("cpu_offload", "GPUs", "num_gpus", "megatron"):
        assert unfit not in issue.fix
    assert fits(compose_run, *given, remedy)
    assert not fits(compose_run, *given, "recipe.train.max_tokens_per_gpu=122368")
    assert not fits(compose_run, *given, "layout.train.fsdp.cpu_offload=true")
    assert not fits(compose_run, *given, "hardware=h100x64", "layout.train.dp=64")


def test_a_shipped_family_models_torch_refusal_names_megatron_where_it_fits(
    compose_run: ComposeRun,
) -> None:
    """megatron-core splits the activations and logits over tp, where FSDP2 cannot: for a
    family it has a layer spec for, the refusal names the smallest split its estimate fits
    (the layout's dp given, the new one too); a generic model gets no such remedy."""
    given = (*LONG_MICRO_BATCHES, "trainer.backend=torch")
    issue = train_refusal(compose_run, *given)
    megatron = "trainer.backend=megatron with layout.train.tp=4 and layout.train.dp=2 ("
    assert megatron in issue.fix
    assert issue.fix.startswith("any one of: recipe.train.max_tokens_per_gpu=121856 (")
    megatron_on = (*given, "trainer.backend=megatron")
    assert fits(compose_run, *megatron_on, "layout.train.tp=4", "layout.train.dp=2")
    assert not fits(compose_run, *megatron_on, "layout.train.tp=2", "layout.train.dp=4")
    assert "megatron" not in train_refusal(compose_run, *LONG_MICRO_BATCHES, *AS_GENERIC).fix


def test_where_no_single_change_fits_the_refusal_names_the_combination_that_does(
    compose_run: ComposeRun,
) -> None:
    """A 70B-shaped generic model on 8 H100s with 64k-token micro-batches: its shards
    overfill the GPUs unless offloaded, and its activations unless the micro-batch halves."""
    given = (*GENERIC_70B, "layout.train.dp=8", "recipe.train.max_tokens_per_gpu=65536")
    issue = train_refusal(compose_run, *given)
    assert issue.fix.startswith(
        "no single change makes the torch trainer fit 79.6 GiB: "
        "layout.train.fsdp.cpu_offload: true and recipe.train.max_tokens_per_gpu=38912 "
        "together fit ("
    )
    offload, shorter = "layout.train.fsdp.cpu_offload=true", "recipe.train.max_tokens_per_gpu=38912"
    assert fits(compose_run, *given, offload, shorter)
    assert not fits(compose_run, *given, offload) and not fits(compose_run, *given, shorter)
    # layers of 6.4B parameters: gathered, they overfill an H100 whatever the rest
    wide = (*GENERIC_70B, "layout.train.dp=8", "model.ffn_hidden_size=262144")
    wide += ("layout.rollout.gpus_per_engine=8",)
    issue = train_refusal(compose_run, *wide)
    assert issue.fix.startswith(
        "no single change makes the torch trainer fit 79.6 GiB: even with "
        "layout.train.fsdp.cpu_offload: true and recipe.train.max_tokens_per_gpu=512 it needs "
    )
    assert "use GPUs with more memory" in issue.fix
    assert not fits(compose_run, *wide, offload, "recipe.train.max_tokens_per_gpu=512")


def test_an_evaluations_torch_sender_is_told_to_offload_not_to_split(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """mode=eval of other weights than the engines load: the torch trainer's ranks hold
    float32 shards to send; FSDP2's offload keeps them on the host, and then it fits."""
    from rlpost.cli.main import main

    big = [*GENERIC_70B, "model.num_layers=200", "mode=eval", "model.load=/ckpt/policy"]
    big += ["layout.train.dp=8", "layout.rollout.gpus_per_engine=8"]
    err = validate_refusal(capsys, *big)
    assert "sending the weights to the engines needs" in err
    fix = train_fix(err)
    assert fix.startswith(
        "any one of: layout.train.fsdp.cpu_offload: true (7.9 GiB); a hardware profile with "
        "16 GPUs to train on and layout.train.dp=16 (48.2 GiB)"
    )
    assert "tp" not in fix.split(";")[0]
    offloaded = ["validate", "--no-local-checks", *big, "layout.train.fsdp.cpu_offload=true"]
    assert main(offloaded) in (0, None)
    # each remedy is tried on the sender's estimate: on 40 GiB GPUs, 16 (two nodes) do not
    # fit; 24 (three) do, and their train ranks are not refused there
    small = [*big, "hardware.gpu_memory_gib=40"]
    fix = train_fix(validate_refusal(capsys, *small))
    assert "layout.train.dp=16" not in fix and "24 GPUs to train on and layout.train.dp=24 (" in fix
    three = validate_refusal(capsys, *small, "hardware.num_nodes=3", "layout.train.dp=24")
    assert "\n  layout.train " not in three and "mem_fraction_static" in three


# qwen3-8b trained by megatron-core data parallel over 8 H100s, in micro-batches of 16 whole
# samples (packing off: no max_tokens_per_gpu to shorten): the activations overfill each GPU
MEGATRON_WIDE_BATCHES = (
    "model=qwen3-8b",
    "recipe=grpo_dapo",
    "hardware=h100x8",
    "trainer.backend=megatron",
    "layout.train.tp=1",
    "layout.train.dp=8",
    "recipe.train.use_dynamic_batch_size=false",
    "recipe.train.max_tokens_per_gpu=null",
    "recipe.train.micro_batch_size=16",
)
MEGATRON_OFFLOAD = ("recipe.optim.cpu_offload=true", "recipe.optim.precision_aware_optimizer=true")


def test_megatrons_refusal_names_the_split_that_fits_not_the_offload_that_does_not(
    compose_run: ComposeRun,
) -> None:
    """Each remedy is tried on megatron-core's estimate: its optimizer on the host, or more
    GPUs to shard it over, leave the activations as they are; tp=2 splits them, and fits."""
    issue = train_refusal(compose_run, *MEGATRON_WIDE_BATCHES)
    assert issue.fix.startswith("layout.train.tp=2 and layout.train.dp=4 (")
    assert issue.fix.count(" GiB)") == 1  # nothing else is named
    assert fits(compose_run, *MEGATRON_WIDE_BATCHES, "layout.train.tp=2", "layout.train.dp=4")
    assert not fits(compose_run, *MEGATRON_WIDE_BATCHES, *MEGATRON_OFFLOAD)
    more = ("hardware=h100x16", "layout.train.dp=16")
    assert not fits(compose_run, *MEGATRON_WIDE_BATCHES, *more)


# a 70B-shaped llama (a family megatron-core has a layer spec for) data parallel over 8 H100s
MEGATRON_70B = (
    *(o for o in GENERIC_70B if not o.startswith("model.family") and "hf_architecture" not in o),
    "trainer.backend=megatron",
    "layout.train.tp=1",
    "layout.train.dp=8",
    "layout.rollout.gpus_per_engine=8",
    "recipe.train.max_tokens_per_gpu=131072",
)


def test_where_no_single_change_fits_megatrons_refusal_names_the_combination_that_does(
    compose_run: ComposeRun,
) -> None:
    """Its state needs the optimizer on the host and the model split eight ways, and then
    its activations a micro-batch half as long: the refusal names all of them together."""
    issue = train_refusal(compose_run, *MEGATRON_70B)
    together = (
        "recipe.optim.cpu_offload: true, recipe.optim.precision_aware_optimizer: true, "
        "layout.train.tp=8, layout.train.dp=1 and recipe.train.max_tokens_per_gpu=101376"
    )
    assert issue.fix.startswith(
        f"no single change makes megatron-core fit 79.6 GiB: {together} together fit ("
    )
    split = ("layout.train.tp=8", "layout.train.dp=1")
    shorter = "recipe.train.max_tokens_per_gpu=101376"
    assert fits(compose_run, *MEGATRON_70B, *MEGATRON_OFFLOAD, *split, shorter)
    assert not fits(compose_run, *MEGATRON_70B, *MEGATRON_OFFLOAD, *split)
    for alone in (MEGATRON_OFFLOAD, split, (shorter,)):
        assert not fits(compose_run, *MEGATRON_70B, *alone)


def test_megatrons_refusal_on_cpu_names_no_offload_and_what_each_slot_needs(
    compose_run: ComposeRun,
) -> None:
    """On a CPU profile the optimizer is in host memory already and a slot's memory is
    nominal: full recompute, the longest micro-batch that fits, or a slot that holds it."""
    given = ("model=qwen3-tiny", "hardware=cpu", "trainer.backend=megatron")
    given += ("recipe.train.max_tokens_per_gpu=262144",)
    issue = train_refusal(compose_run, *given)
    remedies = (
        "layout.train.recompute.granularity=full",
        "recipe.train.max_tokens_per_gpu=96768",
        "hardware.gpu_memory_gib=22",
    )
    assert issue.fix.startswith(
        "any one of: layout.train.recompute.granularity: full (7.5 GiB); "
        "recipe.train.max_tokens_per_gpu=96768 (8.0 GiB); hardware.gpu_memory_gib=22 (a "
        "device slot's nominal share of host memory); or set plan.memory_check=warn"
    )
    for remedy in remedies:
        assert fits(compose_run, *given, remedy)
    assert not fits(compose_run, *given, "recipe.train.max_tokens_per_gpu=97280")
    assert not fits(compose_run, *given, "hardware.gpu_memory_gib=21")


def test_an_evaluations_megatron_sender_is_told_the_split_that_fits(
    compose_run: ComposeRun,
) -> None:
    """mode=eval's megatron ranks hold the weights alone, split over tp and pp: the smallest
    split that holds them on these GPUs, or else on the fewest more."""
    given = (*MEGATRON_70B, "mode=eval", "model.load=/ckpt/policy")
    issue = train_refusal(compose_run, *given)
    assert issue.fix.startswith("layout.train.tp=2 and layout.train.dp=4 (")
    assert fits(compose_run, *given, "layout.train.tp=2", "layout.train.dp=4")
    deeper = (*given, "model.num_layers=400")
    issue = train_refusal(compose_run, *deeper)
    assert issue.fix.startswith(
        "a hardware profile with 16 GPUs to train on with layout.train.tp=8, "
        "layout.train.pp=2 and layout.train.dp=1 ("
    )
    on_16 = ("hardware=h100x16", "layout.train.tp=8", "layout.train.pp=2", "layout.train.dp=1")
    assert fits(compose_run, *deeper, *on_16)
    assert not fits(compose_run, *deeper, "layout.train.tp=8", "layout.train.dp=1")


def test_a_model_no_tp_fits_is_told_the_gpus_and_settings_that_do(
    compose_run: ComposeRun,
) -> None:
    """glm4.5-355b-a32b on one node: no tp, no split of 8 GPUs, fits even with its
    optimizer on the host; 32 GPUs with it there and 32 expert ranks do."""
    given = ("model=glm4.5-355b-a32b", "recipe=grpo_dapo", "hardware=h100x8")
    with pytest.raises(UserError) as info:
        build_plan(compose_run(*given))
    (issue,) = [i for i in info.value.issues if i.key == "layout.train.tp"]
    assert issue.fix.startswith(
        "no single change makes megatron-core fit 79.6 GiB: a hardware profile with 32 GPUs "
        "to train on with recipe.optim.cpu_offload: true, "
        "recipe.optim.precision_aware_optimizer: true and layout.train.ep=32 ("
    )
    on_32 = ("hardware.num_nodes=4", *MEGATRON_OFFLOAD, "layout.train.ep=32")
    assert fits(compose_run, *given, *on_32)
    with pytest.raises(UserError):  # 16 do not
        build_plan(compose_run(*given, "hardware.num_nodes=2", *MEGATRON_OFFLOAD))


def test_a_remedy_the_hosts_memory_cannot_hold_is_not_named(compose_run: ComposeRun) -> None:
    """glm4-9b on one H100: Adam on the host would fit the GPU (59.4 GiB) but needs 142 GiB
    of the node's 128, so the plan would refuse it for the host's memory: it is not named,
    and what is named fits the GPU and the host alike: 8 nodes of one GPU, where 7 would hold
    it but are no split the plan accepts (DP7 does not divide the global batch of 256)."""
    given = ("model=glm4-9b", "recipe=grpo_dapo", "hardware=h100x1")
    with pytest.raises(UserError) as info:
        build_plan(compose_run(*given))
    (issue,) = [i for i in info.value.issues if i.key == "layout.train.tp"]
    assert "cpu_offload" not in issue.fix
    assert issue.fix.startswith("a hardware profile with 8 GPUs to train on (")
    plan = build_plan(compose_run(*given, *MEGATRON_OFFLOAD))
    assert plan.memory.train_fits and not plan.memory.host_fits
    plan = build_plan(compose_run(*given, "hardware.num_nodes=8"))
    assert plan.memory.train_fits and plan.memory.host_fits
    with pytest.raises(UserError) as seven:
        build_plan(compose_run(*given, "hardware.num_nodes=7"))
    assert [i.key for i in seven.value.issues] == ["recipe.train.global_batch_size"]


def test_more_gpus_are_named_as_the_fewest_whole_nodes_a_split_fits(
    compose_run: ComposeRun,
) -> None:
    """qwen3-8b trained by megatron-core on one node of 8 GiB GPUs: no change fits; with Adam
    on the host, TP8 and three pipeline stages of its 36 layers fit 24 GPUs, three nodes
    (where doubling named 32). Taken, the train ranks are not refused on three nodes; two
    nodes are told the same 24 (no split of 16 fits)."""
    given = ("model=qwen3-8b", "recipe=grpo_dapo", "hardware=h100x8")
    given += ("hardware.gpu_memory_gib=8", "trainer.backend=megatron")

    def train_issues(*overrides: str) -> list[Issue]:
        with pytest.raises(UserError) as info:  # the engines fit no 8 GiB GPU either
            build_plan(compose_run(*given, *overrides))
        return [i for i in info.value.issues if i.key.startswith("layout.train")]

    (issue,) = train_issues()
    assert issue.fix.startswith(
        "no single change makes megatron-core fit 8 GiB: a hardware profile with 24 GPUs to "
        "train on with recipe.optim.cpu_offload: true, recipe.optim.precision_aware_optimizer: "
        "true and layout.train.pp=3 ("
    ), issue.fix
    offload = ("recipe.optim.cpu_offload=true", "recipe.optim.precision_aware_optimizer=true")
    assert train_issues(*offload, "layout.train.pp=3", "hardware.num_nodes=3") == []
    (two,) = train_issues(*offload, "hardware.num_nodes=2")
    assert "a hardware profile with 24 GPUs to train on with layout.train.pp=3 (" in two.fix


def test_the_torch_trainers_refusal_on_cpu_names_the_remedies_its_estimate_fits(
    compose_run: ComposeRun,
) -> None:
    """qwen3-0.6b in 16 GiB slots, no recompute and 16,384-token micro-batches: full
    recompute, 2,048-token micro-batches and a 59 GiB slot each fit; with 65,536-token
    micro-batches, recompute alone no longer does and is not named. Each named remedy, taken,
    plans a run that fits."""
    given = (
        "model=qwen3-0.6b",
        "hardware=cpu",
        "hardware.gpu_memory_gib=16",
        "layout.train.recompute.granularity=none",
    )
    issue = train_refusal(compose_run, *given, "recipe.train.max_tokens_per_gpu=16384")
    remedies = [
        "layout.train.recompute.granularity: full",
        "recipe.train.max_tokens_per_gpu=2560",
        "hardware.gpu_memory_gib=59",
    ]
    assert issue.fix.startswith(f"any one of: {remedies[0]} (")
    assert all(f"{r} (" in issue.fix for r in remedies)
    for remedy in remedies:
        taken = remedy.replace(": ", "=")
        assert fits(compose_run, *given, "recipe.train.max_tokens_per_gpu=16384", taken)
    longer = train_refusal(compose_run, *given, "recipe.train.max_tokens_per_gpu=65536")
    assert "recompute" not in longer.fix and "max_tokens_per_gpu=2560 (" in longer.fix


def test_where_only_the_hosts_memory_stops_every_remedy_the_refusal_says_so(
    compose_run: ComposeRun,
) -> None:
    """A node of 1 GiB of host memory holds no train rank's process: Adam on the host and a
    micro-batch of 512 tokens would fit the GPU, so the refusal does not ask for GPUs with
    more memory but for host memory."""
    given = ("model=glm4-9b", "recipe=grpo_dapo", "hardware=h100x1", "hardware.host_memory_gib=1")
    with pytest.raises(UserError) as info:
        build_plan(compose_run(*given))
    (issue,) = [i for i in info.value.issues if i.key == "layout.train.tp"]
    assert issue.fix.endswith(
        "but the host's memory per node does not: use nodes with more host memory"
    ), issue.fix
    assert "GPUs with more memory" not in issue.fix
