"""benchmarks/refusals.py on the first two cases of each refusal corpus: every figure it
prints is there and consistent (median <= p90 <= max, the slowest sorted, CPU time spent),
and a result that is not a refusal is named as one."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCHMARK = ROOT / "benchmarks" / "refusals.py"
CORPORA = ("bad inputs", "tracker mistakes")


def sections(stdout: str) -> dict[str, dict[str, str]]:
    """The printed rows, by section (its title before ' ('), label -> value."""
    found: dict[str, dict[str, str]] = {}
    rows: dict[str, str] = {}
    for line in stdout.splitlines():
        if line and not line.startswith(" "):
            rows = found.setdefault(line.split(" (")[0], {})
        elif line.strip():
            label, value = re.split(r"\s{2,}", line.strip(), maxsplit=1)
            rows[label] = value
    return found


def number(value: str) -> float:
    return float(value.split()[0])


def test_a_few_cases_of_each_corpus_print_sane_figures() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCHMARK), "--first", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    printed = sections(done.stdout)
    for title in CORPORA:
        rows = printed[title]
        assert rows["cases"] == "2"
        median, p90, top = (number(rows[f"{k} s per case"]) for k in ("median", "p90", "max"))
        assert 0 < median <= p90 <= top < 60, rows
        assert 0 <= int(rows["cases over 3 s"]) <= 2
        slowest = [number(rows[f"slowest {i}"]) for i in (1, 2)]
        assert slowest == sorted(slowest, reverse=True) and slowest[0] == top
        assert "slowest 3" not in rows
        first, again = re.findall(
            r"([\d.]+) (?:first|again)", rows["first case's first-use imports s"]
        )
        assert float(first) > 0 and float(again) > 0
        cpu = number(rows["CPU s of the interpreter"])
        wall = float(re.findall(r"([\d.]+) s wall", rows["CPU s of the interpreter"])[0])
        assert cpu > 0 and top < wall  # the interpreter ran every case
        assert 0 < number(rows["CPU s per case, median"]) < cpu
    start_up = printed["start-up"]
    assert number(start_up["interpreter start-up s"]) > 0
    assert number(start_up["import rlpost.cli.launch s"]) > 0
    assert start_up["python launch.py, end to end s"].endswith("exit status 2)")
    assert done.stdout.rstrip().endswith("every case refused (exit status 2, no traceback, no Ray)")


def test_a_result_that_is_not_a_refusal_is_named() -> None:
    spec = importlib.util.spec_from_file_location("refusals", BENCHMARK)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    refused = {"code": 2, "stderr": "rlpost: 1 configuration error\n", "ray_started": False}
    assert bench.not_refused(refused) == []
    started = {"code": 0, "stderr": "Traceback (most recent call last)\n", "ray_started": True}
    assert bench.not_refused(started) == ["exit status 0", "a traceback", "Ray started"]
    assert bench.p90([0.1]) == 0.1
    assert bench.p90([float(i) for i in range(1, 11)]) == 9.0
