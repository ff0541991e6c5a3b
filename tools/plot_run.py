"""Draw a run's curves (several runs overlaid) to a PNG.

    python tools/plot_run.py runs/2026-11-21/10-00-00
    python tools/plot_run.py runs/multirun/2026-11-21/10-00-00/* -o sweep.png

Panels: rollout reward, eval accuracy (one line per eval set), KL, entropy and step time,
read from each run's metrics.jsonl: a rollout's metrics at its rollout id, an evaluation at
the rollouts trained before it (eval/after_rollout; "after rollout N" is drawn at N). Of
several paths (a glob over a sweep's folder), those that are no run directory (the sweep's
multirun.yaml and summary files, a job that logged nothing) are skipped with a note. Each
run's lines are labelled by the overrides that tell it from the other runs, as typed on its
command line (`recipe.optim.lr=1e-5`; its provenance.json), else by its folder. Without -o
the PNG is written as curves.png in the first run's directory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlpost.config.typed_overrides import own_overrides, typed_forms
from rlpost.errors import run_command
from rlpost.runtime.failures import RESUME_KEYS
from rlpost.runtime.metrics import AFTER_ROLLOUT, METRICS_FILE, read_metrics
from rlpost.runtime.rundir import PROVENANCE_FILE

DEFAULT_NAME = "curves.png"


@dataclass(frozen=True)
class Panel:
    title: str
    key: str  # a metric name; "eval/*/accuracy" matches every eval set


PANELS = (
    Panel("reward (rollout mean)", "rollout/reward_mean"),
    Panel("eval accuracy", "eval/*/accuracy"),
    Panel("KL", "train/kl"),
    Panel("entropy", "train/entropy"),
    Panel("step time (s)", "perf/step_time_s"),
)


def x_of(record: dict[str, Any], name: str) -> int:
    """Where a metric goes on the rollout axis: an evaluation at the rollouts trained before
    it (the step's record that carries it has the step's rollout_id, one less; a run logged
    before eval/after_rollout existed falls back to that), the rest at their rollout id."""
    after = record.get(AFTER_ROLLOUT)
    if name.startswith("eval/") and isinstance(after, int | float):
        return int(after)
    return int(record["rollout_id"])


def series(records: Sequence[dict[str, Any]], key: str) -> dict[str, tuple[list[int], list[float]]]:
    """(rollout ids, values) per matching metric name, skipping records without it."""
    prefix, _, suffix = key.partition("*")
    names = sorted(
        {
            k
            for r in records
            for k in r
            if k == key or (suffix and k.startswith(prefix) and k.endswith(suffix))
        }
    )
    out = {}
    for name in names:
        points = [
            (x_of(r, name), float(r[name]))
            for r in records
            if isinstance(r.get(name), int | float) and "rollout_id" in r
        ]
        out[name] = ([p[0] for p in points], [p[1] for p in points])
    return out


def launch_overrides(run_dir: Path) -> tuple[list[str], dict[str, str]]:
    """The overrides of the run's latest launch (a sweep's job: its own values, as Hydra
    spells them, `lr=1e-05`) and how its command line typed them (`lr=1e-5`, typed_forms),
    from its provenance.json; none when it has none."""
    try:
        record = json.loads((run_dir / PROVENANCE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return [], {}
    if not isinstance(record, dict):
        return [], {}
    # where the launch ran, not what it trained: a resume's run.dir and run.resume, Hydra's own
    overrides = [
        str(o)
        for o in record.get("overrides") or []
        if not str(o).startswith("hydra.")
        and str(o).split("=", 1)[0].lstrip("+~") not in RESUME_KEYS
    ]
    # argv as typed (`lr=1e-5`; before, as the launcher rewrote it: `++lr=1e-5`), the
    # overrides as Hydra applied them (`++lr=1e-05`): paired whatever '+' either has
    argv = [str(a) for a in record.get("argv") or []]
    typed = {hydra.lstrip("+"): as_typed for hydra, as_typed in typed_forms(argv[1:]).items()}
    forms = {o: typed[o.lstrip("+")] for o in overrides if o.lstrip("+") in typed}
    return overrides, forms


def run_labels(run_dirs: Sequence[Path]) -> list[str]:
    """Names that tell the runs apart: the overrides in which each differs from the others
    (as typed), else its path relative to the runs' common parent."""
    if len(run_dirs) == 1:
        return [run_dirs[0].name]
    common = Path(os.path.commonpath([str(p) for p in run_dirs]))
    folders = [str(p.relative_to(common)) or p.name for p in run_dirs]
    launches = [launch_overrides(p) for p in run_dirs]
    typed = {hydra: as_typed for _, forms in launches for hydra, as_typed in forms.items()}
    own = own_overrides([overrides for overrides, _ in launches], typed)
    return [" ".join(differ) or folder for differ, folder in zip(own, folders, strict=True)]


def plot_runs(run_dirs: Sequence[Path], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(2, 3, figsize=(15, 8), constrained_layout=True)
    flat = list(axes.flat)
    for ax, panel in zip(flat, PANELS, strict=False):
        ax.set_title(panel.title)
        ax.set_xlabel("rollout")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    flat[-1].axis("off")
    for run_dir, label in zip(run_dirs, run_labels(run_dirs), strict=True):
        records = read_metrics(run_dir)
        for ax, panel in zip(flat, PANELS, strict=False):
            for name, (xs, ys) in series(records, panel.key).items():
                suffix = f" {name.split('/')[1]}" if "*" in panel.key else ""
                ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, ms=3, label=label + suffix)
    for ax in flat[: len(PANELS)]:
        if ax.lines:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", type=Path, nargs="+", help="run directories")
    parser.add_argument("-o", "--out", type=Path, default=None, help=f"PNG path ({DEFAULT_NAME})")
    args = parser.parse_args(argv)
    runs = run_dirs(args.run_dirs)
    if runs is None:
        return 2
    out = args.out or runs[0] / DEFAULT_NAME
    print(f"wrote {plot_runs([p.resolve() for p in runs], out)}")
    return 0


def run_dirs(paths: Sequence[Path]) -> list[Path] | None:
    """The paths that are run directories (they hold metrics.jsonl). A path that does not
    exist is refused; of several, the others are skipped with a note (a glob over a sweep's
    folder names its multirun.yaml and summary files too); None, said why, when no run is
    left."""
    absent = [str(p) for p in paths if not p.exists()]
    if absent:
        print(f"plot_run: {', '.join(absent)}: no such run directory", file=sys.stderr)
        return None
    runs = [p for p in paths if (p / METRICS_FILE).is_file()]
    others = [str(p) for p in paths if p not in runs]
    if not runs:
        print(
            f"plot_run: no {METRICS_FILE} in {', '.join(others)}\n"
            f"  fix: give a run directory (run.dir: the folder holding {METRICS_FILE}, "
            "e.g. runs/<date>/<time>, or a sweep's runs/multirun/<date>/<time>/<job>); a run "
            "that has logged no rollout yet has none",
            file=sys.stderr,
        )
        return None
    if others:
        print(f"plot_run: skipping {', '.join(others)}: no {METRICS_FILE}", file=sys.stderr)
    return runs


if __name__ == "__main__":
    run_command("plot_run", main)
