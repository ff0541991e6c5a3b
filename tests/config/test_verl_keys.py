"""verl's keys on the command line are answered with rlpost's key, and every override the
table suggests validates on the CPU default (rlpost.config.verl_keys)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rlpost.config.keys import find_unknown
from rlpost.config.verl_keys import BY_KEY, SECTIONS, TABLE, overrides, verl_issue
from rlpost.config.verl_values import N, VerlKey

ASSETS = Path(__file__).resolve().parents[2] / "rlpost" / "assets"
# the rest of a verl command line some rows read (its KL in the reward needs both)
REINFORCE = {"algorithm.adv_estimator": "reinforce_plus_plus"}
A = "actor_rollout_ref.actor"
LINES = {
    f"{A}.optim.lr_warmup_steps": {"data.train_batch_size": 8, f"{A}.ppo_mini_batch_size": 8},
    "algorithm.use_kl_in_reward": REINFORCE,
    "algorithm.filter_groups.max_num_gen_batches": {"algorithm.filter_groups.enable": True},
    "algorithm.kl_ctrl.kl_coef": {
        "algorithm.use_kl_in_reward": True,
        "algorithm.adv_estimator": "reinforce_plus_plus",
    },
}
HOOKS = Path(__file__).resolve().parents[1] / "hooks_fixtures"
# a reward function of verl's shape, as verl names it (its file, and its name in the file)
VERL_REWARD = {
    "custom_reward_function.path": str(HOOKS / "rlpost_test_hooks.py"),
    "custom_reward_function.name": "verl_exact_match",
}
LINES.update({key: VERL_REWARD for key in VERL_REWARD})
# rows whose value names a file (or a function in one): one that exists here
FILES = {
    "data.train_files": str(ASSETS / "data" / "arith_train.jsonl"),
    "data.val_files": str(ASSETS / "data" / "arith_eval.jsonl"),
    **VERL_REWARD,
}
EXAMPLES = [row for row in TABLE if row.example is not None or row.verl in FILES]


def _suggestion(row: VerlKey) -> list[str]:
    value = FILES.get(row.verl, row.example)
    line = {N: 8, row.verl: value, **LINES.get(row.verl, {})}
    written = []
    for verl, given in line.items():
        pairs = BY_KEY[verl].pairs(given, line) if verl in BY_KEY else None
        assert pairs is not None, f"{verl}={given!r} converts to no override"
        written += overrides(pairs)
    return list(dict.fromkeys(written))  # a path and a name on one line: the same override


def test_every_rlpost_key_in_the_table_is_one_and_no_verl_key_is() -> None:
    for row in TABLE:
        assert row.key is None or find_unknown(row.key) is None, row.key
        assert find_unknown(row.verl) is not None, row.verl
        assert row.key is not None or row.note, f"{row.verl}: say what rlpost does instead"
    assert len(BY_KEY) == len(TABLE) and {r.verl.split(".")[0] for r in TABLE} - SECTIONS == {
        "trainer"
    }


@pytest.mark.parametrize("row", EXAMPLES, ids=[row.verl for row in EXAMPLES])
def test_every_suggested_override_validates_on_the_cpu_default(
    row: VerlKey, validates: Callable[[str, list[str]], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(HOOKS))  # the reward function's folder on PYTHONPATH
    written = _suggestion(row)
    validates(row.verl, written)


def test_a_prompt_count_without_the_group_size_says_how_to_convert_it() -> None:
    key = "actor_rollout_ref.actor.ppo_mini_batch_size"
    issue = verl_issue(key, 256, {}, f"{key}=256")
    assert issue.fix.startswith("write recipe.train.global_batch_size=<this value x ")
    issue = verl_issue(key, 256, {N: 5}, f"{key}=256")
    assert issue.fix == "write recipe.train.global_batch_size=1280"


def test_a_key_of_no_counterpart_says_what_rlpost_does_instead_and_to_drop_it() -> None:
    issue = verl_issue("trainer.critic_warmup", 0, {}, "trainer.critic_warmup=0")
    assert "rlpost has no setting for it: rlpost has no critic" in issue.message
    assert issue.fix == "drop it"


def test_verl_s_generation_batch_limit_is_rlpost_s_draw_limit_and_its_0_no_limit() -> None:
    key = "algorithm.filter_groups.max_num_gen_batches"
    on = {"algorithm.filter_groups.enable": True}
    assert verl_issue(key, 10, {key: 10, **on}, f"{key}=10").fix == (
        "write recipe.rollout.max_draws_per_rollout=10"
    )
    assert verl_issue(key, 0, {key: 0, **on}, f"{key}=0").fix == (
        "write recipe.rollout.max_draws_per_rollout=null"
    )
    # verl reads it only with its filter on
    assert verl_issue(key, 10, {key: 10}, f"{key}=10").fix.startswith("drop it: with this value")


def test_verls_parquet_files_are_written_as_rlposts_prompt_files() -> None:
    """rlpost reads parquet as verl writes it: a file converts to the key with the same
    path, and the note names the keys verl's preprocessed layout needs."""
    key = "data.train_files"
    issue = verl_issue(key, "/d/train.parquet", {}, f"{key}=/d/train.parquet")
    assert issue.fix == "write recipe.data.prompt_data=/d/train.parquet"
    assert "recipe.data.label_key=reward_model.ground_truth" in issue.message
    key = "data.val_files"
    issue = verl_issue(key, "/d/test.parquet", {}, f"{key}=/d/test.parquet")
    assert issue.fix == "write recipe.eval.datasets='[{name: val0, path: /d/test.parquet}]'"
    issue = verl_issue("data.train_files", ["/d/a.parquet", "/d/b.parquet"], {}, "...")
    assert issue.fix.startswith("merge the files into one")


def test_warmup_in_verl_s_training_steps_is_counted_in_optimizer_steps() -> None:
    # verl steps its schedule once a rollout; 1024 / 256 prompts: four optimizer steps each
    key = f"{A}.optim.lr_warmup_steps"
    line = {key: 10, "data.train_batch_size": 1024, f"{A}.ppo_mini_batch_size": 256}
    assert verl_issue(key, 10, line, f"{key}=10").fix == "write recipe.optim.lr_warmup_steps=40"
    issue = verl_issue(key, 10, {key: 10}, f"{key}=10")
    assert issue.fix.startswith("write recipe.optim.lr_warmup_steps=<this value x ")


def test_clip_ratio_alone_changes_nothing_as_verl_s_low_and_high_are_set() -> None:
    key = f"{A}.clip_ratio"
    issue = verl_issue(key, 0.3, {key: 0.3}, f"{key}=0.3")
    assert issue.fix.startswith("drop it: with this value")
    line = {key: 0.3, f"{A}.clip_ratio_high": None}
    assert verl_issue(key, 0.3, line, f"{key}=0.3").fix == (
        "write recipe.algo.eps_clip=0.2 recipe.algo.eps_clip_high=0.3"
    )
    low = f"{A}.clip_ratio_low"  # verl's high epsilon stays 0.2; rlpost's would follow
    assert verl_issue(low, 0.1, {low: 0.1}, f"{low}=0.1").fix == (
        "write recipe.algo.eps_clip=0.1 recipe.algo.eps_clip_high=0.2"
    )


def test_use_kl_loss_alone_weighs_the_kl_as_verl_does() -> None:
    key = f"{A}.use_kl_loss"
    assert verl_issue(key, True, {key: True}, f"{key}=true").fix == (
        "write recipe.algo.use_kl_loss=true recipe.algo.kl_loss_coef=0.001 "
        "recipe.algo.kl_loss_type=low_var_kl"
    )
    line = {key: True, f"{A}.kl_loss_coef": 0.01, f"{A}.kl_loss_type": "mse"}
    assert verl_issue(key, True, line, f"{key}=true").fix == (
        "write recipe.algo.use_kl_loss=true recipe.algo.kl_loss_coef=0.01 "
        "recipe.algo.kl_loss_type=k2"
    )


def test_verl_s_reward_function_is_named_as_it_is_and_not_rewritten() -> None:
    """custom_reward_function.path and .name: verl's compute_score is named by its module
    and called as verl calls it; the answer says so, and does not ask for a rewrite."""
    path = "/home/me/rewards/my_reward.py"
    for key, value in (("custom_reward_function.path", path), ("custom_reward_function.name", "f")):
        line = {"custom_reward_function.path": path, key: value}
        issue = verl_issue(key, value, line, f"{key}={value}")
        assert (
            "compute_score(data_source, solution_str, ground_truth, extra_info=None) works "
            "as it is" in issue.message
        ), issue.render()
        name = "compute_score" if key.endswith("path") else "f"
        assert issue.fix == f"write recipe.rollout.reward.custom_function=my_reward.{name}"
    alone = verl_issue("custom_reward_function.name", "f", {}, "custom_reward_function.name=f")
    assert "my_reward.py's compute_score: my_reward.compute_score" in alone.fix
