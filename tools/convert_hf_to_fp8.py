"""Convert a bf16/fp32 Hugging Face checkpoint to block-quantised FP8 for FP8 rollout.

    python tools/convert_hf_to_fp8.py --model-dir /root/GLM-4.5-355B-A32B \
        --save-dir /root/GLM-4.5-355B-A32B-FP8 --strategy block --block-size 128 128 \
        --max-workers 4

Linear weights become float8_e4m3fn with a float32 `weight_scale_inv` per block (or per
output row with `--strategy channel`); norms, embeddings, the output head and MoE router
gates stay as they are (rlpost.backends.fp8). Shard by shard, `--max-workers` at once: peak
memory is a few shards, never the model. Point `model.hf_checkpoint` at the result; the
trainer keeps training in bf16/fp32 and every weight update is quantised the same way.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from rlpost.backends.fp8 import Fp8Error, Fp8Format
from rlpost.backends.fp8_convert import convert_folder, return_freed_memory
from rlpost.backends.hf_folder import check_replaceable, shard_files
from rlpost.errors import EXIT_USER_ERROR, UserError, run_command


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, required=True, help="the bf16 HF folder")
    parser.add_argument("--save-dir", type=Path, required=True, help="where the FP8 folder goes")
    parser.add_argument("--strategy", choices=("block", "channel"), default="block")
    parser.add_argument(
        "--block-size", type=int, nargs=2, default=(128, 128), metavar=("ROWS", "COLS")
    )
    parser.add_argument("--max-workers", type=int, default=1, help="shards converted at once")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if min(args.block_size) < 1 or args.max_workers < 1:
        print("error: --block-size and --max-workers must be positive", file=sys.stderr)
        return 2
    try:
        check_replaceable(args.save_dir, "--save-dir")
    except UserError as error:
        print(error.render(), file=sys.stderr)
        return EXIT_USER_ERROR
    fmt = Fp8Format(None if args.strategy == "channel" else tuple(args.block_size))
    return_freed_memory()  # this process converts too (--max-workers 1)
    try:
        total = len(shard_files(args.model_dir)) if args.model_dir.is_dir() else 0
        with tqdm(total=total, unit="shard", desc="fp8") as bar:
            out = convert_folder(args.model_dir, args.save_dir, fmt, args.max_workers, bar.update)
    except (Fp8Error, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({fmt.strategy}, block {fmt.block_size or 'one row'})")
    return 0


if __name__ == "__main__":
    run_command("convert_hf_to_fp8", main)
