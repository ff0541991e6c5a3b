"""Generate an SGLang option table: every SGLang server option, typed, with its flags.

Two tables are kept, each generated from the SGLang it names and committed:
- rlpost/config/sglang_options.json, the SGLang rlpost's engines run: rlpost passes
  `layout.rollout.sglang` to them by SGLang's own option names and checks them against it at
  validation time, without importing SGLang (which needs a GPU stack);
- rlpost/plan/slime_sglang_options.json, the SGLang that slime's pinned commit runs
  (rlpost.plan.slime_args.SGLANG_VERSION): mode=slime_args passes only options it has, as
  --sglang-<flag>, and refuses the others (slime would drop them without a word).
Rerun after moving to a new SGLang version (or slime commit).

SGLang pins a CUDA torch, so run this in a throwaway environment, never rlpost's own:

    python3.11 -m venv /tmp/sgl && /tmp/sgl/bin/pip install --no-deps sglang==0.5.23 triton
    /tmp/sgl/bin/pip install torch==2.13.0 numpy orjson psutil pybase64 requests packaging \
        pillow starlette msgspec pydantic pyzmq tqdm ipython aiohttp
    /tmp/sgl/bin/python tools/gen_sglang_options.py --out rlpost/config/sglang_options.json

The package list is what `from sglang.srt.server_args import ServerArgs` asks for; torch
2.13.0 is the CPU build (a bare `torch` would pull the CUDA wheels). No engine runs there.
SGLang 0.5.15.post1 (slime's) also imports torchvision, transformers 5.12.1, zstandard, dill,
openai, partial_json_parser and sentencepiece: install `torch==2.14.1 torchvision==0.29.1`
(the pair this machine's pip has on disk) in place of torch 2.13.0, then

    /tmp/sgl/bin/python tools/gen_sglang_options.py --out rlpost/plan/slime_sglang_options.json

Types are written as a small vocabulary rlpost checks values against: `bool`, `int`,
`float`, `str`, `list[<kind>]`, `dict`, `any`; plus `nullable` and, for Literal types and
options with fixed choices, `choices`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any

SCALARS = {bool: "bool", int: "int", float: "float", str: "str"}


def _unwrap(annotation: Any) -> tuple[Any, tuple[Any, ...]]:
    """(the type, its Annotated metadata)."""
    if typing.get_origin(annotation) is typing.Annotated:
        base, *meta = typing.get_args(annotation)
        return base, tuple(meta)
    return annotation, ()


def _kinds(annotation: Any) -> tuple[list[str], bool, list[Any] | None]:
    """(accepted kinds, nullable, Literal choices) of one annotation."""
    origin = typing.get_origin(annotation)
    if annotation is type(None):
        return [], True, None
    if origin in (typing.Union, types.UnionType):
        kinds: list[str] = []
        nullable, choices = False, None
        for arg in typing.get_args(annotation):
            sub_kinds, sub_null, sub_choices = _kinds(arg)
            kinds += [k for k in sub_kinds if k not in kinds]
            nullable = nullable or sub_null
            choices = sub_choices if sub_choices is not None else choices
        return kinds, nullable, choices
    if origin is typing.Literal:
        values = list(typing.get_args(annotation))
        nullable = None in values
        values = [v for v in values if v is not None]
        kinds = sorted({SCALARS.get(type(v), "any") for v in values})
        return kinds, nullable, values
    if annotation in SCALARS:
        return [SCALARS[annotation]], False, None
    if (origin or annotation) in (list, set, tuple):
        args = typing.get_args(annotation)
        item = _kinds(args[0])[0] if args else ["any"]
        return [f"list[{item[0] if len(item) == 1 else 'any'}]"], False, None
    if (origin or annotation) is dict:
        return ["dict"], False, None
    return ["any"], False, None  # callables, classes, SGLang records: not settable from YAML


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple | set):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return repr(value)


def _defaults(cls: type) -> dict[str, Any]:
    """Field defaults of a msgspec Struct (SGLang >= 0.5.2x) or a dataclass (older)."""
    if dataclasses.is_dataclass(cls):
        out = {}
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = f.default_factory()
        return out
    names = cls.__struct_fields__  # type: ignore[attr-defined]
    values = cls.__struct_defaults__  # type: ignore[attr-defined]
    out = {}
    for name, value in zip(names[len(names) - len(values) :], values, strict=True):
        factory = getattr(value, "factory", None)
        out[name] = factory() if callable(factory) else value
    return out


def _field_names(cls: type) -> list[str]:
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    return list(cls.__struct_fields__)  # type: ignore[attr-defined]


def _cli_actions(cls: type) -> dict[str, list[argparse.Action]]:
    """Option name -> the argparse actions SGLang's own command line has for it (the flag,
    then any aliases added on their own, deprecated spellings among them)."""
    parser = argparse.ArgumentParser(add_help=False)
    cls.add_cli_args(parser)  # type: ignore[attr-defined]
    actions: dict[str, list[argparse.Action]] = {}
    for action in parser._actions:
        if any(o.startswith("--") for o in action.option_strings):
            actions.setdefault(action.dest, []).append(action)
    return actions


def _longs(action: argparse.Action) -> list[str]:
    return [o for o in action.option_strings if o.startswith("--")]


def _arg_choices(meta: tuple[Any, ...]) -> list[Any] | None:
    for item in meta:
        choices = getattr(item, "choices", None)
        nargs = getattr(item, "nargs", None)
        if choices and nargs is None:
            return list(choices)
    return None


def describe_options(cls: type) -> dict[str, dict[str, Any]]:
    hints = typing.get_type_hints(cls, include_extras=True)
    defaults, actions = _defaults(cls), _cli_actions(cls)
    options: dict[str, dict[str, Any]] = {}
    for name in _field_names(cls):
        if name.startswith("_"):
            continue  # SGLang's own bookkeeping
        base, meta = _unwrap(hints[name])
        kinds, nullable, choices = _kinds(base)
        entry: dict[str, Any] = {"type": kinds or ["any"], "nullable": nullable}
        choices = choices if choices is not None else _arg_choices(meta)
        if choices is not None:
            entry["choices"] = _jsonable(choices)
        if name in defaults:
            entry["default"] = _jsonable(defaults[name])
        else:
            entry["required"] = True
        own = actions.get(name, [])
        entry["cli"] = _longs(own[0])[0] if own else None
        if own:
            # every spelling the command line takes, and whether the flag takes a value
            entry["flags"] = [flag for action in own for flag in _longs(action)]
            entry["switch"] = own[0].nargs == 0
        options[name] = entry
    return options


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("rlpost/config/sglang_options.json"))
    args = parser.parse_args()

    import sglang
    from sglang.srt.server_args import ServerArgs

    options = describe_options(ServerArgs)
    document = {
        "sglang_version": sglang.__version__,
        "source": "sglang.srt.server_args.ServerArgs",
        "generated_by": "tools/gen_sglang_options.py",
        "options": options,
    }
    args.out.write_text(json.dumps(document, indent=1, sort_keys=False) + "\n")
    print(f"wrote {len(options)} options of SGLang {sglang.__version__} to {args.out}")


if __name__ == "__main__":
    main()
