"""Export the policy of a saved checkpoint as a Hugging Face folder.

    python tools/export_hf.py runs/x/ckpt/rollout_40 out/policy-40
    python tools/export_hf.py runs/x out/latest      # a run directory: its newest checkpoint

The folder loads with AutoModelForCausalLM.from_pretrained. The model's config and tokenizer
files are copied from the run's model.hf_checkpoint (or model.load); pass --base-model when
that folder has moved. The checkpoint is verified against its manifest first.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rlpost.backends.hf_folder import check_replaceable
from rlpost.errors import EXIT_USER_ERROR, Issue, UserError, run_command
from rlpost.runtime import checkpoint


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint folder as given, or the newest complete one of a run directory."""
    if not path.is_dir():
        what = "is a file, not a folder" if path.exists() else "does not exist"
        raise checkpoint.CheckpointError(
            path, f"{what}: give a checkpoint (<run.dir>/ckpt/rollout_<n>) or a run directory"
        )
    if (path / checkpoint.MANIFEST).exists() or checkpoint.rollouts_done_of(path) is not None:
        return path
    found = checkpoint.scan(path)
    for broken in found.broken:
        print(f"skipping broken checkpoint {broken}", file=sys.stderr)
    if found.latest is None:
        raise checkpoint.CheckpointError(path, "no complete checkpoint under ckpt/")
    return found.latest


def check_base_model(source: Path, base_model: Path | None) -> None:
    """Refuse a base folder whose config.json describes another model than the checkpoint's
    run trained: its weights would not load into it."""
    from pydantic import ValidationError

    from rlpost.config.hf_fields import mismatches
    from rlpost.runtime.run_state import base_model_dir, saved_model_config

    base = base_model or base_model_dir(source)
    config_file = base / "config.json"
    if not config_file.is_file():
        return  # the export reports it, with the fix
    try:
        model = saved_model_config(source, base)
    except (ValidationError, KeyError, TypeError):
        return  # a config.yaml of another version: the load itself is the check
    found = mismatches(model, json.loads(config_file.read_text(encoding="utf-8")))
    if not found:
        return
    differ = ", ".join(f"{m.field}={m.ours!r} there, {m.stated()} here" for m in found)
    key = "--base-model" if base_model else "model.hf_checkpoint (the checkpoint's config.yaml)"
    raise UserError(
        [
            Issue(
                key,
                f"{config_file} describes another model than the one {source} holds "
                f"({differ}): its weights would not load",
                "pass --base-model with the HF folder the run trained from (its config.json "
                "and tokenizer files)",
                value=str(base),
            )
        ],
        title="export error",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path, help="ckpt/rollout_<n>, or a run directory")
    parser.add_argument("out_dir", type=Path, help="the HF folder to write")
    parser.add_argument("--base-model", type=Path, default=None, help="config/tokenizer source")
    args = parser.parse_args(argv)
    from rlpost.runtime.run_state import export_checkpoint_hf

    try:
        check_replaceable(args.out_dir, "out_dir")
        source = resolve_checkpoint(args.checkpoint.resolve())
        checkpoint.verify(source)
        check_base_model(source, args.base_model)
        out = export_checkpoint_hf(source, args.out_dir, args.base_model)
    except UserError as error:
        print(error.render(), file=sys.stderr)
        return EXIT_USER_ERROR
    except checkpoint.CheckpointError as exc:
        print(f"export_hf: cannot export: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except FileNotFoundError as exc:
        print(f"export_hf: {exc}; pass --base-model PATH", file=sys.stderr)
        return EXIT_USER_ERROR
    print(f"exported {source} -> {out}")
    return 0


if __name__ == "__main__":
    run_command("export_hf", main)
