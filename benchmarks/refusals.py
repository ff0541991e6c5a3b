"""How long the launcher takes to refuse bad input: both refusal corpora, timed per case.

The target: a launch with bad input is refused (exit status 2, the key, its value and the
fix, no traceback, before Ray starts) in under 3 s. The corpora are the tests' own, run as
the tests run them: tests/config/test_bad_inputs.py (overrides, files and user configs, with
the files its `write_fixtures` writes) and tests/config/test_tracker_mistakes.py (mistakes
from other frameworks' trackers; each launch is followed by its fix's validation, which is
not timed), each in one interpreter that calls the launcher's `main` once per case.

Per corpus: the number of cases, the median, p90 and max seconds per case, the five slowest,
how many are over 3 s, the CPU time of the corpus's interpreter (start-up included) and the
median CPU time per case. The first case of an interpreter also pays for what `main` imports
on first use: the driver runs that case once more after the last (not in the figures above),
and the difference says how much. Once: interpreter
start-up and the import of `rlpost.cli.launch` (in no case's figure), and one refusal as a
user meets it, `python launch.py` end to end.

With `--repeats N` each corpus runs N times, a fresh interpreter each time; a case's figure
is its median over the repeats, with its max beside it, and a case is over the target when
its max is. Exit status 0 unless a case was not refused (an exit status other than 2, a
traceback, or Ray started); whether the message names the right key, value and fix is the
tests' concern.

    .venv/bin/python benchmarks/refusals.py [--repeats 3] [--first N] [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests" / "config"
TARGET_S = 3.0
# the one-shot refusal `python launch.py` is timed with (test_bad_inputs.py's command-line case)
ONE_SHOT = "recipe.rollout.reward.type=mth"

Results = dict[str, dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class Corpus:
    title: str
    source: str  # the test file that holds the cases and the driver
    cases: list[Any]  # its case objects (frozen dataclasses with a `name`)
    run: Callable[[list[Any], Path], Results]  # (cases, workdir) -> results by case name
    untimed: str  # what the interpreter does besides the timed cases


@dataclasses.dataclass(frozen=True)
class Timed:
    results: list[Results]  # one per repeat
    wall_s: list[float]  # the interpreter's wall time, per repeat
    cpu_s: list[float]  # its user + sys time, per repeat


def load_test_module(name: str) -> ModuleType:
    """A test file of tests/config as a module (its case tables and driver)."""
    spec = importlib.util.spec_from_file_location(name, TESTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def select(cases: list[Any], first: int | None, only: str | None) -> list[Any]:
    chosen = [c for c in cases if only is None or only in c.name]
    return chosen if first is None else chosen[:first]


def corpora(root: Path, first: int | None, only: str | None) -> list[Corpus]:
    bad = load_test_module("test_bad_inputs")
    mistakes = load_test_module("test_tracker_mistakes")
    fixtures = root / "fixtures"
    fixtures.mkdir()
    bad.write_fixtures(fixtures)
    return [
        Corpus(
            "bad inputs",
            "tests/config/test_bad_inputs.py",
            select(bad.CASES + bad.file_cases(fixtures), first, only),
            bad.run_corpus,
            "start-up, imports and the first case again",
        ),
        Corpus(
            "tracker mistakes",
            "tests/config/test_tracker_mistakes.py",
            select(mistakes.MISTAKES, first, only),
            mistakes.run_mistakes,
            "start-up, imports, the first case again and each fix's validation",
        ),
    ]


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_timed(corpus: Corpus, cases: list[Any], workdir: Path) -> tuple[Results, float, float]:
    """The corpus's driver on `cases` in a fresh interpreter: results, wall and CPU seconds."""
    workdir.mkdir(parents=True)
    started, cpu = time.perf_counter(), children_cpu_s()
    results = corpus.run(cases, workdir)
    return results, time.perf_counter() - started, children_cpu_s() - cpu


def again(case: Any) -> Any:
    """The case under another name: the driver runs it again after the last."""
    return dataclasses.replace(case, name=f"{case.name} (again)")


def run_repeats(corpus: Corpus, repeats: int, root: Path) -> Timed:
    cases = [*corpus.cases, again(corpus.cases[0])]
    runs = [run_timed(corpus, cases, root / f"repeat{i}") for i in range(repeats)]
    return Timed([r for r, _, _ in runs], [w for _, w, _ in runs], [c for _, _, c in runs])


def not_refused(got: dict[str, Any]) -> list[str]:
    """What keeps a case's result from being a refusal: empty when it was one."""
    wrong = []
    if got["code"] != 2:
        wrong.append(f"exit status {got['code']}")
    if "Traceback" in got["stderr"]:
        wrong.append("a traceback")
    if got["ray_started"]:
        wrong.append("Ray started")
    return wrong


def p90(values: Sequence[float]) -> float:
    """The nearest-rank 90th percentile."""
    ordered = sorted(values)
    return ordered[math.ceil(0.9 * len(ordered)) - 1]


def row(label: str, value: str) -> None:
    print(f"  {label:<34}{value}")


def report_corpus(corpus: Corpus, timed: Timed) -> list[str]:
    """Prints the corpus's figures; returns the cases that were not refused, with why."""
    names = [c.name for c in corpus.cases]
    seconds = {n: [r[n]["seconds"] for r in timed.results] for n in names}
    median_s = {n: statistics.median(s) for n, s in seconds.items()}
    max_s = {n: max(s) for n, s in seconds.items()}
    cpu = [statistics.median(r[n]["cpu_seconds"] for r in timed.results) for n in names]
    print(f"\n{corpus.title} ({corpus.source})")
    row("cases", str(len(names)))
    row("median s per case", f"{statistics.median(median_s.values()):.3f}")
    row("p90 s per case", f"{p90(list(median_s.values())):.3f}")
    row("max s per case", f"{max(max_s.values()):.3f}")
    row(f"cases over {TARGET_S:g} s", str(sum(s > TARGET_S for s in max_s.values())))
    slowest = sorted(names, key=lambda n: max_s[n], reverse=True)[:5]
    for i, name in enumerate(slowest, 1):
        spread = f" (median {median_s[name]:.3f})" if len(timed.results) > 1 else ""
        note = " [first case: first-use imports]" if name == names[0] else ""
        row(f"slowest {i}", f"{max_s[name]:.3f}{spread}  {name}{note}")
    first = median_s[names[0]]
    second = statistics.median(r[again(corpus.cases[0]).name]["seconds"] for r in timed.results)
    row(
        "first case's first-use imports s",
        f"{first - second:.3f} ({first:.3f} first, {second:.3f} again: {names[0]})",
    )
    row(
        "CPU s of the interpreter",
        f"{statistics.median(timed.cpu_s):.2f} (user + sys; "
        f"{statistics.median(timed.wall_s):.2f} s wall; {corpus.untimed} included)",
    )
    row("CPU s per case, median", f"{statistics.median(cpu):.3f} (in the launcher's main)")
    problems = [(n, not_refused(got)) for r in timed.results for n, got in r.items()]
    return sorted({f"{corpus.title}: {n}: {', '.join(w)}" for n, w in problems if w})


def time_command(command: list[str], cwd: Path) -> tuple[float, int]:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)
    return time.perf_counter() - started, done.returncode


def report_start_up(repeats: int, root: Path) -> list[str]:
    """Prints interpreter start-up, the launcher's import and one `python launch.py` refusal;
    returns a problem when that launch was not refused."""
    bare = [time_command([sys.executable, "-c", "pass"], root)[0] for _ in range(repeats)]
    imported = [
        time_command([sys.executable, "-c", "from rlpost.cli import launch"], root)[0]
        for _ in range(repeats)
    ]
    launches = []
    for _ in range(repeats):
        command = [sys.executable, str(REPO / "launch.py"), ONE_SHOT, f"run.dir={root / 'run'}"]
        launches.append(time_command(command, root))
    print("\nstart-up (once per interpreter, in no case's figure)")
    row("interpreter start-up s", f"{statistics.median(bare):.3f} (python -c pass)")
    row(
        "import rlpost.cli.launch s",
        f"{statistics.median(imported) - statistics.median(bare):.3f}"
        f" ({statistics.median(imported):.3f} with the start-up)",
    )
    codes = sorted({code for _, code in launches})
    row(
        "python launch.py, end to end s",
        f"{statistics.median(s for s, _ in launches):.3f} ({ONE_SHOT}; exit status "
        f"{', '.join(map(str, codes))})",
    )
    return [] if codes == [2] else [f"python launch.py {ONE_SHOT}: exit status {codes}"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1, help="runs of each corpus")
    parser.add_argument("--first", type=int, default=None, help="the first N cases of each")
    parser.add_argument("--only", default=None, help="cases whose name contains this")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: must be at least 1")
    if args.first is not None and args.first < 1:
        parser.error(f"--first {args.first}: must be at least 1 (leave it out for every case)")
    # the drivers' interpreters import this checkout's rlpost, whatever is installed
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p
    )
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"refusals: target {TARGET_S:g} s per refusal; {args.repeats} repeat(s); "
        f"load average {load} on {os.cpu_count()} CPUs"
    )
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="rlpost-refusals-") as tmp:
        root = Path(tmp)
        for i, corpus in enumerate(corpora(root, args.first, args.only)):
            if not corpus.cases:
                print(f"\n{corpus.title} ({corpus.source}): no case matches")
                continue
            timed = run_repeats(corpus, args.repeats, root / f"corpus{i}")
            problems += report_corpus(corpus, timed)
        problems += report_start_up(args.repeats, root)
    print()
    if problems:
        print("NOT REFUSED (see the tests for why):")
        for problem in problems:
            print(f"  {problem}")
        return 1
    print("every case refused (exit status 2, no traceback, no Ray)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
