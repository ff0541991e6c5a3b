"""Where a launch starts: rollout 0, or the rollout after a verified checkpoint.

`run.resume=auto` takes the newest complete checkpoint in the run directory (and starts at
rollout 0 when there is none); a path takes that checkpoint, or a run directory's newest.
Broken checkpoints and unfinished saves are reported and never loaded. The config of the
checkpoint is compared with this launch's field by field: every change is reported, and the
ones the saved state cannot survive are refused before anything starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlpost.errors import Issue, UserError
from rlpost.plan import Plan
from rlpost.plan.backends import resolve_trainer_backend
from rlpost.runtime import checkpoint
from rlpost.runtime.checkpoint import CheckpointError
from rlpost.runtime.config_changes import (
    DATA_SEED,
    Change,
    check_resume_changes,
    diff_configs,
    parallel_changes,
    render_changes,
)
from rlpost.runtime.progress import status
from rlpost.runtime.run_state import CONFIG_FILE, TRAINER_DIR, LoopState, read_loop_state
from rlpost.runtime.rundir import config_as_today, config_dict
from rlpost.schema import RunConfig
from rlpost.schema.base import local_path_keys
from rlpost.schema.run import EVAL_RESUME_FIX

AUTO = "auto"
PATH_KEYS = frozenset(local_path_keys(RunConfig))  # run.dir, model.hf_checkpoint, ...


@dataclass(frozen=True)
class ResumePoint:
    path: Path
    state: LoopState
    changes: list[Change]

    @property
    def start_rollout(self) -> int:
        return self.state.rollouts_done


def trainer_backend(cfg: RunConfig, plan: Plan) -> str:
    """The trainer that runs (trainer.backend with `auto` resolved)."""
    return resolve_trainer_backend(cfg, plan.parallel)


def plan_grid(plan: Plan) -> dict[str, Any]:
    p = plan.parallel
    return {"tp": p.tp, "pp": p.pp, "cp": p.cp, "ep": p.ep, "etp": p.etp, "dp": p.dp}


def find_resume_point(cfg: RunConfig, plan: Plan, run_dir: Path) -> ResumePoint | None:
    """The checkpoint this launch continues from, or None for a fresh start."""
    if cfg.run.resume is None:
        _refuse_used_dir(run_dir)
        return None
    resume = cfg.run.resume
    path = _auto(run_dir) if resume == AUTO else checkpoint_named(resume, mode=cfg.mode)
    if path is None:
        return None
    state = read_loop_state(path)
    saved = config_as_today(yaml.safe_load((path / CONFIG_FILE).read_text(encoding="utf-8")))
    changes = diff_configs(saved, config_dict(cfg), PATH_KEYS)  # both redacted alike
    if cfg.mode == "eval":  # only the weights are read: the prompt order does not matter
        changes = [c for c in changes if c.key != DATA_SEED]
    grid = parallel_changes(state.parallel, plan_grid(plan), _reshards(path, state, saved))
    backends = (state.trainer_backend, trainer_backend(cfg, plan))
    reported = check_resume_changes(changes, grid, str(path), backends, cfg.mode)
    if cfg.mode == "eval":  # what else differs is the evaluation's own business
        status(f"evaluating {path} ({state.rollouts_done} rollouts done)")
        return ResumePoint(path, state, [])
    status(f"resuming from {path} ({state.rollouts_done} rollouts done)")
    if reported:
        status(f"the config differs from the checkpoint's in {len(reported)} field(s):")
        print(render_changes(reported), flush=True)
    if not state.optimizer_saved:
        status("the checkpoint has no optimizer state (save.save_optimizer=false): Adam restarts")
    return ResumePoint(path, state, reported)


def _reshards(path: Path, state: LoopState, saved: dict[str, Any]) -> frozenset[str]:
    """The parallel sizes the saved trainer state loads under when they change: the torch
    trainer's checkpoints load under any DP size (a replica, or DCP shards that reshard);
    megatron-core's reshard as their record says (rlpost.backends.megatron.ckpt_format)."""
    if state.trainer_backend != "megatron":
        return frozenset({"dp"})
    from rlpost.backends.megatron.ckpt_format import reshardable_keys

    train = (saved.get("layout") or {}).get("train") or {}
    return reshardable_keys(path / TRAINER_DIR, bool(train.get("distributed_optimizer", True)))


def _report(scan: checkpoint.Scan) -> None:
    for broken in scan.broken:
        status(broken.unloaded())
    for staging in scan.interrupted:
        status(checkpoint.unfinished_save(staging))


def _auto(run_dir: Path) -> Path | None:
    scan = checkpoint.scan(run_dir)
    _report(scan)
    if scan.latest is not None:
        return scan.latest
    if scan.broken:
        raise UserError(
            [
                Issue(
                    key="run.resume",
                    value=AUTO,
                    message=f"every checkpoint in {checkpoint.checkpoint_root(run_dir)} is "
                    f"broken ({'; '.join(str(b) for b in scan.broken)})",
                    fix="restore them from a copy, move them away to start over at rollout 0, "
                    "or set run.resume to a checkpoint of another run",
                )
            ],
            title="checkpoint problem",
        )
    status(f"run.resume=auto: no checkpoint in {run_dir}; starting at rollout 0")
    return None


def checkpoint_named(value: str, check_hashes: bool = True, mode: str = "train") -> Path:
    """The checkpoint run.resume=`value` names: that checkpoint, or a run directory's newest
    complete one; UserError (exit 2) when it holds none, with a fix that a run of `mode`
    can take. Validation checks the same without reading every file's sha256
    (`check_hashes`), which the launch does."""
    path = Path(value).expanduser().resolve()
    if (
        path.is_dir()
        and checkpoint.rollouts_done_of(path) is None
        and not (path / checkpoint.MANIFEST).exists()
    ):
        scan = checkpoint.scan(path, check_hashes)  # a run directory: its newest complete one
        _report(scan)
        if scan.latest is None:
            raise _bad_path(value, f"{path} holds no complete checkpoint", mode)
        return scan.latest
    try:
        checkpoint.verify(path, check_hashes)
    except CheckpointError as exc:
        raise _bad_path(value, str(exc), mode) from None
    return path


def _bad_path(value: str, problem: str, mode: str) -> UserError:
    fix = (
        EVAL_RESUME_FIX  # mode=eval refuses run.resume=auto
        if mode == "eval"
        else "point run.resume at a complete checkpoint (<run.dir>/ckpt/rollout_<n>) or at a "
        "run directory, or use run.resume=auto"
    )
    return UserError(
        [
            Issue(
                key="run.resume",
                value=value,
                message=f"cannot resume from it: {problem}",
                fix=fix,
            )
        ],
        title="checkpoint problem",
    )


def _refuse_used_dir(run_dir: Path) -> None:
    """A fresh start must not mix its checkpoints with an earlier run's."""
    found = checkpoint.scan(run_dir, check_hashes=False)
    existing = found.complete + [b.path for b in found.broken]
    if existing:
        raise UserError(
            [
                Issue(
                    key="run.dir",
                    value=str(run_dir),
                    message=f"already holds checkpoints of an earlier run "
                    f"({', '.join(p.name for p in existing[:3])}); a new run there would mix "
                    "its checkpoints with them",
                    fix="add run.resume=auto to continue that run, or choose another run.dir",
                )
            ],
            title="run directory in use",
        )


def set_aside_newer(run_dir: Path, rollouts_done: int) -> None:
    """Checkpoints past the resumed one belong to an abandoned continuation: move them to
    ckpt/abandoned/ so that a later run.resume=auto cannot pick them."""
    root = checkpoint.checkpoint_root(run_dir)
    if not root.is_dir():
        return
    newer = [
        p
        for p in root.iterdir()
        if p.is_dir() and (checkpoint.rollouts_done_of(p) or -1) > rollouts_done
    ]
    for moved in checkpoint.set_aside(newer):
        status(f"moved a checkpoint newer than the resumed one to {moved}")
