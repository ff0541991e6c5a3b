"""layout=auto: search time and candidate counts for the seed runs and pairs no layout ships for.

Then the torch trainer's search on a Mistral-7B-shaped generic model: which FSDP2 options
(layers kept gathered, shards within each node) it takes, and which it leaves for their memory.

For each seed run the search gets the seed's recipe with the layout left to it, and the
seed's own layout is rated beside the choice (its rank among the feasible candidates and the
predicted seconds per rollout of both). For the pairs without a shipped layout the search
starts from nothing. Times are the median of `--repeats` in-process searches (cold caches
cleared each time), plus `launch.py ... layout=auto mode=plan` end to end once.

    .venv/bin/python benchmarks/layout_search.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlpost.config.loader import compose_run_config  # noqa: E402
from rlpost.plan import memory, params  # noqa: E402
from rlpost.plan.candidates import LayoutSearch  # noqa: E402
from rlpost.plan.search import search_layout  # noqa: E402
from rlpost.schema import RunConfig  # noqa: E402
from rlpost.schema.layout import LayoutConfig  # noqa: E402

SEEDS = [
    ("glm4-9b", "h100x8"),
    ("qwen3-4b", "h100x8"),
    ("glm4.5-355b-a32b", "h100x64"),
    ("glm4.7-flash", "h100x8"),
]
UNSHIPPED = [("qwen3-30b-a3b", "h100x16"), ("llama3.1-8b", "h200x1"), ("qwen3-8b", "h100x8")]
MISTRAL = [  # Mistral-7B-v0.3's config.json facts as a generic model: the torch trainer (FSDP2)
    "model=llama3.1-8b",
    "model.name=mistral-7b",
    "model.family=generic",
    "model.hf_architecture=MistralForCausalLM",
    "model.vocab_size=32768",
    "model.rope_scaling=null",
    "recipe=grpo_dapo",
    "layout=auto",
]
TORCH_RUNS = [  # (hardware, overrides, label)
    ("h100x8", (), ""),
    ("h100x16", (), ""),
    ("h100x16", ("hardware.inter_node_gbps=5",), " 5GB/s"),  # a tenth of its network
    ("h100x64", (), ""),
]


def auto(cfg: RunConfig, hold: tuple[str, ...] = ()) -> RunConfig:
    """The run with its layout left to the search, but for the `hold` parts of the seed's
    ("recompute": its training recompute; "sglang": its engines' SGLang options)."""
    layout: dict[str, Any] = {"name": "auto", "search": True}
    if "recompute" in hold:
        layout["train"] = {"recompute": cfg.layout.train.recompute.model_dump()}
    if "sglang" in hold:
        layout["rollout"] = {"sglang": cfg.layout.rollout.sglang}
    return cfg.model_copy(update={"layout": LayoutConfig.model_validate(layout)})


HOLDS = (("recompute",), ("recompute", "sglang"))


def timed(
    cfg: RunConfig, reference: tuple[str, RunConfig] | None, repeats: int
) -> tuple[float, LayoutSearch]:
    times, result = [], None
    for _ in range(repeats):
        params.layer_params.cache_clear()
        params.params_per_stage.cache_clear()
        memory.stage_activation_bytes.cache_clear()
        start = time.perf_counter()
        result = search_layout(cfg, reference)
        times.append(time.perf_counter() - start)
    assert result is not None
    return statistics.median(times), result


def row(name: str, seconds: float, search: LayoutSearch) -> str:
    chosen = search.chosen
    step = f"{chosen.step_s:8.2f}" if chosen else "       -"
    text = f"{name:<30} {seconds:7.3f} {search.enumerated:>9} {search.feasible:>8} {step}"
    ref = search.reference
    if ref is not None and ref.step_s is not None:
        text += f" {ref.step_s:8.2f} {ref.rank or '-':>6}"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(
        f"{'run':<30} {'search s':>7} {'candidates':>9} {'feasible':>8} {'chosen s':>8}"
        f" {'seed s':>8} {'rank':>6}   (s: predicted seconds per rollout)"
    )
    for model, hardware in SEEDS:
        seed, _ = compose_run_config([f"model={model}", "recipe=grpo_dapo", f"hardware={hardware}"])
        name = f"{model}_{hardware}"
        seconds, search = timed(auto(seed), (name, seed), args.repeats)
        print(row(name, seconds, search))
        if search.reference is not None:
            print(f"{'':<32}{search.reference.reason}")
    print("\nthe seeds' layouts again, with parts of the seed held beside layout=auto")
    for model, hardware in SEEDS:
        seed, _ = compose_run_config([f"model={model}", "recipe=grpo_dapo", f"hardware={hardware}"])
        for hold in HOLDS:
            search = search_layout(auto(seed, hold), (f"{model}_{hardware}", seed))
            ref, chosen = search.reference, search.chosen
            assert ref is not None and ref.step_s is not None and chosen is not None
            print(
                f"{model}_{hardware} holding {' + '.join(hold)}: seed's rank {ref.rank} of "
                f"{search.feasible}, predicted {ref.step_s / chosen.step_s:.2f}x the choice's "
                f"time ({chosen.describe()})"
            )
    print()
    for model, hardware in UNSHIPPED:
        cfg, _ = compose_run_config(
            [f"model={model}", "recipe=grpo_dapo", f"hardware={hardware}", "layout=auto"]
        )
        seconds, search = timed(cfg, None, args.repeats)
        print(row(f"{model}_{hardware}", seconds, search))
        if search.chosen is not None:
            print(f"{'':<32}{search.chosen.describe()}")
    print("\nthe torch trainer (FSDP2) on a Mistral-7B-shaped generic model: the FSDP2 options")
    for hardware, extra, label in TORCH_RUNS:
        cfg, _ = compose_run_config([*MISTRAL, f"hardware={hardware}", *extra])
        seconds, search = timed(cfg, None, args.repeats)
        print(row(f"mistral-7b_{hardware}{label}", seconds, search))
        if search.chosen is not None:
            print(f"{'':<32}{search.chosen.describe()}")
        for rejected in search.rejected:
            if "faster than the same layout" in rejected.reason:
                print(f"{'':<32}not: {rejected.reason}")
    command = [
        sys.executable,
        "launch.py",
        "model=qwen3-30b-a3b",
        "recipe=grpo_dapo",
        "hardware=h100x16",
        "layout=auto",
        "mode=plan",
    ]
    start = time.perf_counter()
    subprocess.run(command, cwd=REPO, check=True, capture_output=True)
    print(f"\nend to end, `{' '.join(command[1:])}`: {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
