"""mode=eval reads no training setting: rlpost.schema.training_only lists them, a launch refuses
them on its command line, and a training recipe's own (from its files) are kept and noted.

`test_no_listed_key_changes_what_an_evaluation_does` holds the list to what mode=eval reads:
each listed key, changed as a file would change it, leaves unchanged everything the
evaluation's launch carries out (the engines, the train ranks and what they send, the
evaluation sets and their sampling).
"""

from __future__ import annotations

import dataclasses
import glob
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlpost.config.loader import compose_run_config
from rlpost.errors import UserError
from rlpost.plan import Plan, build_plan, plan_config
from rlpost.plan.fit import memory_issues
from rlpost.plan.plan import TRAINING_SETTINGS_NOTE
from rlpost.plan.work import NO_TRAIN_RANK, SEND_WEIGHTS
from rlpost.schema import RecipeConfig, RunConfig
from rlpost.schema.training_only import TRAINING_ONLY, set_training_only, training_only

REPO = Path(__file__).resolve().parents[2]
TINY = ("model=qwen3-tiny", "recipe=grpo_tiny_math", "hardware=cpu")
GPU = ("model=qwen3-1.7b", "hardware=h100x8")
ComposeRun = Callable[..., RunConfig]
LOADS = "model.load=/ckpt/policy"  # other weights than the engines start with: train ranks send

# Each listed key, changed (with what it needs beside it, itself training-only) to a value
# the run validates with; () for a key with one valid value.
CHANGED: dict[str, tuple[str, ...]] = {
    "recipe.optim.optimizer": (),  # adam only
    "recipe.optim.lr": ("recipe.optim.lr=3e-5",),
    "recipe.optim.min_lr": (
        "recipe.optim.lr_decay_style=cosine",
        "recipe.optim.lr_decay_steps=7",
        "recipe.optim.min_lr=1e-8",
    ),
    "recipe.optim.lr_decay_style": (
        "recipe.optim.lr_decay_style=linear",
        "recipe.optim.lr_decay_steps=7",
        "recipe.optim.min_lr=1e-8",
    ),
    "recipe.optim.lr_warmup_steps": ("recipe.optim.lr_warmup_steps=5",),
    "recipe.optim.lr_decay_steps": (
        "recipe.optim.lr_decay_style=cosine",
        "recipe.optim.lr_decay_steps=9",
        "recipe.optim.min_lr=1e-7",
    ),
    "recipe.optim.weight_decay": ("recipe.optim.weight_decay=0.01",),
    "recipe.optim.adam_beta1": ("recipe.optim.adam_beta1=0.8",),
    "recipe.optim.adam_beta2": ("recipe.optim.adam_beta2=0.95",),
    "recipe.optim.adam_eps": ("recipe.optim.adam_eps=1e-6",),
    "recipe.optim.clip_grad": ("recipe.optim.clip_grad=0.5",),
    "recipe.optim.cpu_offload": ("recipe.optim.cpu_offload=true",),
    "recipe.optim.overlap_cpu_optimizer_d2h_h2d": (
        "recipe.optim.cpu_offload=true",
        "recipe.optim.overlap_cpu_optimizer_d2h_h2d=true",
    ),
    "recipe.optim.precision_aware_optimizer": ("recipe.optim.precision_aware_optimizer=true",),
    "recipe.algo.advantage_estimator": (
        "recipe.algo.advantage_estimator=reinforce_plus_plus_baseline",
    ),
    "recipe.algo.grpo_std_normalization": ("recipe.algo.grpo_std_normalization=false",),
    "recipe.algo.normalize_advantages": ("recipe.algo.normalize_advantages=true",),
    "recipe.algo.gamma": (
        "recipe.algo.advantage_estimator=reinforce_plus_plus",
        "recipe.algo.gamma=0.9",
    ),
    "recipe.algo.use_kl_loss": ("recipe.algo.use_kl_loss=false",),
    "recipe.algo.kl_loss_coef": ("recipe.algo.kl_loss_coef=0.01",),
    "recipe.algo.kl_loss_type": ("recipe.algo.kl_loss_type=k3",),
    "recipe.algo.kl_coef": (
        "recipe.algo.advantage_estimator=reinforce_plus_plus",
        "recipe.algo.use_kl_loss=false",
        "recipe.algo.kl_coef=0.01",
    ),
    "recipe.algo.kl_metric_interval": ("recipe.algo.kl_metric_interval=5",),
    "recipe.algo.entropy_coef": ("recipe.algo.entropy_coef=0.01",),
    "recipe.algo.eps_clip": ("recipe.algo.eps_clip=0.1",),
    "recipe.algo.eps_clip_high": ("recipe.algo.eps_clip_high=0.3",),
    "recipe.algo.eps_clip_c": ("recipe.algo.eps_clip_c=3.0",),
    "recipe.algo.loss_reduction": ("recipe.algo.loss_reduction=token_mean",),
    "recipe.algo.off_policy_correction": ("recipe.algo.off_policy_correction=tis",),
    "recipe.algo.tis_clip_low": (
        "recipe.algo.off_policy_correction=tis",
        "recipe.algo.tis_clip_low=0.5",
    ),
    "recipe.algo.tis_clip_high": (
        "recipe.algo.off_policy_correction=tis",
        "recipe.algo.tis_clip_high=3.0",
    ),
    "recipe.algo.behaviour_weight_cap": (
        "recipe.algo.off_policy_correction=decoupled_ppo",
        "recipe.algo.behaviour_weight_cap=2.0",
    ),
    "recipe.train.global_batch_size": ("recipe.train.global_batch_size=32",),
    "recipe.train.micro_batch_size": (
        "recipe.train.use_dynamic_batch_size=false",
        "recipe.train.max_tokens_per_gpu=null",
        "recipe.train.micro_batch_size=2",
    ),
    "recipe.train.use_dynamic_batch_size": (
        "recipe.train.use_dynamic_batch_size=false",
        "recipe.train.max_tokens_per_gpu=null",
    ),
    "recipe.train.max_tokens_per_gpu": ("recipe.train.max_tokens_per_gpu=4096",),
    "recipe.train.balance_data": ("recipe.train.balance_data=false",),
    # refused unless recipe.train.mtp_training trains MTP layers, which qwen3 has none of; it
    # weighs their loss in the train step only (rlpost.backends.megatron.mtp.mtp_loss_factor)
    "recipe.train.mtp_loss_scaling_factor": (),
    "recipe.save.interval": ("recipe.save.interval=5",),
    "recipe.save.keep_last": ("recipe.save.keep_last=1",),
    "recipe.save.save_hf_interval": ("recipe.save.save_hf_interval=10",),
    "recipe.save.save_optimizer": ("recipe.save.save_optimizer=false",),
    "recipe.loop.update_weights_interval": ("recipe.loop.update_weights_interval=2",),
    # the fully_async loop's own (changed on grpo_dapo_fully_async: FULLY_ASYNC)
    "recipe.loop.max_staleness": ("recipe.loop.max_staleness=1",),
    "recipe.loop.max_buffered_groups": ("recipe.loop.max_buffered_groups=96",),
    "recipe.loop.stale_groups": ("recipe.loop.stale_groups=drop",),
    "recipe.rollout.num_rollout": ("recipe.rollout.num_rollout=7",),
    "recipe.rollout.batch_size": ("recipe.rollout.batch_size=64",),
    "recipe.rollout.n_samples_per_prompt": ("recipe.rollout.n_samples_per_prompt=16",),
    "recipe.rollout.over_sampling_batch_size": (
        "recipe.rollout.dynamic_sampling_filter=rlpost.filters.check_reward_nonzero_std",
        "recipe.rollout.over_sampling_batch_size=48",
    ),
    "recipe.rollout.dynamic_sampling_filter": (
        "recipe.rollout.dynamic_sampling_filter=rlpost.filters.check_reward_nonzero_std",
    ),
    "recipe.rollout.max_draws_per_rollout": (
        "recipe.rollout.dynamic_sampling_filter=rlpost.filters.check_reward_nonzero_std",
        "recipe.rollout.max_draws_per_rollout=8",
    ),
    "recipe.rollout.partial_rollout": (
        "recipe.rollout.dynamic_sampling_filter=rlpost.filters.check_reward_nonzero_std",
        "recipe.rollout.over_sampling_batch_size=48",
        "recipe.rollout.partial_rollout=true",
    ),
    "recipe.rollout.mask_offpolicy_in_partial_rollout": (
        "recipe.rollout.dynamic_sampling_filter=rlpost.filters.check_reward_nonzero_std",
        "recipe.rollout.over_sampling_batch_size=48",
        "recipe.rollout.partial_rollout=true",
        "recipe.rollout.mask_offpolicy_in_partial_rollout=true",
    ),
    "recipe.rollout.buffer_filter": (
        "recipe.rollout.dynamic_sampling_filter=rlpost.filters.check_reward_nonzero_std",
        "recipe.rollout.over_sampling_batch_size=48",
        "recipe.rollout.partial_rollout=true",
        "recipe.rollout.buffer_filter=rlpost.filters.pop_first",
    ),
    "recipe.data.prompt_data": ("recipe.data.prompt_data=/elsewhere/train.jsonl",),
    "recipe.data.source": ("recipe.data.source=rlpost_test_hooks.FeedbackSource",),
    "recipe.data.source_settings": (
        "recipe.data.source=rlpost_test_hooks.FeedbackSource",
        "recipe.data.source_settings={max_repeats: 3}",
    ),
    "recipe.data.shuffle": ("recipe.data.shuffle=true",),
    "recipe.data.seed": ("recipe.data.shuffle=true", "recipe.data.seed=7"),
    "recipe.data.max_prompt_len": ("recipe.data.max_prompt_len=64",),
    "recipe.eval.interval": ("recipe.eval.interval=5",),
    "recipe.eval.skip_before_train": ("recipe.eval.skip_before_train=true",),
    "run.on_sigterm": ("run.on_sigterm=stop",),
}

FULLY_ASYNC = {
    "recipe.loop.max_staleness",
    "recipe.loop.max_buffered_groups",
    "recipe.loop.stale_groups",
}


@pytest.fixture(autouse=True)
def test_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's data source class (recipe.data.source) importable by its dotted path."""
    monkeypatch.syspath_prepend(str(REPO / "tests" / "hooks_fixtures"))


def listed_keys() -> list[str]:
    """Every key TRAINING_ONLY lists, a whole section's expanded to its fields."""
    probe = compose_run_config(list(TINY))[0]
    keys = []
    for entry in TRAINING_ONLY:
        section: Any = probe
        for part in entry.section.split("."):
            section = getattr(section, part)
        names = entry.keys or tuple(type(section).model_fields)
        keys += [f"{entry.section}.{name}" for name in names]
    return keys


def test_every_listed_key_is_changed_below() -> None:
    assert sorted(listed_keys()) == sorted(CHANGED)
    for key, changes in CHANGED.items():  # what each change sets is itself training-only
        assert all(training_only(c.split("=")[0]) for c in changes), key


def what_the_launch_does(plan: Plan) -> Plan:
    """The plan less what only training reads: the batch arithmetic and step prediction (no
    step runs), the loop's bounds (the rollout pipeline is never started), the notes, and a
    layout search's table of the candidates (the layout it chose stays); with no train rank
    at all, the training side's memory too, which is shown, neither checked nor held to the
    hardware (rlpost.plan.plan.NO_TRAINING_NOTE)."""
    memory = plan.memory
    if not plan.starts_train_ranks:
        memory = dataclasses.replace(memory, train=None, host=None)  # type: ignore[arg-type]
    return dataclasses.replace(
        plan,
        batch=None,  # type: ignore[arg-type]
        prediction=None,  # type: ignore[arg-type]
        runtime=dataclasses.replace(plan.runtime, loop=None),  # type: ignore[arg-type]
        memory=memory,
        notes=(),
        search=None,
    )


@pytest.mark.parametrize(
    ("base", "train_ranks"),
    [
        ((*GPU, "mode=eval"), NO_TRAIN_RANK),
        ((*GPU, "mode=eval", LOADS), SEND_WEIGHTS),
        ((*GPU, "mode=eval", LOADS, "layout=auto"), SEND_WEIGHTS),
    ],
    ids=["served weights", "sent weights", "sent weights, searched layout"],
)
def test_no_listed_key_changes_what_an_evaluation_does(
    base: tuple[str, ...], train_ranks: str, compose_run: ComposeRun
) -> None:
    for recipe in ("recipe=grpo_dapo", "recipe=grpo_dapo_fully_async"):
        plan = plan_config(compose_run(*base, recipe))[1]
        assert plan.train_ranks == train_ranks
        assert (plan.search is not None) == ("layout=auto" in base)
        expected = what_the_launch_does(plan)
        for key, changes in CHANGED.items():
            if changes and (key in FULLY_ASYNC) == recipe.endswith("fully_async"):
                changed = plan_config(compose_run(*base, recipe, *changes))[1]
                assert what_the_launch_does(changed) == expected, key


def test_no_listed_key_changes_the_evaluation_sets() -> None:
    """The evaluation's prompts, samples per prompt and sampling (rollout's as fallbacks)."""
    from transformers import AutoTokenizer

    from rlpost.runtime.evaluation import load_eval_sets

    cfg = compose_run_config([*TINY, "mode=eval"])[0]
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.hf_checkpoint, local_files_only=True)
    recipe = cfg.recipe.model_dump()
    expected = load_eval_sets(cfg.recipe, tokenizer, [])
    assert expected and expected[0].groups
    for key, changes in CHANGED.items():
        data = yaml.safe_load(yaml.safe_dump(recipe))
        if key in FULLY_ASYNC:  # the loop's mode, which load_eval_sets does not read either
            changes = ("recipe.loop.mode=fully_async", *changes)
        for change in changes:
            dotted, value = change.split("=", 1)
            if not dotted.startswith("recipe."):  # run.*: load_eval_sets reads the recipe
                continue
            *parents, leaf = dotted.removeprefix("recipe.").split(".")
            node = data
            for part in parents:
                node = node[part]
            node[leaf] = yaml.safe_load(value)
        assert load_eval_sets(RecipeConfig.model_validate(data), tokenizer, []) == expected, key


def refusal(*argv: str) -> UserError:
    with pytest.raises(UserError) as caught:
        compose_run_config(list(argv))
    return caught.value


def test_trainings_batch_and_prompt_bound_on_an_evaluations_command_line_are_refused() -> None:
    """An evaluation generates each set's prompts, its own n_samples_per_prompt each, bounded
    by recipe.eval.max_prompt_len: training's rollout batch and prompt bound shape none of it
    (not its engines, nor layout=auto's timing, rlpost.plan.generation)."""
    given = (
        "recipe.rollout.batch_size=16",
        "recipe.rollout.n_samples_per_prompt=4",
        "recipe.data.max_prompt_len=64",
    )
    error = refusal(*TINY, "mode=eval", *given)
    assert {issue.key for issue in error.issues} == {c.split("=")[0] for c in given}
    samples = next(i for i in error.issues if i.key == "recipe.rollout.n_samples_per_prompt")
    assert "each set at its own samples per prompt" in samples.message
    bound = next(i for i in error.issues if i.key == "recipe.data.max_prompt_len")
    assert "recipe.eval.max_prompt_len" in bound.message


def test_a_training_setting_on_an_evaluations_command_line_is_refused() -> None:
    error = refusal(*TINY, "mode=eval", "recipe.optim.lr=3e-5", "recipe.rollout.num_rollout=7")
    keys = {issue.key: issue for issue in error.issues}
    assert set(keys) == {"recipe.optim.lr", "recipe.rollout.num_rollout"}
    lr = keys["recipe.optim.lr"]
    assert lr.value == 3e-5 and str(lr.location) == "command line: recipe.optim.lr=3e-5"
    assert "mode=eval trains nothing and reads no training settings" in lr.message
    assert "no optimizer" in lr.message
    assert "drop the override recipe.optim.lr=3e-5" in lr.fix and "mode=train" in lr.fix


def test_a_whole_training_section_on_the_command_line_is_one_refusal() -> None:
    error = refusal(*TINY, "mode=eval", "recipe.save={interval: 5, keep_last: 1}")
    [issue] = error.issues
    assert issue.key == "recipe.save"
    assert str(issue.location) == "command line: recipe.save={interval: 5, keep_last: 1}"


def test_what_an_evaluation_reads_may_be_given_on_its_command_line() -> None:
    """Sampling and the response length (the eval sets' fallbacks), the MTP layers it sends
    and the default placement are read."""
    read = (
        "recipe.rollout.temperature=0.7",
        "recipe.rollout.max_response_len=12",
        "recipe.rollout.max_concurrency=8",
        "recipe.train.mtp_training=false",
        "recipe.eval.temperature=0.5",
        "recipe.data.input_key=prompt",
        LOADS,
    )
    cfg = compose_run_config([*TINY, "mode=eval", *read])[0]
    assert cfg.recipe.rollout.temperature == 0.7 and cfg.mode == "eval"


def test_training_settings_from_a_file_are_kept(tmp_path: Path) -> None:
    """An experiment file that sets training settings (as a recipe does) evaluates as it is."""
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "longer.yaml").write_text(
        "# @package _global_\nrecipe:\n  optim:\n    lr: 3.0e-5\n  rollout:\n    num_rollout: 7\n"
    )
    cfg = compose_run_config([*TINY, "mode=eval", "+experiment=longer"], search_path=[tmp_path])[0]
    assert cfg.recipe.optim.lr == 3e-5 and cfg.recipe.rollout.num_rollout == 7


def test_a_training_launch_takes_training_settings_on_its_command_line() -> None:
    cfg = compose_run_config([*TINY, "recipe.optim.lr=3e-5", "recipe.rollout.num_rollout=7"])[0]
    assert cfg.recipe.optim.lr == 3e-5 and cfg.mode == "train"
    assert not [n for n in build_plan(cfg).notes if "mode=eval" in n]


RECIPES = sorted(Path(p).stem for p in glob.glob(str(REPO / "conf" / "recipe" / "*.yaml")))


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("weights", [(), (LOADS,)], ids=["served", "sent"])
def test_every_shipped_recipe_evaluates_as_it_is(recipe: str, weights: tuple[str, ...]) -> None:
    """mode=eval with a shipped training recipe and no training override validates and plans,
    and the plan says which of the recipe's training settings it leaves unread."""
    cfg, _ = compose_run_config(
        ["model=qwen3-1.7b", "hardware=h100x8", f"recipe={recipe}", "mode=eval", *weights]
    )
    plan = build_plan(cfg)
    [note] = [n for n in plan.notes if n.startswith("mode=eval trains nothing")]
    given = set_training_only(cfg)
    assert note == TRAINING_SETTINGS_NOTE.format(given=", ".join(given))
    assert "recipe.optim" in given and any(g.startswith("recipe.rollout") for g in given)


def test_the_note_names_sections_whole_and_single_keys_as_keys(compose_run: ComposeRun) -> None:
    cfg: RunConfig = compose_run(*TINY, "mode=eval")
    given = set_training_only(cfg)
    assert given == [
        "recipe.optim",
        "recipe.algo",
        "recipe.train's batch settings",
        "recipe.save",
        "recipe.rollout's training-rollout settings",
        "recipe.data's training prompts",
        "recipe.eval.interval",
    ]
    changed = compose_run(*TINY, "mode=eval", "recipe.loop.update_weights_interval=2")
    assert "recipe.loop.update_weights_interval" in set_training_only(changed)


def test_an_evaluations_plan_leaves_out_the_notes_on_what_only_training_does() -> None:
    """Partial rollouts' carried tokens, a run that saves nothing, Adam restarting on resume:
    the training plan notes them; the same config evaluated trains nothing and does not."""
    cfg, _ = compose_run_config(
        [
            *GPU,
            "recipe=grpo_dapo_dynamic_sampling",
            "recipe.save.interval=null",
            "recipe.save.save_hf_interval=null",
            "recipe.save.save_optimizer=false",
        ]
    )
    training = (
        "recipe.rollout.partial_rollout continues",
        "recipe.save.interval and recipe.save.save_hf_interval are both null",
        "recipe.save.save_optimizer is false",
    )
    trained = [n for n in build_plan(cfg).notes if n.startswith(training)]
    assert len(trained) == len(training)
    evaluated = build_plan(cfg.model_copy(update={"mode": "eval"})).notes
    assert not [n for n in evaluated if n.startswith(training)]
    assert any(n.startswith("mode=eval trains nothing") for n in evaluated)


def test_validate_summarises_an_evaluation_by_its_sets(capsys: pytest.CaptureFixture[str]) -> None:
    from rlpost.cli.main import main

    main(["validate", *TINY, "mode=eval"])
    out = capsys.readouterr().out
    assert "  eval     1 set(s): arith, evaluated once" in out
    assert "optimizer step(s)" not in out
    main(["validate", *TINY])
    assert "optimizer step(s) each" in capsys.readouterr().out


def test_an_evaluation_neither_checks_nor_loads_the_training_prompts(tmp_path: Path) -> None:
    """They may not be on the machine that evaluates: the preflight reads only the sets'
    files, and the launch's inputs hold no training prompts (the loop builds no pipeline)."""
    from rlpost.preflight.data_files import check_data
    from rlpost.runtime.train import load_inputs

    cfg = compose_run_config([*TINY, "mode=eval"])[0]
    data = cfg.recipe.data.model_copy(update={"prompt_data": str(tmp_path / "gone.jsonl")})
    evaluation = cfg.model_copy(update={"recipe": cfg.recipe.model_copy(update={"data": data})})
    plan = build_plan(evaluation)
    assert check_data(evaluation, plan) == []
    inputs = load_inputs(evaluation, None)
    assert inputs.data is None and inputs.eval_sets and inputs.eval_sets[0].groups
    training = cfg.model_copy(
        update={"mode": "train", "recipe": cfg.recipe.model_copy(update={"data": data})}
    )
    assert [i.key for i in check_data(training, build_plan(training))] == [
        "recipe.data.prompt_data"
    ]


def test_an_evaluation_imports_none_of_trainings_own_hooks() -> None:
    """A filter or data source module that only the training machine has does not refuse an
    evaluation elsewhere: nothing imports it there."""
    from rlpost.config.hook_checks import check_hooks

    recipe = {
        "rollout": {"dynamic_sampling_filter": "nowhere.keep", "buffer_filter": "nowhere.pop"},
        "data": {"source": "nowhere.Source"},
    }
    assert check_hooks({"mode": "eval", "recipe": recipe}) == []
    refused = check_hooks({"mode": "train", "recipe": recipe})
    assert sorted(i.key for i in refused) == [
        "recipe.data.source",
        "recipe.rollout.buffer_filter",
        "recipe.rollout.dynamic_sampling_filter",
    ]


REWARD_MODEL = (
    "recipe.rollout.reward.type=model",
    "recipe.rollout.reward.model=rlpost_test_hooks.BoxedAnswerModel",
)

# Training's rules, each broken by a file (as a reused training recipe would break it): the
# base, the file's settings, the command line's (none training-only), and the key a training
# run is refused on.
BROKEN_TRAINING_RULES: dict[str, tuple[tuple[str, ...], dict[str, Any], tuple[str, ...], str]] = {
    "a labelled reward with no data.label_key, no set graded by it": (
        TINY,
        {"data": {"label_key": None}},
        ("+recipe.eval.datasets.0.reward_type=random",),
        "recipe.data.label_key",
    ),
    "a labelled reward with no data.label_key, the set's own label_key": (
        TINY,
        {"data": {"label_key": None}},
        ("+recipe.eval.datasets.0.label_key=label",),
        "recipe.data.label_key",
    ),
    "rollout not a multiple of the step": (
        TINY,
        {"train": {"global_batch_size": 48}},
        (),
        "recipe.train.global_batch_size",
    ),
    "step larger than a rollout": (
        TINY,
        {"train": {"global_batch_size": 128}},
        (),
        "recipe.train.global_batch_size",
    ),
    "lr decay past the run": (
        TINY,
        {"optim": {"lr_decay_style": "cosine", "lr_decay_steps": 600, "min_lr": 1e-6}},
        (),
        "recipe.optim.lr_decay_steps",
    ),
    "lr decay without steps": (
        TINY,
        {"optim": {"lr_decay_style": "linear"}},
        (),
        "recipe.optim.lr_decay_steps",
    ),
    "no rollout to run": (
        TINY,
        {"rollout": {"num_rollout": 0}},
        (),
        "recipe.rollout.num_rollout",
    ),
    "a training rollout too small for the engines": (
        TINY,
        {
            "rollout": {"batch_size": 1, "n_samples_per_prompt": 4},
            "train": {"global_batch_size": 4},
        },
        ("hardware.gpus_per_node=8", "layout.train.num_gpus=8"),
        "recipe.rollout.batch_size",
    ),
    "an overlapping loop on a colocated layout": (
        TINY,
        {"loop": {"mode": "async"}},
        ("layout.colocate=true",),
        "recipe.loop.mode",
    ),
    "an overlapping loop that cannot repeat exactly": (
        TINY,
        {"loop": {"mode": "async"}},
        ("run.deterministic=true",),
        "run.deterministic",
    ),
    "warmup past the run": (
        TINY,
        {"optim": {"lr_warmup_steps": 60}},
        (),
        "recipe.optim.lr_warmup_steps",
    ),
    "KL coefficient without the KL loss": (
        TINY,
        {"algo": {"use_kl_loss": False, "kl_loss_coef": 0.01}},
        (),
        "recipe.algo.kl_loss_coef",
    ),
    "KL loss of k1": (
        TINY,
        {"algo": {"kl_loss_coef": 0.01, "kl_loss_type": "k1"}},
        (),
        "recipe.algo.kl_loss_type",
    ),
    "KL metric interval beside a KL loss": (
        TINY,
        {"algo": {"kl_loss_coef": 0.01, "kl_metric_interval": 5}},
        (),
        "recipe.algo.kl_metric_interval",
    ),
    "KL loss without a reference": (
        TINY,
        {"algo": {"kl_loss_coef": 0.01}},
        ("model.ref_load=null",),
        "model.ref_load",
    ),
    "groups of one for grpo": (
        TINY,
        {"rollout": {"n_samples_per_prompt": 1}, "train": {"global_batch_size": 8}},
        (),
        "recipe.rollout.n_samples_per_prompt",
    ),
    "engines never updated": (
        TINY,
        {"loop": {"update_weights_interval": 60}},
        (),
        "recipe.loop.update_weights_interval",
    ),
    "CPU Adam on a CPU machine": (
        TINY,
        {"optim": {"cpu_offload": True}},
        (),
        "recipe.optim.cpu_offload",
    ),
    "packing without a cap": (
        TINY,
        {"train": {"max_tokens_per_gpu": None}},
        (),
        "recipe.train.max_tokens_per_gpu",
    ),
    "no training prompts": (
        TINY,
        {"data": {"prompt_data": None}},
        (),
        "recipe.data.prompt_data",
    ),
    "reward model calls smaller than a training group": (
        TINY,
        {},
        (*REWARD_MODEL, "recipe.rollout.reward.model_batch_size=4"),
        "recipe.rollout.reward.model_batch_size",
    ),
    "precision-aware Adam without the distributed optimizer": (
        (*GPU, "recipe=grpo_dapo", LOADS),
        {"optim": {"precision_aware_optimizer": True}},
        ("layout.train.distributed_optimizer=false",),
        "layout.train.distributed_optimizer",
    ),
    "context parallelism without packing": (
        (*GPU, "recipe=grpo_dapo", LOADS),
        {"train": {"use_dynamic_batch_size": False, "max_tokens_per_gpu": None}},
        ("layout.train.cp=2",),
        "layout.train.cp",
    ),
    "megatron's optimizer settings under the torch trainer": (
        (*GPU, "recipe=grpo_dapo", LOADS),
        {"optim": {"precision_aware_optimizer": True}},
        ("trainer.backend=torch", "~layout"),
        "recipe.optim.precision_aware_optimizer",
    ),
    "an FP8 KV cache the loss leaves uncorrected": (
        (*GPU, "recipe=grpo_dapo", LOADS),
        {},
        ("layout.rollout.sglang.kv_cache_dtype=fp8_e4m3",),
        "layout.rollout.sglang.kv_cache_dtype",
    ),
}


def with_recipe_file(tmp_path: Path, settings: dict[str, Any]) -> list[str]:
    """The command-line tokens that add `settings` under recipe from an experiment file."""
    (tmp_path / "experiment").mkdir(exist_ok=True)
    text = "# @package _global_\n" + yaml.safe_dump({"recipe": settings} if settings else {})
    (tmp_path / "experiment" / "reused.yaml").write_text(text)
    return ["+experiment=reused"]


@pytest.mark.parametrize("case", list(BROKEN_TRAINING_RULES))
def test_trainings_rules_pass_an_evaluation_and_still_refuse_training(
    case: str, tmp_path: Path
) -> None:
    base, settings, argv, key = BROKEN_TRAINING_RULES[case]
    given = [*base, *with_recipe_file(tmp_path, settings), *argv]
    cfg = compose_run_config([*given, "mode=eval"], search_path=[tmp_path])[0]
    plan = build_plan(cfg)
    assert plan.train_ranks in (NO_TRAIN_RANK, SEND_WEIGHTS)
    with pytest.raises(UserError) as caught:
        build_plan(compose_run_config(given, search_path=[tmp_path])[0])
    assert key in [issue.key for issue in caught.value.issues]


def test_an_evaluation_set_graded_by_trainings_reward_still_needs_its_labels() -> None:
    """mode=eval passes training's label rule, not the sets' own: a set graded by training's
    labelled reward with no label_key of its own and no data.label_key is refused."""
    error = refusal(*TINY, "mode=eval", "recipe.data.label_key=null")
    [issue] = error.issues
    assert issue.key == "recipe.eval.datasets.0.label_key"
    assert "rollout.reward.type=math grades the set's every response" in issue.message


def test_an_evaluations_refusal_names_no_training_setting_as_its_fix() -> None:
    """layout.train.fsdp beside megatron is refused in either mode; mode=eval's fix leaves out
    megatron's optimizer offload (recipe.optim, which its command line refuses)."""
    given = [*GPU, "recipe=grpo_dapo", LOADS, "layout.train.fsdp.reshard_after_forward=false"]
    fixes = {}
    for mode in ("eval", "train"):
        with pytest.raises(UserError) as caught:
            build_plan(compose_run_config([*given, f"mode={mode}"])[0])
        [issue] = caught.value.issues
        assert issue.key == "layout.train.fsdp.reshard_after_forward"
        fixes[mode] = issue.fix
    assert fixes["eval"] == "remove layout.train.fsdp, or set trainer.backend=torch"
    assert "recipe.optim.cpu_offload" in fixes["train"]


def test_reward_model_calls_still_hold_an_evaluation_sets_group() -> None:
    """The rule keeps its part an evaluation reads: the sets' groups, which it grades."""
    given = [*TINY, "mode=eval", *REWARD_MODEL, "recipe.rollout.reward.model_batch_size=4"]
    assert compose_run_config(given)[0].recipe.rollout.reward.model_batch_size == 4
    error = refusal(*given, "recipe.eval.n_samples_per_prompt=8")
    [issue] = error.issues
    assert issue.key == "recipe.rollout.reward.model_batch_size"
    assert "below eval.n_samples_per_prompt=8" in issue.message


def test_the_senders_memory_is_estimated_once(
    compose_run: ComposeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Colocated, it sizes the engines' derived mem_fraction_static and the memory plan."""
    import rlpost.plan.plan as planning

    calls = []
    estimate = planning.estimate_sender

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return estimate(*args, **kwargs)

    monkeypatch.setattr(planning, "estimate_sender", counted)
    plan = build_plan(compose_run(*GPU, "recipe=grpo_dapo", "mode=eval", LOADS))
    assert plan.train_ranks == SEND_WEIGHTS and plan.placement.colocate
    assert "layout.rollout.sglang.mem_fraction_static" in plan.derived
    assert len(calls) == 1


# engines of one GPU whose KV cache holds 12,799 tokens of qwen3-1.7b: grpo_dapo's training
# samples (8,192 tokens) fit, its evaluation's (eval.max_response_len=16384) do not
SMALL_KV = (*GPU, "recipe=grpo_dapo", "layout.rollout.gpus_per_engine=1")
SMALL_KV_FRACTION = "layout.rollout.sglang.mem_fraction_static=0.07"


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_the_engines_must_hold_the_evaluations_longest_request(
    mode: str, compose_run: ComposeRun
) -> None:
    cfg = compose_run(*SMALL_KV, SMALL_KV_FRACTION, f"mode={mode}")
    plan = build_plan(cfg)
    assert plan.memory.rollout.longest_sample_tokens == 16384
    [issue] = memory_issues(cfg, plan)
    assert issue.key == "layout.rollout"
    assert "holds 12,799 tokens: no room for one 16,384-token sample" in issue.message
    assert "shorten recipe.eval.max_response_len (or recipe.eval.max_prompt_len)" in issue.fix


def test_trainings_length_does_not_size_an_evaluations_engines(compose_run: ComposeRun) -> None:
    """Training's samples, longer than the engines' KV cache, context or the model's
    positions, are never generated by an evaluation: its own sets' lengths decide."""
    lengths = ("recipe.eval.max_response_len=4096", "recipe.rollout.max_response_len=16384")
    cfg = compose_run(*SMALL_KV, SMALL_KV_FRACTION, "mode=eval", *lengths)
    plan = build_plan(cfg)
    assert memory_issues(cfg, plan) == [] and plan.memory.rollout.longest_sample_tokens == 4096
    trained = compose_run(*SMALL_KV, SMALL_KV_FRACTION, *lengths)
    assert memory_issues(trained, build_plan(trained))
    context = ("layout.rollout.sglang.context_length=8192", *lengths)
    build_plan(compose_run(*SMALL_KV, "mode=eval", *context))
    with pytest.raises(UserError) as caught:
        build_plan(compose_run(*SMALL_KV, *context))
    assert [i.key for i in caught.value.issues] == ["layout.rollout.sglang.context_length"]
    beyond = ("recipe.eval.max_response_len=4096", "recipe.rollout.max_response_len=41000")
    assert compose_run(*SMALL_KV, "mode=eval", *beyond).recipe.rollout.max_response_len == 41000
    with pytest.raises(ValueError, match=r"beyond model\.max_position_embeddings=40960"):
        compose_run(*SMALL_KV, *beyond)


def test_an_evaluation_set_at_the_rollouts_length_is_held_without_trainings_prompt_bound(
    compose_run: ComposeRun,
) -> None:
    """A set with no length of its own runs at rollout.max_response_len; its prompts are
    bounded by eval.max_prompt_len (unset: the response alone), never data.max_prompt_len."""
    cfg = compose_run(
        *GPU,
        "recipe=grpo_dapo",
        "mode=eval",
        "recipe.eval.max_response_len=null",
        "recipe.data.max_prompt_len=30000",
    )
    assert build_plan(cfg).memory.rollout.longest_sample_keys == (
        "recipe.rollout.max_response_len",
        "recipe.eval.max_prompt_len",
    )
    assert build_plan(cfg).memory.rollout.longest_sample_tokens == 8192
    bounded = compose_run(*GPU, "recipe=grpo_dapo", "mode=eval", "recipe.eval.max_prompt_len=1024")
    assert build_plan(bounded).memory.rollout.longest_sample_tokens == 1024 + 16384


def test_an_evaluations_plan_notes_its_unset_prompt_bound() -> None:
    """As training's plan notes an unset data.max_prompt_len, an evaluation's notes an unset
    eval.max_prompt_len (its sets' prompts add to the requests); set, nothing is noted, and
    training's note is not an evaluation's."""
    unset = "recipe.eval.max_prompt_len is not set: the longest request counts as "
    cfg, _ = compose_run_config([*TINY, "mode=eval"])
    assert cfg.recipe.eval.max_prompt_len is None
    notes = build_plan(cfg).notes
    assert f"{unset}eval.max_response_len = 16 tokens (prompts add to it)" in notes
    assert not [n for n in notes if n.startswith("recipe.data.max_prompt_len")]
    bounded, _ = compose_run_config([*TINY, "mode=eval", "recipe.eval.max_prompt_len=256"])
    assert not [n for n in build_plan(bounded).notes if "max_prompt_len is not set" in n]
    trained = build_plan(cfg.model_copy(update={"mode": "train"})).notes
    assert not [n for n in trained if n.startswith(unset)]
