"""Convert an HF checkpoint into a megatron-core torch_dist checkpoint for rlpost's Megatron
backend.

The model is described by a model YAML, picked like the launcher picks it (`model=<name>` from
conf/model, plus overrides) or given as a file. The YAML is compared with the checkpoint's
config.json first; any disagreement (layers, heads, query groups, vocabulary, experts, ...) is
reported and nothing is written. The result loads under any parallel layout (point model.load
or model.ref_load at it).

    python tools/convert_hf_to_megatron.py model=qwen3-4b --save /root/Qwen3-4B_torch_dist
    python tools/convert_hf_to_megatron.py --model-yaml my_model.yaml \\
        model.hf_checkpoint=/data/ckpt --save /data/ckpt_torch_dist

Runs in one process with the whole model in memory (CPU without CUDA).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlpost.errors import UserError, exit_with, run_command


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="model=<name> and model.<key>=<value>")
    parser.add_argument("--model-yaml", help="a model YAML file instead of model=<name>")
    parser.add_argument("--save", required=True, help="torch_dist checkpoint folder to write")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        from rlpost.backends.megatron.model_yaml import check_model_matches_hf, resolve_model

        model, yaml_file = resolve_model(args.overrides, args.model_yaml)
        check_model_matches_hf(model, yaml_file)  # before importing megatron-core
        from rlpost.backends.megatron.conversion import hf_to_torch_dist

        out = hf_to_torch_dist(model, Path(args.save), yaml_file)
    except UserError as error:
        exit_with(error)
    print(f"wrote {out} from {model.hf_checkpoint}")
    return 0


if __name__ == "__main__":
    run_command("convert_hf_to_megatron", main)
