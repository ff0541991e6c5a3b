"""SGLang options: the generated table, and the checks run on layout.rollout.sglang."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import types
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest

from rlpost.config.sglang_options import (
    OPTIONS_FILE,
    PLAN_OWNED,
    REFUSED,
    check_option,
    check_sglang_options,
    load_sglang_options,
)

REPO = Path(__file__).resolve().parents[3]


def test_table_records_its_sglang_version_and_the_options_rlpost_uses() -> None:
    document = json.loads(OPTIONS_FILE.read_text())
    assert document["sglang_version"] == "0.5.23"
    assert document["generated_by"] == "tools/gen_sglang_options.py"
    table = load_sglang_options()
    assert len(table.options) > 400
    for name in (
        "mem_fraction_static",
        "enable_dp_attention",
        "dp_size",
        "max_running_requests",
        "speculative_algorithm",
        "cuda_graph_max_bs_decode",
        "ep_num_redundant_experts",
    ):
        assert name in table.options, name
    assert table.options["dp_size"].kinds == ("int",)
    assert table.options["mem_fraction_static"].nullable
    for name in [*PLAN_OWNED, *REFUSED]:
        assert name in table.options, f"{name} is no longer an SGLang option"


def test_valid_options_pass() -> None:
    options = {
        "mem_fraction_static": 0.7,
        "enable_dp_attention": True,
        "dp_size": 8,
        "cuda_graph_bs_decode": [1, 2, 4, 8],
        "speculative_algorithm": "EAGLE",
        "context_length": None,
        "moe_a2a_backend": "deepep",
        "mem_fraction_static_dummy": None,
    }
    issues = check_sglang_options(options)
    assert [i.key for i in issues] == ["layout.rollout.sglang.mem_fraction_static_dummy"]


def test_unknown_option_suggests_a_name() -> None:
    issue = check_option("mem_fractoin_static", 0.7, load_sglang_options())
    assert issue is not None
    assert "SGLang 0.5.23 has no server option 'mem_fractoin_static'" in issue.message
    assert "Did you mean 'mem_fraction_static'?" in issue.message


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("dp_size", "eight", "takes an integer"),
        ("dp_size", 2.5, "takes an integer"),
        ("enable_dp_attention", 1, "takes true or false"),
        ("mem_fraction_static", "high", "a number, or null"),
        ("cuda_graph_bs_decode", [1, "2"], "list[int]"),
        ("moe_a2a_backend", "deep_ep", "one of 'none', 'deepep'"),
        ("dp_size", None, "takes an integer"),
    ],
)
def test_wrong_types_are_rejected(name: str, value: Any, fragment: str) -> None:
    issue = check_option(name, value, load_sglang_options())
    assert issue is not None and fragment in issue.message
    assert "SGLang's default" in issue.fix


def test_plan_owned_options_name_the_rlpost_key() -> None:
    issue = check_option("tp_size", 4, load_sglang_options())
    assert issue is not None and "layout.rollout.gpus_per_engine" in issue.fix
    issue = check_option("model_path", "/m", load_sglang_options())
    assert issue is not None and "model.hf_checkpoint" in issue.fix


@pytest.mark.parametrize(
    ("name", "value", "fix"),
    [
        ("chat_template", "chatml", "recipe.data.apply_chat_template_kwargs.chat_template"),
        ("completion_template", "deepseek_coder", "apply_chat_template_kwargs.chat_template"),
        ("tool_call_parser", "qwen25", "recipe.rollout.generate_function"),
    ],
)
def test_options_only_the_openai_endpoints_read_are_refused(
    name: str, value: str, fix: str
) -> None:
    """Rollouts post token ids to SGLang's /generate, with prompts the checkpoint's tokenizer
    rendered; these options act only on SGLang's OpenAI-compatible endpoints (on SGLang's
    tracker: 'The chat template specified via the --chat-template option is only applied
    to the OpenAI compatible server', https://github.com/sgl-project/sglang/issues/239)."""
    issue = check_option(name, value, load_sglang_options())
    assert issue is not None and issue.key == f"layout.rollout.sglang.{name}"
    assert "OpenAI-compatible" in issue.message and fix in issue.fix


def test_the_reasoning_parser_is_kept() -> None:
    """It also steers SGLang's constrained decoding, which a generate function may request."""
    assert check_option("reasoning_parser", "qwen3", load_sglang_options()) is None


def _generator() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_sglang_options", REPO / "tools" / "gen_sglang_options.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclasses.dataclass
class _Arg:
    help: str
    choices: list[str] | None = None
    nargs: str | None = None


@dataclasses.dataclass
class FakeServerArgs:
    model_path: str
    tp_size: Annotated[int, _Arg("tensor parallel")] = 1
    mem_fraction_static: float | None = None
    attention_backend: Annotated[str | None, _Arg("", choices=["fa3", "triton"])] = None
    load_balance: Literal["round_robin", "minimum_tokens"] = "round_robin"
    cuda_graph_bs: list[int] | None = None
    json_override: str | dict = "{}"
    stat_loggers: list[Any] = dataclasses.field(default_factory=list)
    enable_metrics: bool = False
    _internal: bool = False

    @staticmethod
    def add_cli_args(parser: Any) -> None:
        for field in dataclasses.fields(FakeServerArgs):
            if field.name == "tp_size":  # a second spelling in the same call
                parser.add_argument("--tp-size", "--tensor-parallel-size", dest=field.name)
            elif field.name == "enable_metrics":
                parser.add_argument("--enable-metrics", action="store_true", dest=field.name)
            elif not field.name.startswith("_"):
                parser.add_argument(f"--{field.name.replace('_', '-')}", dest=field.name)
        parser.add_argument("--cuda-graph-batch-sizes", dest="cuda_graph_bs")  # an old alias


def test_generator_describes_types_defaults_choices_and_flags() -> None:
    options = _generator().describe_options(FakeServerArgs)
    assert "_internal" not in options
    assert options["model_path"] == {
        "type": ["str"],
        "nullable": False,
        "required": True,
        "cli": "--model-path",
        "flags": ["--model-path"],
        "switch": False,
    }
    assert options["tp_size"]["type"] == ["int"] and options["tp_size"]["default"] == 1
    assert options["tp_size"]["flags"] == ["--tp-size", "--tensor-parallel-size"]
    assert options["mem_fraction_static"] == {
        "type": ["float"],
        "nullable": True,
        "default": None,
        "cli": "--mem-fraction-static",
        "flags": ["--mem-fraction-static"],
        "switch": False,
    }
    assert options["cuda_graph_bs"]["flags"] == ["--cuda-graph-bs", "--cuda-graph-batch-sizes"]
    assert options["cuda_graph_bs"]["cli"] == "--cuda-graph-bs"
    assert options["enable_metrics"]["switch"] is True
    assert options["attention_backend"]["choices"] == ["fa3", "triton"]
    assert options["load_balance"]["choices"] == ["round_robin", "minimum_tokens"]
    assert options["cuda_graph_bs"]["type"] == ["list[int]"]
    assert options["json_override"]["type"] == ["str", "dict"]
    assert options["stat_loggers"]["default"] == []
