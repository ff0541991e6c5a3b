"""TRL's flags on the command line are answered with rlpost's key, and every override the
table suggests validates on the CPU default (rlpost.config.trl_flags)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rlpost.config.flags import flag_issues
from rlpost.config.keys import find_unknown
from rlpost.config.peer_rows import PeerRow, overrides
from rlpost.config.trl_flags import TABLE

# the rest of a command line some rows read
LINES: dict[str, dict[str, object]] = {}
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


def test_the_loss_types_map_to_rlpost_s_reductions_or_say_there_is_none() -> None:
    (issue,) = flag_issues(["--loss_type", "grpo"], [])  # slime's --loss-type is another thing
    assert issue.fix.startswith(
        "as TRL's: write recipe.algo.loss_reduction=sample_mean; as slime's"
    )
    (issue,) = flag_issues(["--loss-type", "dr_grpo"], [])  # TRL takes hyphens as well
    assert "rlpost has no dr_grpo" in issue.message
    assert issue.fix.startswith("as TRL's: write recipe.algo.loss_reduction=token_mean or")


def test_a_batch_counted_in_accumulation_steps_says_how_to_count_it_in_samples() -> None:
    (issue,) = flag_issues(["--gradient_accumulation_steps", "4"], [])
    assert issue.fix.startswith("write recipe.train.global_batch_size=<per_device_train_batch")


def test_a_hub_token_is_never_shown() -> None:
    (issue,) = flag_issues(["--hub_token", "hf_s3cr3t"], [])
    assert "hf_s3cr3t" not in f"{issue.message} {issue.fix} {issue.value} {issue.location}"
    assert issue.fix == "drop it"


def test_a_warmup_below_one_step_is_a_share_of_the_run_not_a_step_count() -> None:
    (issue,) = flag_issues(["--warmup_steps", "0.1"], [])
    assert issue.fix.startswith("write recipe.optim.lr_warmup_steps=<the share x ")
    (issue,) = flag_issues(["--warmup_steps", "10"], [])
    assert issue.fix == "write recipe.optim.lr_warmup_steps=10"


def test_the_learning_rate_says_trl_decays_it_by_default() -> None:
    (issue,) = flag_issues(["--learning_rate", "1e-6"], [])
    assert "TRL decays it linearly to 0" in issue.message
