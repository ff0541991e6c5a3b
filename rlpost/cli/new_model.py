"""`rlpost new model --from-hf DIR`: a model YAML drawn from an HF checkpoint's config.json.

    rlpost new model --from-hf /ckpt/Qwen3-8B                    # -> conf/model/qwen3-8b.yaml
    rlpost new model --from-hf /ckpt/Qwen3-8B --config-dir my_configs --name qwen3-8b-sft
    rlpost new model --from-hf /ckpt/Qwen3-8B --out -             # print it

The file holds every architecture fact, is validated by the schema and compared with the
same config.json (rlpost.config.hf_fields) before it is written, and points `hf_checkpoint` at
DIR, so `rlpost validate` compares it with the checkpoint again from then on.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlpost.cli.target import add_config_dir_argument
from rlpost.cli.yaml_text import block_lines
from rlpost.config.hf_model import HFConfig, model_fields
from rlpost.config.sources import CONF_DIR, display_path
from rlpost.errors import Issue, UserError

HELP = "write a model YAML from a Hugging Face config.json"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
CHECKPOINT_KEYS = ("hf_checkpoint", "ref_load")
SECTION_KEYS = ("rope_scaling", "mla", "moe")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from-hf", required=True, metavar="DIR", help="HF checkpoint folder")
    parser.add_argument("--name", help="config name (default: DIR's name, lower-cased)")
    parser.add_argument(
        "--hf-checkpoint",
        metavar="PATH",
        help="where runs read the checkpoint (default: DIR)",
    )
    parser.add_argument(
        "--ref-load",
        metavar="PATH",
        help="the KL's reference (default: the checkpoint itself, which both trainers read; "
        "a torch_dist folder converted from it serves as well)",
    )
    parser.add_argument("--description", help="one line (default: drawn from the architecture)")
    add_output_arguments(parser, "model")


def add_output_arguments(parser: argparse.ArgumentParser, group: str) -> None:
    """--config-dir, --out and --force of the `rlpost new` commands, which write
    <config dir, or ./conf>/<group>/<name>.yaml (`output_path`, `write_text`)."""
    add_config_dir_argument(parser)
    parser.add_argument(
        "--out",
        metavar="PATH",
        help="file to write, or - for stdout "
        f"(default: <config dir, or ./conf>/{group}/<name>.yaml)",
    )
    parser.add_argument("--force", action="store_true", help="overwrite an existing file")


def check_name(name: str, what: str) -> str:
    if NAME_PATTERN.match(name):
        return name
    raise UserError(
        [
            Issue(
                key="NAME",
                value=name,
                message=f"'{name}' cannot name a {what} file (letters, digits, '_', '.', '-')",
                fix="choose a name like qwen3-8b-sft",
            )
        ],
        title="command-line error",
    )


def render_model_yaml(fields: Mapping[str, Any], source: str) -> str:
    """The file text: a header, the architecture, then the checkpoint locations."""
    head = {k: v for k, v in fields.items() if k not in CHECKPOINT_KEYS + SECTION_KEYS}
    sections = {k: fields[k] for k in SECTION_KEYS if k in fields}
    paths = {k: fields[k] for k in CHECKPOINT_KEYS}
    header = [
        f"# Drawn by `rlpost new model --from-hf` from {source}'s config.json. Validation",
        "# compares each architecture field with <hf_checkpoint>/config.json when it exists.",
    ]
    lines = header + block_lines(head) + block_lines(sections) + [""] + block_lines(paths)
    return "\n".join(lines) + "\n"


def output_path(out: str | None, config_dir: str | None, group: str, name: str) -> Path | None:
    """--out, else <config dir, or ./conf>/<group>/<name>.yaml; None for stdout. A path in
    another config dir under a shipped config's name is refused: never loaded."""
    if out == "-":
        return None
    path = Path(out) if out else Path(config_dir or "conf") / group / f"{name}.yaml"
    _check_not_shadowed(path, group, by_out=bool(out))
    return path


def _check_not_shadowed(path: Path, group: str, by_out: bool) -> None:
    """Hydra searches rlpost's conf/ before a config dir: a file of another config dir named
    like a shipped one would never be loaded, and `group=<name>` would run the shipped one."""
    shipped = CONF_DIR / group / f"{path.stem}.yaml"
    if path.parent.name != group or not shipped.is_file():
        return
    if shipped.resolve() == path.resolve():
        return  # the shipped file itself (write_text refuses it without --force)
    other = f"my_{path.stem}"
    name_key, name_fix = ("--name", f"--name {other}") if group == "model" else ("NAME", other)
    raise UserError(
        [
            Issue(
                key="--out" if by_out else name_key,
                value=str(path) if by_out else path.stem,
                message=f"rlpost ships {display_path(shipped)} under the same name, and Hydra "
                f"searches the shipped configs before {path.parent.parent}, so {group}="
                f"{path.stem} would load the shipped file and never {path}",
                fix=f"choose another name: --out {path.with_stem(other)}"
                if by_out
                else f"choose another name: {name_fix}",
            )
        ],
        title="command-line error",
    )


def use_line(path: Path, group: str, command: str) -> str:
    """How to use the written file: `<command> [--config-dir DIR ]group=name`, where DIR is
    its config dir (none for the shipped conf/); a file outside a group folder moves first."""
    if path.parent.name != group:
        return (
            f"to use it, move it into a config dir as <dir>/{group}/{path.stem}.yaml: "
            f"{command} --config-dir <dir> {group}={path.stem}"
        )
    folder = path.parent.parent
    where = "" if folder.resolve() == CONF_DIR.resolve() else f"--config-dir {folder} "
    return f"{command} {where}{group}={path.stem}"


def write_text(path: Path | None, text: str, force: bool) -> None:
    """Print (path None) or write `text`, refusing to overwrite unless forced."""
    if path is None:
        print(text, end="")
        return
    if path.exists() and not force:
        raise UserError(
            [
                Issue(
                    key="--out",
                    value=str(path),
                    message=f"{path} already exists",
                    fix="pass --force to overwrite it, or --out another path",
                )
            ],
            title="command-line error",
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(
            [
                Issue(
                    key="--out",
                    value=str(path),
                    message=f"cannot write it: {exc.strerror or exc}",
                    fix="choose a writable --out path or --config-dir",
                )
            ],
            title="command-line error",
        ) from None


def run(args: argparse.Namespace) -> int:
    source = Path(args.from_hf)
    hf = HFConfig.read(source)
    folder = source if source.is_dir() else source.parent
    name = check_name(args.name or folder.resolve().name.lower(), "model")
    checkpoint = args.hf_checkpoint or str(folder.resolve())
    fields = model_fields(hf, name, checkpoint, args.description, ref_load=args.ref_load)
    text = render_model_yaml(fields, str(fields["hf_architecture"]))
    path = output_path(args.out, args.config_dir, "model", name)
    write_text(path, text, args.force)
    if path is not None:
        print(f"wrote {path}: {fields['description']}")
        use = use_line(path, "model", "rlpost validate")
        print(f"check it in a run: {use} recipe=... hardware=...")
    return 0
