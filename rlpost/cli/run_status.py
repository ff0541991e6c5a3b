"""`rlpost status RUN_DIR`: how each launch of a run began and ended, and what a launch with
run.resume=auto in that folder would do next.

    run directory: /runs/exp1
      launch 0: start at rollout 0, 2026-12-06T22:10:04+00:00 on node-3
        ended: stopped (exit status 143): SIGTERM; every finished rollout (40) is in ...
          last rollout trained 39; newest checkpoint /runs/exp1/ckpt/rollout_40
    next, with run.resume=auto: continue from rollout 40 (/runs/exp1/ckpt/rollout_40)

It reads the folder only (launches.jsonl, launch_ends.jsonl, ckpt/, config.yaml); it starts
nothing and takes no lock. The checkpoints are checked as run.resume=auto checks them (sizes,
and the sha256 of every file of the one it would load), each broken one named with why.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rlpost.errors import Issue, UserError

HELP = "how each launch of a run directory ended, and what run.resume=auto would do next"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run's run.dir")


def run(args: argparse.Namespace) -> int:
    from rlpost.runtime.launches import render_status
    from rlpost.runtime.rundir import LAUNCHES_FILE

    run_dir = Path(args.run_dir).expanduser().resolve()
    if not (run_dir / LAUNCHES_FILE).is_file():
        problem = "is not a folder" if not run_dir.is_dir() else f"holds no {LAUNCHES_FILE}"
        raise UserError(
            [
                Issue(
                    key="RUN_DIR",
                    value=args.run_dir,
                    message=f"{run_dir} {problem}: it is not a run directory (every launch "
                    f"writes {LAUNCHES_FILE} there as it starts)",
                    fix="give the run.dir of a run that was launched (mode=train or mode=eval)",
                )
            ],
            title="command-line error",
        )
    print(render_status(run_dir))
    return 0
