"""tools/gen_slime_flags.py on a small slime-shaped tree, and the committed table's stamp."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from rlpost.plan.slime_args import SLIME_COMMIT

REPO = Path(__file__).resolve().parents[2]

ARGUMENTS = """
def reset_arg(parser, name, **kwargs):
    parser.add_argument(name, **kwargs)


def get_slime_extra_args_provider():
    def add_slime_arguments(parser):
        def add_cluster_arguments(parser):
            parser.add_argument("--actor-num-nodes", type=int, default=1, help="nodes")
            parser.add_argument("--colocate", action="store_true", default=False)
            reset_arg(parser, "--distributed-backend", type=str, default="nccl")

        def add_rollout_arguments(parser):
            parser.add_argument("--rollout-stop", "--stop", type=str, nargs="+", default=None)
            parser.add_argument("--rm-type", choices=["math", "dapo"], default=None)

        add_cluster_arguments(parser)
        add_rollout_arguments(parser)
        parser.add_argument("--padded-vocab-size", type=int, default=None)
        return parser
"""
SGLANG = """
def add_sglang_arguments(parser):
    old_add_argument = parser.add_argument

    def new_add_argument_wrapper(*name_or_flags, **kwargs):
        old_add_argument(*name_or_flags, **kwargs)  # SGLang's own options: not slime's

    parser.add_argument("--sglang-server-concurrency", type=int, default=512)
"""


def load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_slime_flags", REPO / "tools" / "gen_slime_flags.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_slime_flags"] = module
    spec.loader.exec_module(module)
    return module


def slime_tree(root: Path) -> Path:
    (root / "slime" / "utils").mkdir(parents=True)
    (root / "slime" / "backends" / "sglang_utils").mkdir(parents=True)
    (root / "slime" / "utils" / "arguments.py").write_text(ARGUMENTS)
    (root / "slime" / "backends" / "sglang_utils" / "arguments.py").write_text(SGLANG)
    return root


def test_flags_by_group_with_types_defaults_and_the_commit(tmp_path: Path) -> None:
    tool = load_tool()
    out = tmp_path / "flags.txt"
    assert (
        tool.main(
            ["--slime-dir", str(slime_tree(tmp_path)), "--commit", "abc123", "--out", str(out)]
        )
        == 0
    )
    body = [line for line in out.read_text().splitlines() if not line.startswith("#   ")]
    assert "# commit: abc123" in body
    start = body.index("# cluster")
    assert body[start:] == [
        "# cluster",
        "--actor-num-nodes type=int default=1",
        "--colocate default=False action='store_true'",
        "--distributed-backend type=str default='nccl'",
        "# rollout",
        "--rollout-stop type=str default=None nargs='+'",
        "--stop type=str default=None nargs='+'",
        "--rm-type default=None choices=['math', 'dapo']",
        "# slime",
        "--padded-vocab-size type=int default=None",
        "# sglang",
        "--sglang-server-concurrency type=int default=512",
    ]


def test_the_commit_comes_from_git_or_the_tool_refuses(tmp_path: Path) -> None:
    tool = load_tool()
    tree = slime_tree(tmp_path / "slime-checkout")
    assert tool.main(["--slime-dir", str(tree), "--out", str(tmp_path / "a.txt")]) == 2
    git = ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "slime"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert tool.main(["--slime-dir", str(tree), "--out", str(tmp_path / "b.txt")]) == 0
    assert f"# commit: {head.strip()}" in (tmp_path / "b.txt").read_text()


def test_the_committed_table_is_of_the_pinned_slime() -> None:
    text = (REPO / "tests" / "fixtures" / "slime_flags.txt").read_text()
    [commit] = [line.split()[-1] for line in text.splitlines() if line.startswith("# commit:")]
    assert commit.startswith(SLIME_COMMIT)
