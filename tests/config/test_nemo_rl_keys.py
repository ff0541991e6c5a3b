"""NeMo-RL's keys on the command line are answered with rlpost's key, and every override the
table suggests validates on the CPU default (rlpost.config.nemo_rl_keys)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rlpost.config.keys import find_unknown
from rlpost.config.nemo_rl_keys import BY_KEY, SECTIONS, TABLE, TOTAL
from rlpost.config.peer_keys import is_peer_key, peer_key_issue
from rlpost.config.peer_rows import PeerRow, overrides

S = "policy.megatron_cfg.scheduler"
# the rest of a NeMo-RL command line some rows read: the prompt's cap beside the total, a
# decaying rate beside its floor
# one optimizer step a GRPO step: 8 prompts x 8 samples in one batch of 64
BATCH = {
    "grpo.num_prompts_per_step": 8,
    "grpo.num_generations_per_prompt": 8,
    "policy.train_global_batch_size": 64,
}
TIS = {
    "loss_fn.use_importance_sampling_correction": True,
    "loss_fn.truncated_importance_sampling_type": "tis",
    "loss_fn.truncated_importance_sampling_ratio": 5.0,
    "loss_fn.truncated_importance_sampling_ratio_min": 0.5,
}
LINES = {
    TOTAL: {"data.max_input_seq_length": 256},
    f"{S}.lr_decay_style": {f"{S}.lr_decay_iters": 60, **BATCH},
    "policy.megatron_cfg.optimizer.min_lr": {
        f"{S}.lr_decay_style": "cosine",
        f"{S}.lr_decay_iters": 60,
        **BATCH,
    },
    f"{S}.lr_decay_iters": {f"{S}.lr_decay_style": "linear", **BATCH},
    f"{S}.lr_warmup_iters": BATCH,
    **{key: TIS for key in TIS},
}
VALUES = {TOTAL: 288, f"{S}.lr_decay_iters": 60}
EXAMPLES = [row for row in TABLE if row.example is not None or row.name in VALUES]


def _suggestion(row: PeerRow) -> list[str]:
    line = {row.name: VALUES.get(row.name, row.example), **LINES.get(row.name, {})}
    written = []
    for name, given in line.items():
        pairs = BY_KEY[name].pairs(given, line)
        assert pairs is not None, f"{name}={given!r} converts to no override"
        written += overrides(pairs)
    return written


def test_every_rlpost_key_in_the_table_is_one_and_no_nemo_rl_key_is() -> None:
    for row in TABLE:
        assert row.key is None or find_unknown(row.key) is None, row.key
        assert find_unknown(row.name) is not None and is_peer_key(row.name), row.name
        assert row.key is not None or row.note, f"{row.name}: say what rlpost does instead"
        assert row.name.split(".")[0] in SECTIONS, row.name
    assert len(BY_KEY) == len(TABLE)


@pytest.mark.parametrize("row", EXAMPLES, ids=[row.name for row in EXAMPLES])
def test_every_suggested_override_validates_on_the_cpu_default(
    row: PeerRow, validates: Callable[[str, list[str]], None]
) -> None:
    written = _suggestion(row)
    validates(row.name, written)


def test_the_total_length_is_split_into_rlpost_s_two_caps_with_the_prompt_s_from_the_line() -> None:
    issue = peer_key_issue(TOTAL, 4096, {}, f"{TOTAL}=4096")
    assert issue.message.startswith(f"{TOTAL} is NeMo-RL's key, not rlpost's; rlpost's key")
    assert issue.fix.startswith("write recipe.data.max_prompt_len=<the longest prompt> and ")
    line = {TOTAL: 4096, "data.max_input_seq_length": 1024}
    issue = peer_key_issue(TOTAL, 4096, line, f"{TOTAL}=4096")
    assert issue.fix == "write recipe.data.max_prompt_len=1024 recipe.rollout.max_response_len=3072"


def test_the_kl_penalty_is_a_kl_loss_of_nemo_rl_s_k3() -> None:
    key = "loss_fn.reference_policy_kl_penalty"
    issue = peer_key_issue(key, 0.01, {key: 0.01}, f"{key}=0.01")
    assert issue.fix == (
        "write recipe.algo.use_kl_loss=true recipe.algo.kl_loss_coef=0.01 "
        "recipe.algo.kl_loss_type=k3"
    )


def test_a_key_both_verl_and_nemo_rl_name_alike_is_answered_once() -> None:
    issue = peer_key_issue("data.shuffle", True, {}, "data.shuffle=true")
    assert issue.message.startswith("data.shuffle is verl and NeMo-RL's key, not rlpost's; ")
    assert issue.fix == "write recipe.data.shuffle=true"
    issue = peer_key_issue("data.nowhere", 1, {}, "data.nowhere=1")
    assert "verl and NeMo-RL's section 'data' has no counterpart" in issue.message


def test_a_leave_one_out_baseline_names_the_nearest_and_says_drop_it() -> None:
    key = "grpo.use_leave_one_out_baseline"
    issue = peer_key_issue(key, True, {}, f"{key}=true")
    assert "rlpost has no leave-one-out baseline" in issue.message
    assert issue.fix.startswith("drop it: the nearest is rlpost's grpo")


def test_scheduler_iterations_count_grpo_steps_and_are_written_in_optimizer_steps() -> None:
    # NeMo-RL steps its schedule once a GRPO step: 32 x 16 samples in batches of 128 = 4
    key = f"{S}.lr_warmup_iters"
    batch = {
        "grpo.num_prompts_per_step": 32,
        "grpo.num_generations_per_prompt": 16,
        "policy.train_global_batch_size": 128,
    }
    issue = peer_key_issue(key, 13, {key: 13, **batch}, f"{key}=13")
    assert issue.fix == "write recipe.optim.lr_warmup_steps=52"
    issue = peer_key_issue(key, 13, {key: 13}, f"{key}=13")
    assert issue.fix.startswith("write recipe.optim.lr_warmup_steps=<this value x ")
    decay = f"{S}.lr_decay_iters"
    line = {decay: 100, f"{S}.lr_decay_style": "cosine", **batch}
    assert peer_key_issue(decay, 100, line, f"{decay}=100").fix == (
        "write recipe.optim.lr_decay_steps=400"
    )


def test_nemo_rl_s_reinforce_plus_plus_subtracts_the_group_mean_unless_told_not_to() -> None:
    key = "grpo.adv_estimator.name"
    issue = peer_key_issue(key, "reinforce_plus_plus", {}, f"{key}=reinforce_plus_plus")
    assert issue.fix == "write recipe.algo.advantage_estimator=reinforce_plus_plus_baseline"
    line = {"grpo.adv_estimator.minus_baseline": False}
    issue = peer_key_issue(key, "reinforce_plus_plus", line, f"{key}=reinforce_plus_plus")
    assert issue.fix == "write recipe.algo.advantage_estimator=reinforce_plus_plus"


def test_an_unbounded_importance_weight_is_not_answered_with_rlpost_s_clamped_tis() -> None:
    key = "loss_fn.use_importance_sampling_correction"
    issue = peer_key_issue(key, True, {key: True}, f"{key}=true")
    assert "NeMo-RL's weights are unbounded" in issue.message
    assert issue.fix.startswith(
        "write recipe.algo.off_policy_correction=tis recipe.algo.tis_clip_high=<"
    )
    line = {
        key: True,
        "loss_fn.truncated_importance_sampling_type": "tis",
        "loss_fn.truncated_importance_sampling_ratio": 5.0,
    }
    assert peer_key_issue(key, True, line, f"{key}=true").fix == (
        "write recipe.algo.off_policy_correction=tis recipe.algo.tis_clip_low=0.0 "
        "recipe.algo.tis_clip_high=5.0"
    )


def test_the_low_clip_keeps_nemo_rl_s_high_epsilon() -> None:
    key = "loss_fn.ratio_clip_min"
    assert peer_key_issue(key, 0.1, {key: 0.1}, f"{key}=0.1").fix == (
        "write recipe.algo.eps_clip=0.1 recipe.algo.eps_clip_high=0.2"
    )
