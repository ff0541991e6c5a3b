"""The run directory a launch writes: it can be created and written, is no other folder's
files, has disk room for the run's saves; and run.resume names a complete checkpoint.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rlpost.errors import Issue, UserError
from rlpost.plan.plan import Plan
from rlpost.schema import RunConfig
from rlpost.schema.run import EVAL_RESUME_FIX


def check_run_dir(cfg: RunConfig, plan: Plan) -> list[Issue]:
    issues = []
    if cfg.run.dir is not None:
        target = Path(cfg.run.dir).expanduser().resolve()
        existing = next((p for p in (target, *target.parents) if p.exists()), None)
        foreign = foreign_run_dir(cfg.run.dir, target)
        training_run = _a_run_to_keep(cfg, target)
        if foreign:
            issues.append(foreign)
        elif training_run:
            issues.append(training_run)
        elif existing is None or not _writable_folder(existing):
            issues.append(
                Issue(
                    "run.dir",
                    f"cannot be created or written: {existing} is not a writable folder",
                    "choose a run.dir under a folder you can write to",
                    value=cfg.run.dir,
                )
            )
        elif existing is not None:
            free = shutil.disk_usage(existing).free
            # a run that resumes here: its checkpoints give way to new ones, its exports stay
            from rlpost.runtime.checkpoint import bytes_under

            held = bytes_under(target / "ckpt")
            exported = _folders_in(target / "hf")
            issues += checkpoint_disk_issues(cfg, plan, free + held, exported)
    return issues + check_resume_target(cfg.run.resume, cfg.mode)


def check_resume_target(resume: str | None, mode: str = "train") -> list[Issue]:
    """run.resume names a complete checkpoint, or a run directory holding one: the launch's
    own test (rlpost.runtime.resume), sizes checked but not each file's sha256."""
    if resume in (None, "auto"):
        return []
    if not Path(resume).expanduser().is_dir():
        issues = [
            Issue(
                "run.resume",
                "no such checkpoint or run directory on this machine",
                "point run.resume at <run.dir>/ckpt/rollout_<n> or at a run directory, or use "
                "run.resume=auto",
                value=resume,
            )
        ]
    else:
        from rlpost.runtime.resume import checkpoint_named

        try:
            checkpoint_named(resume, check_hashes=False, mode=mode)
            return []
        except UserError as exc:
            issues = exc.issues
    if mode == "eval":
        return [dataclasses.replace(i, fix=EVAL_RESUME_FIX) for i in issues]
    return issues


SHOWN_ENTRIES = 4


def _a_run_to_keep(cfg: RunConfig, target: Path) -> Issue | None:
    """mode=eval naming a run's directory: its metrics.jsonl would gain an evaluation that
    no rollout of the run made, beside the run's own at that rollout."""
    from rlpost.runtime.rundir import RUN_MARKERS

    if cfg.mode != "eval" or not any((target / marker).exists() for marker in RUN_MARKERS):
        return None
    return Issue(
        "run.dir",
        f"{target} is a run's directory, and mode=eval writes a run directory of its own",
        "leave run.dir unset (a new dated directory) or name a new one; to evaluate this "
        f"run's weights, run.resume={target}/ckpt/rollout_<n>",
        value=cfg.run.dir,
    )


def foreign_run_dir(value: str, target: Path) -> Issue | None:
    """run.dir naming a folder that holds files and is no run's: the launch would write its
    config.yaml, provenance.json and metrics.jsonl over any of the same name there."""
    from rlpost.runtime.rundir import RUN_MARKERS, foreign_entries

    entries = foreign_entries(target)
    if not entries:
        return None
    shown = ", ".join(entries[:SHOWN_ENTRIES])
    more = len(entries) - SHOWN_ENTRIES
    shown += f" and {more} more" if more > 0 else ""
    return Issue(
        "run.dir",
        f"{target} holds {shown}; it is no run's directory (every launch of rlpost writes "
        f"{' and '.join(RUN_MARKERS[:-1])} in its run's, and checkpoints in "
        f"{RUN_MARKERS[-1]}/): this launch would write its config.yaml, provenance.json and "
        "metrics.jsonl over files of those names",
        "choose a new or empty folder, or the run's own folder (the one an earlier launch of "
        "it wrote, to continue it with run.resume=auto)",
        value=value,
    )


def saves_due(interval: int | None, total: int) -> int:
    """How many of `total` rollouts end with a save every `interval` (and the last always)."""
    if interval is None:
        return 0
    return total // interval + (total % interval != 0)


@dataclass(frozen=True)
class CheckpointDisk:
    """What a run's saves hold on the disk of run.dir at their peak, in bytes."""

    checkpoint: float  # one trainer checkpoint: weights (+ optimizer state)
    kept: int  # checkpoints on disk at once: keep_last, plus the new one before pruning
    hf_export: float  # one HF export of the policy
    hf_exports: int  # HF exports written (never pruned)
    on_sigterm_only: bool = False  # no save is due: the one counted is SIGTERM's

    @property
    def total(self) -> float:
        return self.checkpoint * self.kept + self.hf_export * self.hf_exports


def checkpoint_disk(cfg: RunConfig, plan: Plan) -> CheckpointDisk:
    """The bytes of the run's checkpoints and HF exports: per parameter, the trainer's weights
    (megatron: the compute dtype; the torch trainer: its float32 shards) and, with
    save_optimizer, two float32 Adam moments and, where the weights are not float32 already,
    float32 master weights; an HF export in the compute dtype. An evaluation (mode=eval)
    saves nothing: no checkpoint, no export, none when it is stopped."""
    if cfg.mode == "eval":
        return CheckpointDisk(0.0, 0, 0.0, 0)
    save, total = cfg.recipe.save, cfg.recipe.rollout.num_rollout
    params = plan.memory.params_total
    compute = 4 if cfg.model.params_dtype == "fp32" or cfg.hardware.kind == "cpu" else 2
    torch_trainer = plan.trainer_backend == "torch"
    weights = 4 if torch_trainer else compute
    optimizer = (8 + (4 if weights < 4 else 0)) if save.save_optimizer else 0
    saves = saves_due(save.interval, total)
    # run.on_sigterm: save writes a checkpoint when the run is stopped, saves due or not
    on_sigterm_only = saves == 0 and cfg.run.on_sigterm == "save"
    kept = 1 if on_sigterm_only else min(save.keep_last + 1, saves)
    exports = saves_due(save.save_hf_interval, total)
    return CheckpointDisk(
        params * (weights + optimizer), kept, params * compute, exports, on_sigterm_only
    )


def checkpoint_disk_issues(
    cfg: RunConfig, plan: Plan, free_bytes: float, exported: int = 0
) -> list[Issue]:
    """Saves that cannot all fit in the free space of run.dir's disk: the first to find it
    full would come hours in; the run goes on without it, and a last save that fails fails
    the run. `free_bytes` counts a resumed run's own checkpoints as free (new ones replace
    them); `exported`: its HF exports already written."""
    need = checkpoint_disk(cfg, plan)
    need = dataclasses.replace(need, hf_exports=max(0, need.hf_exports - exported))
    if need.total <= free_bytes:
        return []
    save, gib = cfg.recipe.save, 1024**3
    fixes = ["free space there or point run.dir at a larger disk"]
    if need.on_sigterm_only:
        what = "(run.on_sigterm: save; recipe.save.interval is null)"
        parts = [f"the checkpoint of {need.checkpoint / gib:,.1f} GiB a SIGTERM saves {what}"]
        fixes.append("run.on_sigterm: stop (a SIGTERM then loses what the run trained)")
    else:
        kept = f"keep_last {save.keep_last}, and the new one before the oldest goes"
        parts = [f"{need.kept} checkpoint(s) of {need.checkpoint / gib:,.1f} GiB at once ({kept})"]
        fixes.append("lower recipe.save.keep_last")
    if need.hf_exports:
        parts.append(f"{need.hf_exports} HF export(s) of {need.hf_export / gib:,.1f} GiB")
    if save.save_optimizer:
        fixes.append("recipe.save.save_optimizer: false (weights only: no exact resume)")
    if need.hf_exports:
        fixes.append("a larger recipe.save.save_hf_interval")
    return [
        Issue(
            "run.dir",
            f"the run's saves need {need.total / gib:,.1f} GiB ({'; '.join(parts)}), and its "
            f"disk has {free_bytes / gib:,.1f} GiB free",
            ", ".join(fixes[:-1]) + f" or {fixes[-1]}",
            value=cfg.run.dir,
        )
    ]


def _folders_in(folder: Path) -> int:
    try:
        return sum(1 for p in folder.iterdir() if p.is_dir())
    except OSError:
        return 0


def _writable_folder(folder: Path) -> bool:
    """Whether a file can be made in `folder` (tried: permission bits do not tell for root, or
    for special file systems)."""
    if not folder.is_dir():
        return False
    try:
        handle, name = tempfile.mkstemp(prefix=".rlpost-probe-", dir=folder)
    except OSError:
        return False
    os.close(handle)
    os.unlink(name)
    return True
