"""Convert a megatron-core torch_dist checkpoint (rlpost's Megatron backend) back to an HF
folder.

Weights come from the torch_dist checkpoint; config.json, tokenizer files and any tensors it
does not hold (MTP layers of a run that did not train them) come from `model.hf_checkpoint`,
which must agree with the model YAML (checked first, as in convert_hf_to_megatron.py).

    python tools/convert_megatron_to_hf.py model=qwen3-4b \\
        --load /root/Qwen3-4B_rlpost/iter_0000100 --out /root/Qwen3-4B_step100_hf
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlpost.backends.hf_folder import check_replaceable
from rlpost.errors import UserError, exit_with, run_command


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="model=<name> and model.<key>=<value>")
    parser.add_argument("--model-yaml", help="a model YAML file instead of model=<name>")
    parser.add_argument("--load", required=True, help="torch_dist checkpoint folder to read")
    parser.add_argument("--out", required=True, help="HF folder to write")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        check_replaceable(args.out, "--out")
        from rlpost.backends.megatron.model_yaml import (
            check_model_matches_hf,
            check_torch_dist_folder,
            resolve_model,
        )

        model, yaml_file = resolve_model(args.overrides, args.model_yaml)
        check_torch_dist_folder(args.load, "--load")  # before importing megatron-core
        check_model_matches_hf(model, yaml_file)
        from rlpost.backends.megatron.conversion import torch_dist_to_hf

        out = torch_dist_to_hf(model, Path(args.load), Path(args.out), yaml_file)
    except UserError as error:
        exit_with(error)
    print(f"wrote {out} from {args.load}")
    return 0


if __name__ == "__main__":
    run_command("convert_megatron_to_hf", main)
