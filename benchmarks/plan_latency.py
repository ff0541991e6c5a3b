"""Median wall time of planning the four seed runs: compose + validate + plan + render.

In-process (Hydra compose, pydantic validation, build_plan, table and JSON rendering; the
first, cold call is reported apart) and end to end as `python launch.py ... mode=plan`
subprocesses (interpreter start and imports included). Wall time and CPU time (user + sys)
are both reported: on a shared machine the CPU time is the steadier figure.

    .venv/bin/python benchmarks/plan_latency.py [--repeats 10] [--launch-repeats 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlpost.plan import build_plan, render_plan  # noqa: E402
from rlpost.schema import RunConfig  # noqa: E402

SEEDS = {
    "glm4-9b / h100x8": ("glm4-9b", "h100x8"),
    "qwen3-4b / h100x8": ("qwen3-4b", "h100x8"),
    "glm4.5-355b-a32b / h100x64": ("glm4.5-355b-a32b", "h100x64"),
    "glm4.7-flash / h100x8": ("glm4.7-flash", "h100x8"),
}


def composer() -> Callable[[list[str]], RunConfig]:
    """The launcher's loader when present, else Hydra compose + validate directly."""
    if importlib.util.find_spec("rlpost.config.loader") is not None:
        from rlpost.config.loader import compose_run_config

        return lambda overrides: compose_run_config(overrides)[0]
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rlpost.config.resolvers import register_resolvers

    register_resolvers()

    def compose_run(overrides: list[str]) -> RunConfig:
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
            cfg = compose("config", overrides=overrides)
        return RunConfig.model_validate(OmegaConf.to_container(cfg, resolve=True))

    return compose_run


def overrides_for(model: str, hardware: str) -> list[str]:
    return [f"model={model}", "recipe=grpo_dapo", f"hardware={hardware}"]


Sample = tuple[float, float]
"""(wall seconds, CPU seconds)."""


def time_in_process(compose_run: Callable[[list[str]], RunConfig], overrides: list[str]) -> Sample:
    start, cpu = time.perf_counter(), time.process_time()
    plan = build_plan(compose_run(overrides))
    render_plan(plan, "table")
    render_plan(plan, "json")
    return time.perf_counter() - start, time.process_time() - cpu


def time_plan_only(run: RunConfig) -> Sample:
    start, cpu = time.perf_counter(), time.process_time()
    plan = build_plan(run)
    render_plan(plan, "table")
    render_plan(plan, "json")
    return time.perf_counter() - start, time.process_time() - cpu


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_launch(overrides: list[str]) -> Sample:
    start, cpu = time.perf_counter(), _children_cpu_s()
    subprocess.run(
        [sys.executable, "launch.py", *overrides, "mode=plan"],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - start, _children_cpu_s() - cpu


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:8.1f} ms"


def report(title: str, samples: dict[str, list[Sample]]) -> None:
    print(title)
    for name, runs in samples.items():
        wall, cpu = [w for w, _ in runs], [c for _, c in runs]
        print(f"  {name:<28} median wall {_ms(wall)}  cpu {_ms(cpu)}  (n={len(runs)})")
    every = [run for runs in samples.values() for run in runs]
    wall, cpu = [w for w, _ in every], [c for _, c in every]
    print(f"  {'all seeds':<28} median wall {_ms(wall)}  cpu {_ms(cpu)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--launch-repeats", type=int, default=3)
    args = parser.parse_args()

    compose_run = composer()
    cold_wall, cold_cpu = time_in_process(compose_run, overrides_for(*SEEDS["qwen3-4b / h100x8"]))
    print(
        f"first (cold) compose + plan + render: wall {cold_wall * 1000:.1f} ms, "
        f"cpu {cold_cpu * 1000:.1f} ms"
    )
    warm = {
        name: [time_in_process(compose_run, overrides_for(*pair)) for _ in range(args.repeats)]
        for name, pair in SEEDS.items()
    }
    report("in-process (compose + validate + plan + render):", warm)
    runs = {name: compose_run(overrides_for(*pair)) for name, pair in SEEDS.items()}
    planning = {
        name: [time_plan_only(run) for _ in range(args.repeats)] for name, run in runs.items()
    }
    report("in-process, planning alone (build_plan + both renderings):", planning)

    if not (REPO / "launch.py").exists() or args.launch_repeats == 0:
        print("launch.py mode=plan: skipped")
        return
    launched = {
        name: [time_launch(overrides_for(*pair)) for _ in range(args.launch_repeats)]
        for name, pair in SEEDS.items()
    }
    report("python launch.py ... mode=plan (subprocess, end to end):", launched)


if __name__ == "__main__":
    main()
