"""OpenRLHF's flags on the command line are answered with rlpost's key, and every override the
table suggests validates on the CPU default (rlpost.config.openrlhf_flags)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rlpost.config.flags import flag_issues
from rlpost.config.keys import find_unknown
from rlpost.config.openrlhf_flags import TABLE
from rlpost.config.peer_rows import PeerRow, overrides

# the rest of a command line some rows read
LINES: dict[str, dict[str, object]] = {
    "init_kl_coef": {"use_kl_loss": True},
    "vllm_is_truncated_threshold": {"enable_vllm_is_correction": True},
}
EXAMPLES = [row for row in TABLE if row.example is not None]


@pytest.mark.parametrize("row", EXAMPLES, ids=[row.name for row in EXAMPLES])
def test_every_suggested_override_validates_on_the_cpu_default(
    row: PeerRow, validates: Callable[[str, list[str]], None]
) -> None:
    line = {row.name: row.example, **LINES.get(row.name, {})}
    pairs = row.pairs(row.example, line)
    assert pairs is not None, f"{row.name}={row.example!r} converts to no override"
    written = overrides(pairs)
    validates(row.name, written)


def test_every_rlpost_key_in_the_table_is_one_and_every_row_says_what_rlpost_does() -> None:
    for row in TABLE:
        assert row.key is None or find_unknown(row.key) is None, row.key
        assert row.key is not None or row.note, f"{row.name}: say what rlpost does instead"


def test_an_underscored_flag_reaches_openrlhf_s_table_and_slime_s_alike() -> None:
    (issue,) = flag_issues(["--rollout_batch_size", "128"], ["--help"])
    assert issue.message.startswith("--rollout_batch_size is OpenRLHF and slime's flag")
    assert issue.fix == "write recipe.rollout.batch_size=128"
    (issue,) = flag_issues(["--rollout.batch_size", "128"], ["--help"])  # the dotted name
    assert issue.fix == "write recipe.rollout.batch_size=128"


def test_a_flag_two_peers_read_differently_names_both_readings() -> None:
    (issue,) = flag_issues(["--advantage_estimator", "group_norm"], ["--help"])
    assert "they read it differently" in issue.message
    assert issue.fix.startswith("as OpenRLHF's: write recipe.algo.advantage_estimator=grpo; ")


def test_the_kl_coefficient_goes_in_the_loss_with_use_kl_loss_and_the_key_is_never_shown() -> None:
    issues = flag_issues(["--init_kl_coef", "0.01", "--use_kl_loss", "--use_wandb", "k3y"], [])
    assert issues[0].fix == (
        "write recipe.algo.use_kl_loss=true recipe.algo.kl_loss_coef=0.01 "
        "recipe.algo.kl_loss_type=k3"
    )
    assert all("k3y" not in f"{i.message} {i.fix} {i.value} {i.location}" for i in issues)


def test_use_kl_loss_alone_weighs_the_kl_at_openrlhf_s_default_coefficient() -> None:
    (issue,) = flag_issues(["--use_kl_loss"], [])  # slime's --use-kl-loss as well
    assert issue.fix.startswith(
        "as OpenRLHF's: write recipe.algo.use_kl_loss=true recipe.algo.kl_loss_coef=0.01 "
        "recipe.algo.kl_loss_type=k3; as slime's: "
    )
    issues = flag_issues(["--use_kl_loss", "--init_kl_coef", "0.001", "--kl_estimator", "k2"], [])
    assert issues[0].fix.startswith(
        "as OpenRLHF's: write recipe.algo.use_kl_loss=true recipe.algo.kl_loss_coef=0.001 "
        "recipe.algo.kl_loss_type=k2; "
    )


def test_rloo_names_grpo_without_std_normalization_as_the_nearest() -> None:
    (issue,) = flag_issues(["--advantage_estimator", "rloo"], ["--help"])
    assert "nearest is grpo with recipe.algo.grpo_std_normalization=false" in issue.message
    assert "(n-1)/n of rloo's" in issue.message


def test_the_is_correction_takes_openrlhf_s_thresholds_and_refuses_its_masks() -> None:
    (issue,) = flag_issues(["--enable_vllm_is_correction"], [])
    assert issue.fix == (
        "write recipe.algo.off_policy_correction=tis recipe.algo.tis_clip_low=0.5 "
        "recipe.algo.tis_clip_high=5.0"
    )
    issues = flag_issues(["--enable_vllm_is_correction", "--vllm_is_correction_type", "icepop"], [])
    assert all(i.fix.startswith("for icepop, the nearest is ") for i in issues)
    assert "rlpost has no icepop" in issues[0].message
    (issue,) = flag_issues(["--vllm_is_truncated_threshold", "0.8", "2"], [])
    assert issue.fix.startswith("drop it")  # OpenRLHF reads it with the correction only
