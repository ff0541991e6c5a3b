"""Export the policy of a saved checkpoint as a Hugging Face folder.

    python tools/export_hf.py runs/x/ckpt/rollout_40 out/policy-40
    python tools/export_hf.py runs/x out/latest      # a run directory: its newest checkpoint

The folder loads with AutoModelForCausalLM.from_pretrained. The model's config and tokenizer
files are copied from the run's model.hf_checkpoint (or model.load); pass --base-model when
that folder has moved. The checkpoint is verified against its manifest first.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlpost.backends.hf_folder import check_replaceable
from rlpost.errors import EXIT_USER_ERROR, UserError
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
    sys.exit(main())
