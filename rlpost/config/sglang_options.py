"""SGLang server options as a typed pass-through (`layout.rollout.sglang`).

Users name any SGLang server option by its own name; the names, types and defaults come
from sglang_options.json, generated from SGLang's ServerArgs by tools/gen_sglang_options.py,
so SGLang itself is never imported here. Options that rlpost derives from the plan for each
engine are refused with the rlpost key that sets them.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlpost.errors import Issue, did_you_mean

OPTIONS_FILE = Path(__file__).with_name("sglang_options.json")
SGLANG_KEY = "layout.rollout.sglang"

# option -> (what sets it in rlpost, the fix)
PLAN_OWNED: dict[str, tuple[str, str]] = {
    "tp_size": (
        "each engine's tensor-parallel size is layout.rollout.gpus_per_engine",
        "set layout.rollout.gpus_per_engine instead",
    ),
    "model_path": (
        "engines load model.hf_checkpoint",
        "set model.hf_checkpoint instead",
    ),
    "host": ("rlpost assigns each engine's address", "remove it"),
    "port": ("rlpost assigns each engine's port", "remove it"),
    "base_gpu_id": (
        "the placement (layout.colocate, layout.rollout.num_gpus) decides each engine's GPUs",
        "remove it; change layout.colocate or layout.rollout.num_gpus to move engines",
    ),
    "nnodes": (
        "an engine spans layout.rollout.gpus_per_engine / hardware.gpus_per_node nodes",
        "set layout.rollout.gpus_per_engine instead",
    ),
    "node_rank": ("rlpost gives each node of a multi-node engine its rank", "remove it"),
    "enable_memory_saver": (
        "engine.offload decides it: engines that release their memory around training (the "
        "colocated default) are started with it, whatever this says",
        "remove it; set engine.offload (false keeps the engines' memory, and needs "
        "layout.colocate: false on GPUs)",
    ),
    "random_seed": (
        "each engine gets run.seed + its index, so that engines draw different samples; one "
        "seed for every engine gives them the same draws",
        "set run.seed instead",
    ),
    "quantization": (
        "engines serve model.hf_checkpoint as stored, and an FP8 checkpoint's weight updates "
        "are quantised to match it; SGLang's online quantization converts only the weights "
        "loaded at start, not the bf16 weights each update sends",
        "convert the checkpoint with tools/convert_hf_to_fp8.py (README, FP8 rollout), point "
        "model.hf_checkpoint at it, and remove quantization",
    ),
    "dist_init_addr": (
        "rlpost picks the first node of each multi-node engine as its rendezvous",
        "remove it",
    ),
}

# option -> (what it would do to a run, the fix): options rlpost's rollouts cannot take
REFUSED: dict[str, tuple[str, str]] = {
    "sampling_defaults": (
        "every rollout request states each parameter that shapes the distribution "
        "(temperature, top_p, top_k from recipe.rollout; min_p 0 and no penalties, since the "
        "trainer scores the plain softmax), so engine defaults never apply",
        "remove it",
    ),
    "preferred_sampling_params": (
        "every rollout request states each parameter that shapes the distribution "
        "(temperature, top_p, top_k from recipe.rollout; min_p 0 and no penalties, since the "
        "trainer scores the plain softmax), so engine defaults never apply",
        "remove it; set recipe.rollout.temperature for the rollouts' temperature",
    ),
    "json_model_override_args": (
        "it changes the model the engines build from model.hf_checkpoint's config.json, and "
        "not the one the trainer builds from the same file: every logprob the engines sample "
        "with would belong to another model",
        "remove it; change the checkpoint's config.json (and the model YAML) instead",
    ),
    "skip_tokenizer_init": (
        "rewards grade each response's text, which an engine without its tokenizer does not return",
        "remove it",
    ),
    # Rollouts post token ids to SGLang's native /generate, the prompts rendered by the
    # checkpoint's tokenizer (recipe.data); these act only on SGLang's OpenAI-compatible
    # endpoints and /parse_function_call, which rlpost never calls.
    "chat_template": (
        "SGLang applies it only on its OpenAI-compatible endpoints; rollouts send /generate "
        "token ids of prompts the checkpoint's tokenizer rendered (recipe.data), so no prompt "
        "would be rendered with it",
        "remove it; render the prompts with another template through "
        "recipe.data.apply_chat_template_kwargs.chat_template (the Jinja text itself, or the "
        "name of one of the checkpoint's named templates)",
    ),
    "completion_template": (
        "SGLang applies it only on its OpenAI-compatible /v1/completions; rollouts send "
        "/generate token ids of prompts the checkpoint's tokenizer rendered (recipe.data)",
        "remove it; recipe.data.apply_chat_template_kwargs.chat_template chooses how prompts "
        "are rendered",
    ),
    "tool_call_parser": (
        "SGLang parses tool calls with it only on its OpenAI-compatible chat endpoint and "
        "/parse_function_call, which rollouts never call: the generate function reads the "
        "calls from each response's text",
        "remove it; parse tool calls in recipe.rollout.generate_function (as "
        "rlpost.envs.calculator and rlpost.envs.http_tool do)",
    ),
}


@dataclass(frozen=True)
class Bound:
    """The values an option's meaning allows: an interval (each end open or closed) plus
    special values SGLang gives a meaning of their own (-1: "off" or "unlimited")."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    special: tuple[int, ...] = ()
    meaning: str = ""

    def holds(self, value: float) -> bool:
        if value in self.special:
            return True
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (
            self.high is not None and (value >= self.high if self.high_open else value > self.high)
        )

    def describe(self) -> str:
        low = "-inf" if self.low is None else f"{self.low:g}"
        high = "inf" if self.high is None else f"{self.high:g}"
        text = f"{'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"
        if self.special:
            text += " or " + " or ".join(map(str, self.special))
        return text


FRACTION = Bound(0.0, 1.0, low_open=True, meaning="a fraction of the GPU's memory")
SHARE = Bound(0.0, 1.0, meaning="a share between 0 and 1")
COUNT = Bound(1, meaning="a count or size")
NON_NEGATIVE = Bound(0, meaning="an amount that cannot be negative")
POSITIVE = Bound(0.0, low_open=True, meaning="a positive amount")
PORT = Bound(1, 65535, meaning="a TCP port")
COUNT_OR_OFF = Bound(1, special=(-1,), meaning="a count, or -1 to switch it off")

# SGLang options whose meaning bounds them (lists are checked element by element).
BOUNDS: dict[str, Bound] = {
    "mem_fraction_static": FRACTION,
    "swa_full_tokens_ratio": FRACTION,
    "mamba_full_memory_ratio": FRACTION,
    "hicache_host_memory_fraction": FRACTION,
    "tbo_token_distribution_threshold": SHARE,
    "prefill_delayer_token_usage_low_watermark": SHARE,
    "prefill_delayer_queue_min_ratio": SHARE,
    "hicache_ratio": POSITIVE,
    "schedule_conservativeness": POSITIVE,
    "watchdog_timeout": POSITIVE,
    "soft_watchdog_timeout": POSITIVE,
    "chunked_prefill_size": COUNT_OR_OFF,
    "cpu_offload_gb": NON_NEGATIVE,
    "ep_num_redundant_experts": NON_NEGATIVE,
    "hicache_size": NON_NEGATIVE,
    "nccl_port": PORT,
    **dict.fromkeys(
        (
            "context_length",
            "max_running_requests",
            "max_queued_requests",
            "max_total_tokens",
            "max_prefill_tokens",
            "prefill_max_requests",
            "page_size",
            "dp_size",
            "pp_size",
            "ep_size",
            "attn_dp_size",
            "moe_dense_tp_size",
            "dist_timeout",
            "stream_interval",
            "num_continuous_decode_steps",
            "tokenizer_worker_num",
            "detokenizer_worker_num",
            "cuda_graph_max_bs_decode",
            "cuda_graph_max_bs_prefill",
            "cuda_graph_bs_decode",
            "cuda_graph_bs_prefill",
            "torch_compile_max_bs",
            "triton_attention_num_kv_splits",
            "speculative_num_steps",
            "speculative_eagle_topk",
            "speculative_num_draft_tokens",
            "max_lora_rank",
            "max_loaded_loras",
            "max_loras_per_batch",
            "max_mamba_cache_size",
        ),
        COUNT,
    ),
}


@dataclass(frozen=True)
class OptionSpec:
    """One SGLang option: accepted kinds ('int', 'list[int]', ...), null, fixed choices."""

    name: str
    kinds: tuple[str, ...]
    nullable: bool
    choices: tuple[Any, ...] | None = None
    default: Any = None
    cli: str | None = None  # SGLang's own flag for it (None: it has none)
    flags: tuple[str, ...] = ()  # every spelling its command line takes (aliases included)

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.nullable
        if not any(_is_kind(value, kind) for kind in self.kinds):
            return False
        return self.choices is None or value in self.choices

    def expected(self) -> str:
        if self.choices is not None:
            text = "one of " + ", ".join(repr(c) for c in self.choices)
        else:
            text = " or ".join(_KIND_WORDS.get(k, k) for k in self.kinds)
        return f"{text}, or null" if self.nullable else text


_KIND_WORDS = {
    "bool": "true or false",
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "dict": "a mapping",
    "any": "any value",
}


def _is_kind(value: Any, kind: str) -> bool:
    if kind == "any":
        return True
    if kind.startswith("list["):
        item = kind[len("list[") : -1]
        return isinstance(value, list) and all(_is_kind(v, item) for v in value)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    if kind == "dict":
        return isinstance(value, dict)
    return False


@dataclass(frozen=True)
class SGLangOptions:
    version: str
    options: Mapping[str, OptionSpec]


@functools.cache
def load_sglang_options(path: Path = OPTIONS_FILE) -> SGLangOptions:
    """The option table shipped with rlpost (read once)."""
    document = json.loads(path.read_text(encoding="utf-8"))
    options = {
        name: OptionSpec(
            name=name,
            kinds=tuple(entry["type"]),
            nullable=bool(entry["nullable"]),
            choices=tuple(entry["choices"]) if "choices" in entry else None,
            default=entry.get("default"),
            cli=entry.get("cli"),
            flags=tuple(entry.get("flags", ())),
        )
        for name, entry in document["options"].items()
    }
    return SGLangOptions(version=str(document["sglang_version"]), options=options)


def check_option(name: str, value: Any, table: SGLangOptions) -> Issue | None:
    """The problem with one `layout.rollout.sglang.<name>: <value>`, if any."""
    key = f"{SGLANG_KEY}.{name}"
    if name in PLAN_OWNED:
        why, fix = PLAN_OWNED[name]
        return Issue(key, f"'{name}' is set by rlpost for each engine: {why}", fix, value=value)
    if name in REFUSED:
        why, fix = REFUSED[name]
        return Issue(key, f"'{name}' is refused: {why}", fix, value=value)
    spec = table.options.get(name)
    if spec is None:
        hint = did_you_mean(name, table.options)
        return Issue(
            key,
            f"SGLang {table.version} has no server option '{name}'.{hint}",
            "use SGLang's own option name (ServerArgs field, e.g. mem_fraction_static for "
            "--mem-fraction-static), or remove it",
            value=value,
        )
    if not spec.accepts(value):
        return Issue(
            key,
            f"SGLang option '{name}' takes {spec.expected()}; got {type(value).__name__} {value!r}",
            f"set it to {spec.expected()} (SGLang's default: {spec.default!r})",
            value=value,
        )
    return _out_of_bounds(name, value) or _unrenderable(name, value, spec)


def _out_of_bounds(name: str, value: Any) -> Issue | None:
    bound = BOUNDS.get(name)
    if bound is None or value is None:
        return None
    items = value if isinstance(value, list) else [value]
    bad = [v for v in items if isinstance(v, int | float) and not bound.holds(v)]
    if not bad:
        return None
    return Issue(
        f"{SGLANG_KEY}.{name}",
        f"SGLang option '{name}' is {bound.meaning}, so it must be in {bound.describe()}; "
        f"{bad[0]!r} is not",
        f"use a value in {bound.describe()}, or remove it for SGLang's default",
        value=value,
    )


def _unrenderable(name: str, value: Any, spec: OptionSpec) -> Issue | None:
    """Options the engine's command line cannot carry (SGLang reads only its flags)."""
    cli = cli_names().get(name, "--" + name.replace("_", "-"))
    key = f"{SGLANG_KEY}.{name}"
    if cli is None and value is not None:
        return Issue(
            key,
            f"SGLang option '{name}' has no command-line flag, and rlpost starts each engine "
            "from its command line: the value would never reach the server",
            "remove it",
            value=value,
        )
    if value is False and spec.default is True:
        return Issue(
            key,
            f"SGLang's flag for '{name}' only switches it on (its default is true), so false "
            "cannot be passed on the command line",
            "remove it (SGLang keeps it on), or look for SGLang's --disable-... counterpart",
            value=value,
        )
    return None


@functools.cache
def cli_names() -> dict[str, str | None]:
    """Each option's command-line flag (None: SGLang has no flag for it)."""
    return {name: spec.cli for name, spec in load_sglang_options().options.items()}


def check_sglang_options(options: Any) -> list[Issue]:
    """Problems with the `layout.rollout.sglang` mapping (resolved, plain values)."""
    if not isinstance(options, Mapping):
        return []  # the schema reports a non-mapping itself
    table = load_sglang_options()
    found = (check_option(str(name), value, table) for name, value in options.items())
    return [issue for issue in found if issue is not None]
