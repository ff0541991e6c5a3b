"""tools/gen_megatron_rules.py on a small Megatron-shaped tree, and the rules rlpost relies on
against the committed file of the pinned Megatron-LM."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from rlpost.plan.megatron_rules import MEGATRON_COMMIT, RULES, MegatronRule

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "tests" / "fixtures" / "megatron_rules.txt"

ARGUMENTS = """import os


def parse_args():
    assert False  # not validate_args: not read


def validate_args(args, defaults={}):
    total = args.tensor_model_parallel_size * args.pipeline_model_parallel_size
    assert args.world_size % total == 0, (
        "world size is not divisible"
    )
    if args.kv_channels is None:
        assert args.hidden_size % args.num_attention_heads == 0
        args.kv_channels = args.hidden_size // args.num_attention_heads
    if args.tensor_model_parallel_size == 1:
        args.sequence_parallel = False
    else:
        if os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1":
            raise RuntimeError("set CUDA_DEVICE_MAX_CONNECTIONS=1")
    for name in ("a", "b"):
        args.x += 1
"""


def load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_megatron_rules", REPO / "tools" / "gen_megatron_rules.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_megatron_rules"] = module
    spec.loader.exec_module(module)
    return module


def megatron_tree(root: Path, text: str = ARGUMENTS) -> Path:
    (root / "megatron" / "training").mkdir(parents=True)
    (root / "megatron" / "training" / "arguments.py").write_text(text)
    return root


def test_rules_with_their_lines_conditions_and_the_commit(tmp_path: Path) -> None:
    tool = load_tool()
    out = tmp_path / "rules.txt"
    tree = megatron_tree(tmp_path / "mlm")
    assert tool.main(["--megatron-dir", str(tree), "--commit", "abc123", "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert "# commit: abc123" in lines
    assert [line for line in lines if not line.startswith("#")] == [
        "10 assert args.world_size % total == 0",  # a local name is not a rule
        "14 assert args.hidden_size % args.num_attention_heads == 0"
        " | when args.kv_channels is None",
        "15 sets args.kv_channels = args.hidden_size // args.num_attention_heads"
        " | when args.kv_channels is None",
        "17 sets args.sequence_parallel = False | when args.tensor_model_parallel_size == 1",
        "20 raise RuntimeError('set CUDA_DEVICE_MAX_CONNECTIONS=1')"
        " | when not (args.tensor_model_parallel_size == 1)"
        " and os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS') != '1'",
        "22 sets args.x += 1",
    ]


def test_a_tree_without_validate_args_or_a_commit_is_refused(tmp_path: Path) -> None:
    tool = load_tool()
    empty = megatron_tree(tmp_path / "empty", "def parse_args():\n    pass\n")
    assert tool.main(["--megatron-dir", str(empty), "--commit", "abc"]) == 2
    assert tool.main(["--megatron-dir", str(megatron_tree(tmp_path / "nogit"))]) == 2
    assert tool.main(["--megatron-dir", str(tmp_path / "nowhere"), "--commit", "abc"]) == 2


def committed() -> dict[int, str]:
    """line -> what the committed file says from the kind on."""
    rules = {}
    for line in COMMITTED.read_text().splitlines():
        if not line.startswith("#"):
            number, rest = line.split(" ", 1)
            rules[int(number)] = rest
    return rules


def test_the_committed_rules_are_of_the_pinned_megatron() -> None:
    text = COMMITTED.read_text()
    [commit] = [line.split()[-1] for line in text.splitlines() if line.startswith("# commit:")]
    assert commit.startswith(MEGATRON_COMMIT)
    assert len(committed()) > 100  # validate_args has some 250 rules at the pin


@pytest.mark.parametrize("rule", RULES, ids=lambda r: str(r.line))
def test_each_rule_rlpost_relies_on_is_at_its_line(rule: MegatronRule) -> None:
    assert committed()[rule.line].startswith(f"{rule.kind} {rule.text}")


def test_every_megatron_line_rlpost_cites_is_a_rule_it_relies_on() -> None:
    """A citation of arguments.py:<line> or megatron_rules' line names a rule in RULES."""
    cited: set[int] = set()
    for path in [*(REPO / "rlpost").rglob("*.py"), REPO / "README.md"]:
        text = path.read_text()
        cited |= {int(n) for n in re.findall(r"training/arguments\.py:(\d+)", text)}
        cited |= {int(n) for n in re.findall(r"megatron_rules, (?:line )?(\d+)", text)}
    assert cited
    assert cited <= {rule.line for rule in RULES}, cited - {rule.line for rule in RULES}
