"""OpenRLHF's flags on the command line are answered with rlpost's key, and every override the
table suggests validates on the CPU default (rlpost.config.openrlhf_flags)."""

from __future__ import annotations

import pytest

from rlpost.config.flags import flag_issues
from rlpost.config.keys import find_unknown
from rlpost.config.loader import compose_run_config
from rlpost.config.openrlhf_flags import TABLE
from rlpost.config.peer_rows import PeerRow, overrides
from rlpost.errors import UserError

# the rest of a command line some rows read
LINES: dict[str, dict[str, object]] = {
    "init_kl_coef": {"use_kl_loss": True},
    "vllm_is_truncated_threshold": {},
}
EXAMPLES = [row for row in TABLE if row.example is not None]


@pytest.mark.parametrize("row", EXAMPLES, ids=[row.name for row in EXAMPLES])
def test_every_suggested_override_validates_on_the_cpu_default(row: PeerRow) -> None:
    line = {row.name: row.example, **LINES.get(row.name, {})}
    pairs = row.pairs(row.example, line)
    assert pairs is not None, f"{row.name}={row.example!r} converts to no override"
    written = overrides(pairs)
    try:
        compose_run_config(written)
    except UserError as exc:
        pytest.fail(f"{row.name} suggests {written}, which is refused:\n{exc.render()}")


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
