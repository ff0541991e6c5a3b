"""tools/plot_run.py draws every panel for overlaid runs; tools/config_diff.py shows only
the keys that differ; tools/export_hf.py is covered in tests/unit/runtime/test_hf_export.py."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def load_tool(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def write_run(run_dir: Path, reward_slope: float, config: dict[str, object]) -> Path:
    run_dir.mkdir(parents=True)
    records = []
    for i in range(6):
        record = {
            "rollout_id": i,
            "rollout/reward_mean": reward_slope * i,
            "train/kl": 0.01 * i,
            "train/entropy": 2.0 - 0.1 * i,
            "perf/step_time_s": 1.0 + 0.05 * i,
        }
        if i % 2 == 0:
            record["eval/arith/accuracy"] = 0.1 * i
            record["eval/aime/accuracy"] = 0.05 * i
        records.append(json.dumps(record))
    (run_dir / "metrics.jsonl").write_text("\n".join(records) + "\n")
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    return run_dir


CONFIG = {
    "recipe": {"optim": {"lr": 1e-4, "betas": [0.9, 0.98]}, "rollout": {"num_rollout": 6}},
    "run": {"seed": 1},
}


@pytest.fixture()
def runs(tmp_path: Path) -> list[Path]:
    other = {**CONFIG, "recipe": {**CONFIG["recipe"], "optim": {"lr": 3e-4, "betas": [0.9, 0.98]}}}  # type: ignore[dict-item]
    return [
        write_run(tmp_path / "sweep" / "0", 0.1, CONFIG),
        write_run(tmp_path / "sweep" / "1", 0.2, {**other, "tracking": {"wandb": True}}),
    ]


def test_plot_overlays_runs_in_every_panel(runs: list[Path], tmp_path: Path) -> None:
    tool = load_tool("plot_run")
    out = tmp_path / "curves.png"
    assert tool.main([str(p) for p in runs] + ["-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
    records = [json.loads(line) for line in (runs[0] / "metrics.jsonl").read_text().splitlines()]
    for panel in tool.PANELS:
        assert tool.series(records, panel.key), panel.title
    evals = tool.series(records, "eval/*/accuracy")
    assert sorted(evals) == ["eval/aime/accuracy", "eval/arith/accuracy"]
    assert evals["eval/arith/accuracy"][0] == [0, 2, 4]
    assert tool.run_labels(runs) == ["0", "1"]


@pytest.mark.parametrize("marked", [False, True], ids=["as typed", "as rewritten before"])
def test_a_sweeps_runs_are_labelled_by_the_overrides_that_differ_as_typed(
    runs: list[Path], tmp_path: Path, marked: bool
) -> None:
    """`plot_run.py runs/multirun/<date>/<time>/*`: the lines are named by what tells the
    jobs apart (their provenance.json: the launch's argv as typed, the job's overrides as
    Hydra gives them), not by the folders 0, 1, 2; a run without that record keeps its
    folder's name. A resumed job's run.dir and run.resume say where, not what: no label."""
    # the launch's argv as typed; runs recorded before that hold it after the launcher's
    # checks, which mark schema keys '++' (as Hydra's overrides have them)
    mark = "++" if marked else ""
    argv = ["launch.py", "-m", f"{mark}recipe.optim.lr=1e-5,1e-4", f"{mark}run.seed=3"]
    for run, lr in zip(runs, ("1e-05", "0.0001"), strict=True):
        overrides = [f"++recipe.optim.lr={lr}", "++run.seed=3", "hydra.sweep.dir=runs/s"]
        (run / "provenance.json").write_text(json.dumps({"argv": argv, "overrides": overrides}))
    resumed = [
        "++recipe.optim.lr=1e-4",
        "++run.seed=3",
        f"++run.dir={runs[1]}",
        "++run.resume=auto",
    ]
    provenance = {"argv": ["launch.py", *resumed], "overrides": resumed}
    (runs[1] / "provenance.json").write_text(json.dumps(provenance))
    tool = load_tool("plot_run")
    assert tool.run_labels(runs) == ["recipe.optim.lr=1e-5", "recipe.optim.lr=1e-4"]
    single = write_run(tmp_path / "single", 0.3, CONFIG)  # no provenance.json
    assert tool.run_labels([*runs, single]) == [
        "recipe.optim.lr=1e-5 run.seed=3", "recipe.optim.lr=1e-4 run.seed=3", "single"
    ]  # fmt: skip
    assert tool.main([*map(str, runs), "-o", str(tmp_path / "sweep.png")]) == 0


def test_plot_defaults_to_the_first_run_and_refuses_a_non_run(
    runs: list[Path], tmp_path: Path
) -> None:
    tool = load_tool("plot_run")
    assert tool.main([str(runs[0])]) == 0 and (runs[0] / "curves.png").is_file()
    assert tool.main([str(tmp_path)]) == 2


def test_plot_of_a_sweeps_folder_skips_its_own_files(
    runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """README's `plot_run.py runs/multirun/<date>/<time>/*`: the glob names the sweep's
    multirun.yaml and summaries beside its job folders."""
    sweep = runs[0].parent
    for name in ("multirun.yaml", "summary.json", "summary.txt"):
        (sweep / name).write_text("{}\n")
    out = tmp_path / "sweep.png"
    assert load_tool("plot_run").main([*map(str, sorted(sweep.iterdir())), "-o", str(out)]) == 0
    assert out.is_file() and "skipping" in capsys.readouterr().err
    files = [str(sweep / "multirun.yaml"), str(sweep / "summary.txt")]
    assert load_tool("plot_run").main([*files, "-o", str(out)]) == 2  # no run among them
    err = capsys.readouterr().err
    assert "no metrics.jsonl in" in err and "fix: give a run directory" in err
    assert load_tool("plot_run").main([str(runs[0]), str(sweep / "2"), "-o", str(out)]) == 2
    assert "no such run directory" in capsys.readouterr().err


def test_an_evaluation_is_drawn_after_the_rollouts_it_followed() -> None:
    """The loop's records (eval.interval=1): the evaluation before training and the one after
    rollout 1 both sit in rollout 0's records; eval/after_rollout places them at 0 and 1."""
    records = [
        {"rollout_id": 0, "eval/after_rollout": 0.0, "eval/arith/accuracy": 0.24},
        {"rollout_id": 0, "rollout/reward_mean": 0.36, "eval/after_rollout": 1.0,
         "eval/arith/accuracy": 0.27},
        {"rollout_id": 1, "rollout/reward_mean": 0.33, "eval/after_rollout": 2.0,
         "eval/arith/accuracy": 0.33},
    ]  # fmt: skip
    tool = load_tool("plot_run")
    assert tool.series(records, "eval/*/accuracy")["eval/arith/accuracy"][0] == [0, 1, 2]
    assert tool.series(records, "rollout/reward_mean")["rollout/reward_mean"][0] == [0, 1]


def test_config_diff_shows_only_the_differences(
    runs: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    tool = load_tool("config_diff")
    assert tool.main([str(runs[0]), str(runs[1])]) == 1
    out = capsys.readouterr().out
    lines = [line.split() for line in out.splitlines()[2:-1]]
    assert lines == [
        ["recipe.optim.lr", "0.0001", "0.0003"],
        ["tracking.wandb", "<absent>", "true"],
    ]
    assert "num_rollout" not in out and "seed" not in out
    assert tool.main([str(runs[0]), str(runs[0] / "config.yaml")]) == 0


def test_config_diff_reports_an_unreadable_argument(
    runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert load_tool("config_diff").main([str(runs[0]), str(tmp_path / "nothing")]) == 2
    assert "has no config.yaml" in capsys.readouterr().err


def test_config_diff_refuses_a_config_to_compose(
    runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a defaults list is composed by Hydra: diffing its text against a resolved config would
    # list every key the defaults fill in as absent
    composed = tmp_path / "my_run.yaml"
    composed.write_text("defaults:\n  - config\n  - _self_\nrecipe:\n  optim:\n    lr: 1e-4\n")
    assert load_tool("config_diff").main([str(runs[0]), str(composed)]) == 2
    err = capsys.readouterr().err
    assert f"{composed} is a config to compose" in err and f"rlpost show {composed}" in err


def test_config_diff_refuses_a_key_written_twice_naming_both_lines(
    runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A hand-made YAML with a key twice: plain YAML keeps the second and drops the first,
    so the diff would show a value the file also contradicts; refused as rlpost refuses it."""
    mine = tmp_path / "mine.yaml"
    mine.write_text("recipe:\n  optim:\n    lr: 1e-4\n    lr: 3e-4\nrun:\n  seed: 1\n")
    assert load_tool("config_diff").main([str(runs[0]), str(mine)]) == 2
    err = capsys.readouterr().err
    assert "recipe.optim.lr is written twice in" in err and "at lines 3 and 4" in err, err
    assert "fix: keep one of the two (lines 3 and 4) and delete the other" in err
    assert "Traceback" not in err


def test_a_defect_in_a_tool_is_an_internal_error_with_its_traceback_once(
    runs: list[Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tool run as a script ends an exception of rlpost's own as every rlpost command does
    (rlpost.errors.run_command): its traceback once, a line that calls it a bug, exit 4, not
    Python's raw traceback and exit 1; what it refuses still exits 2 with no traceback."""
    import runpy

    import rlpost.runtime.config_changes

    def a_defect(*args: object) -> None:
        raise KeyError("recipe")

    tool = str(REPO / "tools" / "config_diff.py")
    monkeypatch.setattr(rlpost.runtime.config_changes, "diff_configs", a_defect)
    monkeypatch.setattr(sys, "argv", [tool, str(runs[0]), str(runs[1])])
    with pytest.raises(SystemExit) as ended:
        runpy.run_path(tool, run_name="__main__")
    err = capsys.readouterr().err
    assert ended.value.code == 4
    assert err.count("Traceback (most recent call last)") == 1, err
    assert err.endswith(
        "config_diff: internal error: KeyError: 'recipe'\n  rlpost did not expect it: most "
        "likely a bug in rlpost, not a problem with the config or the command line. The "
        "traceback above says where: please report it with the command line.\n"
    ), err
    monkeypatch.setattr(sys, "argv", [tool, str(runs[0]), str(runs[0].parent / "nothing")])
    with pytest.raises(SystemExit) as ended:
        runpy.run_path(tool, run_name="__main__")
    assert ended.value.code == 2 and "Traceback" not in capsys.readouterr().err


def test_config_diff_of_a_sweeps_folder_compares_every_job(
    runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`config_diff.py runs/multirun/<date>/<time>/*`, as plot_run takes a sweep: a column per
    job, the sweep's own files skipped."""
    sweep = runs[0].parent
    third = {**CONFIG, "run": {"seed": 2}}
    write_run(sweep / "2", 0.1, third)
    for name in ("multirun.yaml", "summary.json", "summary.txt"):
        (sweep / name).write_text("{}\n")
    (sweep / "3").mkdir()  # a job that had not written its config
    assert load_tool("config_diff").main(sorted(map(str, sweep.iterdir()))) == 1
    captured = capsys.readouterr()
    lines = [line.split() for line in captured.out.splitlines()]
    assert lines[0] == ["key", *(str(sweep / job) for job in ("0", "1", "2"))]
    assert lines[2:-1] == [
        ["recipe.optim.lr", "0.0001", "0.0003", "0.0001"],
        ["run.seed", "1", "1", "2"],
        ["tracking.wandb", "<absent>", "true", "<absent>"],
    ]
    assert "skipping" in captured.err and "multirun.yaml" in captured.err


def test_a_tool_whose_reader_left_ends_with_its_own_status(runs: list[Path]) -> None:
    """`config_diff.py A B | head`: head leaves after its lines and the rest of the table
    finds the pipe closed; the tool ends as it would have (1: the configs differ), with no
    traceback and no 'internal error', as every rlpost command does (rlpost.streams)."""
    import os
    import subprocess

    long = {**CONFIG, "run": {f"key_{i}": "x" * 80 for i in range(2000)}}
    other = write_run(runs[0].parent / "long", 0.1, long)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, str(REPO / "tools" / "config_diff.py"), str(runs[0]), str(other)],
            cwd=REPO,
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    err = done.stderr.decode()
    assert done.returncode == 1, err
    assert "Traceback" not in err and "internal error" not in err, err
