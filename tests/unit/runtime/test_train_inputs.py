"""The run's inputs as a launch loads them before any actor starts (rlpost.runtime.train)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rlpost.config.loader import compose_run_config
from rlpost.errors import UserError
from rlpost.runtime import checkpoint
from rlpost.runtime.run_state import LoopState, SavedGroups, write_driver_state
from rlpost.runtime.train import load_inputs
from rlpost.schema import RunConfig


def test_a_prompt_whose_request_outgrows_the_context_is_refused_before_any_actor() -> None:
    """With max_prompt_len unset the config bounds a request by its response alone (512
    positions take 500); the tokenized prompts add to it, and the engines would refuse the
    longest at the first rollout or evaluation that drew it."""
    cfg, _ = compose_run_config(["recipe.rollout.max_response_len=500"])
    with pytest.raises(UserError) as refused:
        load_inputs(cfg, None)
    (issue,) = refused.value.issues  # training and evaluation share the key
    assert (issue.key, issue.value) == ("recipe.rollout.max_response_len", 500)
    assert "beyond model.max_position_embeddings=512" in issue.message
    longest = int(issue.message.split("the longest prompt is ")[1].split()[0])
    assert issue.fix.startswith(f"at most {512 - longest} response tokens")
    evaluated, _ = compose_run_config(
        ["recipe.rollout.max_response_len=400", "recipe.eval.max_response_len=500"]
    )
    with pytest.raises(UserError) as eval_refused:
        load_inputs(evaluated, None)
    (issue,) = eval_refused.value.issues
    assert issue.key == "recipe.eval.max_response_len"
    assert issue.message.startswith("evaluation set 'arith''s longest prompt is ")
    assert str(issue.location).startswith(str(evaluated.recipe.eval.datasets[0].path))
    assert "recipe.eval.max_prompt_len: 12 to leave out the longest prompts" in issue.fix
    fits, _ = compose_run_config([f"recipe.rollout.max_response_len={512 - longest}"])
    assert load_inputs(fits, None).eval_sets


def test_a_training_prompt_whose_sample_outgrows_a_generic_models_window_is_refused() -> None:
    """With data.max_prompt_len unset the schema bounds a sample by its response alone; a
    generic model's window (Mistral 7B v0.1's, below its context) then bounds the tokenized
    prompts + response, since the trainers attend over the whole sample. The window is set on
    the default model's section (the check reads only the field)."""
    cfg, _ = compose_run_config([])
    inputs = load_inputs(cfg, None)
    assert inputs.data is not None
    longest = max(len(p.prompt_ids) for p in inputs.data.source.prompts)
    sample = longest + cfg.recipe.rollout.max_response_len

    def windowed(window: int) -> RunConfig:
        model = cfg.model.model_copy(update={"sliding_window": window})
        return cfg.model_copy(update={"model": model})

    with pytest.raises(UserError) as refused:
        load_inputs(windowed(sample - 1), None)
    (issue,) = refused.value.issues
    assert issue.key == "recipe.rollout.max_response_len"
    assert f"= {sample} is beyond model.sliding_window={sample - 1}: the trainers" in issue.message
    assert issue.fix.startswith(f"at most {sample - 1 - longest} response tokens")
    assert load_inputs(windowed(sample), None).data is not None


def test_an_evaluation_restarts_on_the_weights_it_was_given(tmp_path: Path) -> None:
    """A fault during mode=eval restarts it on the same checkpoint (an evaluation saves none
    to continue from), and run.max_restarts needs no save interval there (a recipe without
    one, here an experiment file's); a training run restarts from its newest checkpoint."""
    from rlpost.runtime.train import _resuming

    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "unsaved.yaml").write_text(
        "# @package _global_\nrecipe:\n  save:\n    interval: null\n"
    )
    checkpoint = "runs/exp1/ckpt/rollout_40"
    evaluation, _ = compose_run_config(
        ["mode=eval", f"run.resume={checkpoint}", "run.max_restarts=2", "+experiment=unsaved"],
        search_path=[tmp_path],
    )
    assert evaluation.recipe.save.interval is None
    assert _resuming(evaluation, tmp_path / "eval").run.resume == checkpoint
    run_dir = tmp_path / "run"
    training, _ = compose_run_config(["run.max_restarts=2", f"run.dir={run_dir}"])
    save_checkpoint(run_dir, 2)
    assert _resuming(training, run_dir).run.resume == "auto"


def test_a_fork_restarts_from_the_checkpoint_it_forked_until_it_has_saved_one(
    tmp_path: Path,
) -> None:
    """A fault in a launch that resumed another run's checkpoint (a fork: run.dir of its own),
    before it saved one, restarts from that checkpoint: run.resume=auto found no checkpoint in
    its run.dir and restarted it at rollout 0, from model.hf_checkpoint's weights. Once the
    fork has saved, it restarts from its own newest; a fresh run before its first save, from
    rollout 0 as before."""
    from rlpost.runtime.train import _resuming

    forked, fork = str(tmp_path / "exp1" / "ckpt" / "rollout_40"), tmp_path / "exp1b"
    cfg, _ = compose_run_config(["run.max_restarts=2", f"run.dir={fork}", f"run.resume={forked}"])
    assert _resuming(cfg, fork).run.resume == forked
    fresh, _ = compose_run_config(["run.max_restarts=2", f"run.dir={fork}"])
    assert _resuming(fresh, fork).run.resume is None
    save_checkpoint(fork, 42)
    assert _resuming(cfg, fork).run.resume == "auto"


def test_restarts_with_no_save_before_the_end_are_refused_saying_where_they_would_begin(
    tmp_path: Path,
) -> None:
    """run.max_restarts with no checkpoint written before the end: every restart begins again
    where the launch began, at rollout 0, or for a resumed launch (a fork of another run's
    checkpoint) at the checkpoint run.resume names, not at rollout 0 as it said."""
    forked = str(tmp_path / "exp1" / "ckpt" / "rollout_40")
    unsaved = ["run.max_restarts=2", "recipe.save.interval=null", f"run.dir={tmp_path / 'b'}"]
    for given, said in (
        ([], "begins again at rollout 0"),
        ([f"run.resume={forked}"], f"begins again where the launch began (run.resume={forked})"),
    ):
        with pytest.raises(UserError) as refused:
            compose_run_config([*unsaved, *given])
        (issue,) = refused.value.issues
        assert issue.key == "recipe.save.interval" and said in issue.message, issue.message


def save_checkpoint(run_dir: Path, done: int) -> None:
    """A checkpoint through the real writer (the trainer's file a stand-in)."""
    staging = checkpoint.start_save(run_dir, done)
    state = LoopState(rollouts_done=done, data={})
    write_driver_state(staging, state, SavedGroups([], [], []), "model: {}\n", "{}\n")
    checkpoint.write_synced(staging / "trainer" / "rank_0.pt", b"weights")
    checkpoint.commit_save(staging, keep_last=1)


def test_a_turn_end_the_engines_would_not_stop_at_is_refused_before_any_actor(
    tmp_path: Path,
) -> None:
    """A base model's eos is often its end-of-text while the chat template ends a turn with
    another token (Qwen's <|endoftext|> against <|im_end|>): the engines would never stop a
    response. The shipped tiny model's eos is its template's <|im_end|>; a copy whose
    config, generation config and tokenizer say <|endoftext|> is refused, and the fix the
    message names (stop_token_ids) is accepted."""
    import json
    import shutil

    shipped, _ = compose_run_config([])
    assert load_inputs(shipped, None).data is not None
    folder = tmp_path / "eos_is_end_of_text"
    shutil.copytree(shipped.model.hf_checkpoint, folder)  # type: ignore[attr-defined]
    for name, key, value in (
        ("config.json", "eos_token_id", 0),
        ("generation_config.json", "eos_token_id", 0),
        ("tokenizer_config.json", "eos_token", "<|endoftext|>"),
    ):
        data = json.loads((folder / name).read_text())
        data[key] = value
        (folder / name).write_text(json.dumps(data))
    moved = [f"model.hf_checkpoint={folder}", f"model.ref_load={folder}"]
    cfg, _ = compose_run_config(moved)
    with pytest.raises(UserError) as refused:
        load_inputs(cfg, None)
    (issue,) = refused.value.issues
    assert issue.key == "recipe.rollout.stop_token_ids"
    assert "ends an assistant turn with '<|im_end|>' (id 2)" in issue.message
    assert "eos ids [0]" in issue.message
    assert issue.fix.startswith("add it: recipe.rollout.stop_token_ids: [2]")
    fixed, _ = compose_run_config([*moved, "recipe.rollout.stop_token_ids=[2]"])
    assert load_inputs(fixed, None).data is not None


def test_only_an_evaluation_of_the_engines_own_weights_runs_without_train_ranks() -> None:
    """The engines load model.hf_checkpoint as they start: evaluating it needs no train rank;
    other weights (model.load, a checkpoint) reach the engines through the trainers."""
    from rlpost.plan.work import evaluates_served_weights

    def evaluation(*overrides: str) -> bool:
        cfg, _ = compose_run_config(["mode=eval", *overrides])
        return evaluates_served_weights(cfg)

    assert evaluation()
    assert evaluation("model.load=${model.hf_checkpoint}")  # the same folder
    assert not evaluation("run.resume=runs/exp1/ckpt/rollout_40")
    assert not evaluation("model.load=/elsewhere/policy")
    training, _ = compose_run_config([])
    assert not evaluates_served_weights(training)


def _eval_file(tmp_path: Path, words: list[int]) -> Path:
    """An evaluation set of one prompt per entry, each that many words long."""
    import json

    path = tmp_path / "long_eval.jsonl"
    lines = [
        {"prompt": [{"role": "user", "content": " ".join(["seven"] * n)}], "label": "7"}
        for n in words
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_eval_max_prompt_len_leaves_long_evaluation_prompts_out_before_any_actor(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An evaluation prompt longer than the engines' context would be refused at the first
    evaluation, after the run started: it is refused as the inputs load, naming the set and
    its file, and recipe.eval.max_prompt_len (slime's --eval-max-prompt-len) leaves such
    prompts out of the set, as data.max_prompt_len does for training."""
    path = _eval_file(tmp_path, [2, 600])
    sets = [f"recipe.eval.datasets=[{{name: long, path: {path}}}]"]
    cfg, _ = compose_run_config(sets)
    with pytest.raises(UserError) as refused:
        load_inputs(cfg, None)
    (issue,) = refused.value.issues
    assert issue.key == "recipe.eval.max_response_len"
    assert "evaluation set 'long''s longest prompt is" in issue.message
    assert str(issue.location) == str(path)
    assert "recipe.eval.max_prompt_len: 496" in issue.fix  # 512 positions, 16 response tokens
    bounded, _ = compose_run_config([*sets, "recipe.eval.max_prompt_len=496"])
    with caplog.at_level(logging.WARNING, logger="rlpost"):
        (evaluation,) = load_inputs(bounded, None).eval_sets
    assert (len(evaluation.groups), evaluation.dropped) == (1, 1)
    assert "left out 1 of 2 prompts over recipe.eval.max_prompt_len=496" in caplog.text
    assert len(evaluation.groups[0][0].prompt_ids) <= 496


def test_an_evaluation_set_whose_every_prompt_is_too_long_is_refused_before_any_actor(
    tmp_path: Path,
) -> None:
    """A set that eval.max_prompt_len leaves empty would evaluate nothing (an accuracy of
    no sample): refused with the set, its file, its shortest prompt and the bound."""
    path = _eval_file(tmp_path, [40, 60])
    cfg, _ = compose_run_config(
        [f"recipe.eval.datasets=[{{name: long, path: {path}}}]", "recipe.eval.max_prompt_len=8"]
    )
    with pytest.raises(UserError) as refused:
        load_inputs(cfg, None)
    (issue,) = refused.value.issues
    assert (issue.key, issue.value, str(issue.location)) == (
        "recipe.eval.max_prompt_len",
        8,
        str(path),
    )
    assert issue.message.startswith(
        "evaluation set 'long' (recipe.eval.datasets.0) has no prompt of at most 8 tokens: "
        "its 2 prompts run from "
    )
    assert issue.fix.startswith("raise recipe.eval.max_prompt_len to at least ")


def test_a_max_prompt_len_that_leaves_too_few_training_prompts_for_a_rollout_is_refused(
    tmp_path: Path,
) -> None:
    """recipe.data.max_prompt_len leaving fewer prompts than one rollout draws
    (recipe.rollout.batch_size, 8 on the CPU default) would have every rollout draw the same
    few again: refused as the inputs load, before any actor, naming the limit."""
    path = _eval_file(tmp_path, [1] * 7 + [60] * 9)
    base = [f"recipe.data.prompt_data={path}"]
    cfg, _ = compose_run_config([*base, "recipe.data.max_prompt_len=32"])
    with pytest.raises(UserError) as refused:
        load_inputs(cfg, None)
    (issue,) = refused.value.issues
    assert (issue.key, issue.value) == ("recipe.data.max_prompt_len", 32)
    assert "recipe.rollout.batch_size=8" in issue.message
    fewer, _ = compose_run_config(
        [
            *base,
            "recipe.data.max_prompt_len=32",
            "recipe.rollout.batch_size=7",
            "recipe.train.global_batch_size=56",
        ]
    )
    data = load_inputs(fewer, None).data
    assert data is not None and (len(data), data.num_dropped) == (7, 9)
