"""The run's inputs as a launch loads them before any actor starts (rlpost.runtime.train)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlpost.config.loader import compose_run_config
from rlpost.errors import UserError
from rlpost.runtime.train import load_inputs


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
    assert [i.key for i in eval_refused.value.issues] == ["recipe.eval.max_response_len"]
    fits, _ = compose_run_config([f"recipe.rollout.max_response_len={512 - longest}"])
    assert load_inputs(fits, None).eval_sets


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
    assert _resuming(evaluation).run.resume == checkpoint
    training, _ = compose_run_config(["run.max_restarts=2", "run.dir=runs/x"])
    assert _resuming(training).run.resume == "auto"


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
