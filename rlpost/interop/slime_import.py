"""A slime launch script -> rlpost's model, recipe, hardware and layout YAML.

The script is evaluated by bash with every command recorded instead of run (shell.py); the
train command it would have started (slime_launch.py) is mapped flag by flag (slime_flags.py:
the key it sets, read together with others, held at rlpost's fixed value, or listed as not
imported with the reason and the nearest key); its MODEL_ARGS become a shipped model or one
drawn from them (slime_model.py). A flag absent from the script takes slime's (or Megatron's)
default, as it would in slime. The inverse of `mode=slime_args` (rlpost.plan.slime_args).

    result = import_slime(Path("scripts/run-glm4-9B.sh"), slime_dir=None)
    result.write(Path("imported"))   # recipe/, layout/ (and model/, hardware/ when needed)
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from rlpost.config.sglang_options import load_sglang_options
from rlpost.config.sources import CONF_DIR
from rlpost.errors import Issue, Location, UserError
from rlpost.interop.shell import DEFAULT_GPUS_PER_NODE, evaluate_script
from rlpost.interop.slime_flags import (
    CLUSTER_FLAGS,
    FIXED_SETTINGS,
    FIXED_WHEN_ABSENT,
    HEALTH_CHECK_FLAGS,
    NOT_IMPORTED,
    OFFLOAD_FLAGS,
    READ_NOT_DEFINED,
    REWARDS_FROM_SLIME,
    RULES,
    SECRET_FLAGS,
    SLIME_FULLY_ASYNC,
    TOGETHER_FLAGS,
    environment_note,
    hook_path,
    many,
    nearest_key,
    one,
    split_flags,
)
from rlpost.interop.slime_launch import Launch, read_launch
from rlpost.interop.slime_model import (
    SLIME_MODEL_SCRIPTS,
    Difference,
    ModelMatch,
    match_model,
    model_flag_names,
    model_scripts,
    shipped_models,
)
from rlpost.plan.slime_args import (
    RUNTIME_ENV,
    SGLANG_VERSION,
    SLIME_CKPT_DIR,
    slime_sglang_flags,
)
from rlpost.schema import ModelConfig, RunConfig


@dataclass(frozen=True)
class Unmapped:
    flag: str
    values: tuple[str, ...]
    reason: str
    nearest: str


@dataclass(frozen=True)
class Origin:
    """What in the script set an imported key: a flag and its value ('--rm-type', 'ifbench'),
    an --eval-config file's set (no value of its own) or one of its defaults and its value;
    `beside` says what else set the key, and why this one is the value imported."""

    source: str
    value: str | None = None
    beside: str | None = None

    def named(self) -> str:
        """The source as a fix names it: a flag is said to be in the script."""
        return self.source if " " in self.source else f"{self.source} in the script"


@dataclass
class Imported:
    """The configs a slime script imports to, and what could not be imported."""

    name: str
    model: str  # a shipped model name, or the written model file's
    hardware: str
    values: dict[str, Any] = field(default_factory=dict)  # recipe./layout./model./run. keys
    unmapped: list[Unmapped] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # the commands recorded, not run
    model_file: dict[str, Any] | None = None
    hardware_file: dict[str, Any] | None = None
    environment: list[tuple[str, str, str]] = field(default_factory=list)  # name, value, note
    model_notes: list[Difference] = field(default_factory=list)  # flags that change nothing
    cluster_notes: list[str] = field(default_factory=list)  # Ray head and worker starts
    # key -> what in the script set it, for refusals of the value
    origins: dict[str, Origin] = field(default_factory=dict)

    def origin(self, key: str) -> Origin | None:
        """What in the script set `key` (or the nearest section above it that one thing
        set: an evaluation set), if the import knows."""
        parts = key.split(".")
        for end in range(len(parts), 0, -1):
            found = self.origins.get(".".join(parts[:end]))
            if found is not None:
                return found
        return None

    def section(self, prefix: str) -> dict[str, Any]:
        tree: dict[str, Any] = {}
        for key, value in self.values.items():
            if key.startswith(prefix + "."):
                _set(tree, key[len(prefix) + 1 :], value)
        return tree

    def overrides(self) -> list[str]:
        """The launch's group choices (with --config-dir pointing at the written folder)."""
        return [
            f"model={self.model}",
            f"recipe={self.name}",
            f"hardware={self.hardware}",
            f"layout={self.name}",
        ]

    def extra_overrides(self) -> list[str]:
        """Run-level values (run.dir, run.seed, tracking, the engines' and the trainer's
        settings) given on the command line: those that change something, not the defaults
        (an exported run's --use-tensorboard, or --save ./slime/, which is run.dir: null)."""
        return [
            f"{key}={_override_text(value)}"
            for key, value in self.values.items()
            if (key == "mode" or key.startswith(("run.", "tracking.", "engine.", "trainer.")))
            and not _is_default(key, value)
        ]

    def write(self, out: Path) -> list[Path]:
        written = []
        recipe = {"name": self.name, **self.section("recipe")}
        recipe.setdefault("description", "imported from a slime script by rlpost import slime")
        written.append(_write(out / "recipe" / f"{self.name}.yaml", recipe))
        layout = {"layout": {"name": self.name, **self.section("layout")}}
        written.append(_write(out / "layout" / f"{self.name}.yaml", layout, global_package=True))
        if self.model_file is not None:
            written.append(_write(out / "model" / f"{self.model}.yaml", self.model_file))
        if self.hardware_file is not None:
            written.append(_write(out / "hardware" / f"{self.hardware}.yaml", self.hardware_file))
        return written


def _is_default(key: str, value: Any) -> bool:
    """Whether a run-level key's value is the one RunConfig gives it when no override does
    (these sections have no config group: their defaults are the schema's)."""
    first, *rest = key.split(".")
    info = RunConfig.model_fields.get(first)
    if info is None or info.is_required():
        return False
    node = info.get_default(call_default_factory=True)
    for part in rest:
        if not isinstance(node, BaseModel) or part not in type(node).model_fields:
            return False
        node = getattr(node, part)
    return node == value and isinstance(node, bool) == isinstance(value, bool)


def _override_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _write(path: Path, data: dict[str, Any], global_package: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    head = "# @package _global_\n" if global_package else ""
    head += "# written by `rlpost import slime`\n"
    path.write_text(head + yaml.safe_dump(data, sort_keys=False, default_flow_style=None))
    return path


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        tree = tree.setdefault(key, {})
    tree[last] = value


def _hardware(total: int, per_node: int) -> tuple[str, dict[str, Any] | None]:
    """A shipped H100 profile with this many GPUs, or a new one written beside the recipe."""
    for path in sorted((CONF_DIR / "hardware").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        if (
            data.get("kind", "gpu") == "gpu"
            and data["num_nodes"] * data["gpus_per_node"] == total
            and data["gpus_per_node"] == min(per_node, total)
        ):
            return path.stem, None
    base = yaml.safe_load((CONF_DIR / "hardware" / "h100x8.yaml").read_text())
    nodes = max(1, math.ceil(total / per_node))
    name = f"imported_{nodes}x{min(per_node, total)}"
    base.update(
        name=name,
        description=f"{nodes} node(s) x {min(per_node, total)} GPUs from a slime script "
        "(H100 figures assumed: check gpu_memory_gib and the bandwidths)",
        num_nodes=nodes,
        gpus_per_node=min(per_node, total),
    )
    return name, base


SLIME_REQUIRED = ("--rollout-batch-size",)
"""The flags slime's parser declares required=True (slime/utils/arguments.py at 624b824a)."""


def import_slime(
    path: Path,
    slime_dir: Path | None = None,
    name: str | None = None,
    *,
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
    env: Mapping[str, str] | None = None,
) -> Imported:
    """Evaluate the script with its commands recorded and map the train command's arguments;
    UserError when it runs none, or runs what rlpost cannot train."""
    source_dirs = () if slime_dir is None else (slime_dir / "scripts" / "models", slime_dir)
    evaluation = evaluate_script(
        path, gpus_per_node=gpus_per_node, env=env, source_dirs=source_dirs,
        sources=model_scripts(),
    )  # fmt: skip
    launch = read_launch(evaluation)
    if launch.entry is None:
        raise UserError([_no_train_command(launch)], title="import error")
    if launch.cut_after:
        raise UserError(
            [
                Issue(
                    "SCRIPT",
                    f"{path}: the train command ends before its arguments do: the next command "
                    f"starts with {launch.cut_after!r}, so bash (and slime) run train.py "
                    "without what follows",
                    "end each line of the train command with `\\` (look at the line before "
                    f"the one that gives {launch.cut_after})",
                    str(path),
                )
            ],
            title="import error",
        )
    flags = split_flags(list(launch.argv))
    loss = dict(flags).get("--loss-type")
    if loss and loss[0] == "sft_loss":
        raise UserError(
            [
                Issue(
                    "SCRIPT",
                    f"{path} is a supervised fine-tuning run (--loss-type sft_loss): rlpost "
                    "trains reinforcement-learning recipes only",
                    "train SFT with slime (or another SFT trainer) and give its checkpoint to "
                    "rlpost as model.load",
                    str(path),
                )
            ],
            title="import error",
        )
    missing = [flag for flag in SLIME_REQUIRED if flag not in dict(flags)]
    if missing:
        raise UserError(
            [
                Issue(
                    "SCRIPT",
                    f"{path} runs {launch.entry} without {', '.join(missing)}, which slime's "
                    "argument parser requires (it exits before anything starts)",
                    "add it to the train command, e.g. in ROLLOUT_ARGS: --rollout-batch-size "
                    "<prompts per rollout> (slime's example scripts use 32)",
                    str(path),
                )
            ],
            title="import error",
        )
    stem = re.sub(r"[^a-z0-9_]+", "_", (name or path.stem).lower()).strip("_")
    return _map(launch, flags, stem, gpus_per_node)


def _no_train_command(launch: Launch) -> Issue:
    said = f"; its last words: {launch.echoed[-1]!r}" if launch.echoed else ""
    ended = (
        f"it ended with status {launch.exit_status} before any{said}"
        if launch.exit_status
        else f"{len(launch.not_run)} other command(s) recorded"
    )
    return Issue(
        "SCRIPT",
        f"{launch.script} runs neither train.py nor train_async.py ({ended})",
        "give the slime launch script that runs training (scripts/run-*.sh); a variable it "
        "needs goes in with --env NAME=VALUE",
        str(launch.script),
    )


@dataclass
class _Sorted:
    """A train command's flags, sorted by how they are read."""

    values: dict[str, Any] = field(default_factory=dict)  # keys set flag by flag
    unmapped: list[Unmapped] = field(default_factory=list)
    model: dict[str, list[str]] = field(default_factory=dict)
    cluster: dict[str, list[str]] = field(default_factory=dict)
    together: dict[str, list[str]] = field(default_factory=dict)
    sglang: dict[str, Any] = field(default_factory=dict)
    origins: dict[str, Origin] = field(default_factory=dict)  # Imported's


def _sort(flags: list[tuple[str, list[str]]]) -> _Sorted:
    out = _Sorted()
    seen: dict[str, list[str]] = {}
    model_names = model_flag_names()
    for flag, vals in flags:
        if flag in SECRET_FLAGS:
            vals = ["<not copied>"] if vals else []
        if flag in seen and seen[flag] != vals:
            # argparse keeps the last: so does the import, and says so
            why = "given twice: the later value counts"
            out.unmapped.append(Unmapped(flag, tuple(seen[flag]), why, flag))
        seen[flag] = vals
        if flag in RULES:
            try:
                out.values[RULES[flag].key] = RULES[flag].read(vals)
                out.origins[RULES[flag].key] = Origin(flag, " ".join(vals))
            except (ValueError, IndexError, json.JSONDecodeError) as exc:
                why = f"its value does not read: {exc}"
                out.unmapped.append(Unmapped(flag, tuple(vals), why, RULES[flag].key))
        elif flag in model_names:
            out.model[flag] = vals
        elif flag in CLUSTER_FLAGS:
            out.cluster[flag] = vals
        elif flag in TOGETHER_FLAGS:
            out.together[flag] = vals
        else:
            out.unmapped += _other(flag, vals, out.sglang)
    return out


def _map(
    launch: Launch, flags: list[tuple[str, list[str]]], name: str, gpus_per_node: int
) -> Imported:
    got = _sort(flags)
    values, unmapped = got.values, got.unmapped
    # slime writes TensorBoard logs only when told (--use-tensorboard); rlpost by default
    values.setdefault("tracking.tensorboard", False)
    if values.get("tracking.wandb.enabled") and "tracking.wandb.mode" not in values:
        # slime's unset --wandb-mode leaves wandb its own: WANDB_MODE, else online (rlpost's
        # default is offline)
        mode = launch.env.get("WANDB_MODE", "online")
        if mode in ("online", "offline"):
            values["tracking.wandb.mode"] = mode
    if launch.entry == "train_async.py":
        values["recipe.loop.mode"] = "async"
    unmapped += _read_rollout_function(got.together, launch, values)
    given = {flag for flag, _ in flags}
    for flag, runs in FIXED_WHEN_ABSENT.items():
        if flag not in given:
            fixed = " ".join([flag, *FIXED_SETTINGS[flag]])
            why = f"not in the script, so slime runs with {runs}; rlpost always runs with {fixed}"
            unmapped.append(Unmapped(flag, (), why, "(fixed)"))
    match = _match(launch, got.model, name, values.get("model.hf_checkpoint"))
    mtp = got.model.get("--mtp-num-layers")
    if mtp is not None and not values.get("recipe.train.mtp_training"):
        why = "rlpost builds MTP layers only to train them"
        unmapped.append(Unmapped("--mtp-num-layers", tuple(mtp), why, "recipe.train.mtp_training"))
    per_node = launch.head_gpus or gpus_per_node
    hardware, hardware_file = _read_cluster(got.cluster, values, per_node)
    _read_together(got.together, values, got.sglang, unmapped, got.origins)
    if values.get("recipe.rollout.num_rollout") == 0:
        unmapped.append(_evaluation_only(values, got.together.get("--load")))
    config = got.together.get("--eval-config")
    for i, dataset in enumerate(values.get("recipe.eval.datasets") or []):
        if config and isinstance(dataset, dict):
            where = f"--eval-config {config[0]}, its set {dataset.get('name')!r}"
            got.origins[f"recipe.eval.datasets.{i}"] = Origin(where)
    unmapped += _sets_never_evaluated(got.together, values)
    unmapped += _read_reward_url(values, got.origins)
    if got.sglang:
        values["layout.rollout.sglang"] = got.sglang
    _layout_defaults(values, match.model)
    model_name, model_file = _model_file(match, values, name)
    return Imported(
        name,
        model_name,
        hardware,
        values,
        unmapped,
        list(launch.not_run),
        model_file,
        hardware_file,
        # what the export writes into every job itself comes back out: not dropped
        environment=[
            (k, v, environment_note(k)) for k, v in launch.env.items() if RUNTIME_ENV.get(k) != v
        ],
        model_notes=list(match.differences),
        cluster_notes=_cluster_notes(launch),
        origins=got.origins,
    )


def _read_reward_url(values: dict[str, Any], origins: dict[str, Origin]) -> list[Unmapped]:
    """slime posts to --rm-url only for --rm-type remote_rm (and evaluation sets of that type);
    its custom reward functions get it in `args` to use as they like. rlpost's reward server
    serves type remote alone, and its functions take the sample alone: otherwise the URL is
    listed, not imported (rlpost refuses a URL nothing reads)."""
    key = "recipe.rollout.reward.remote_url"
    url = values.get(key)
    if url is None:
        return []
    function = values.get("recipe.rollout.reward.custom_function")
    remote = values.get("recipe.rollout.reward.type") == "remote" and not function
    sets = values.get("recipe.eval.datasets") or []
    if remote or any(isinstance(d, dict) and d.get("reward_type") == "remote" for d in sets):
        return []
    del values[key]
    origins.pop(key, None)
    why = (
        f"slime hands it to --custom-rm-path's function ({function}) in args; rlpost's reward "
        "functions take the sample alone: give the function its URL itself"
        if function
        else "slime posts to it only for --rm-type remote_rm, which the script does not give"
    )
    return [Unmapped("--rm-url", (str(url),), why, key)]


def _sets_never_evaluated(together: dict[str, list[str]], values: dict[str, Any]) -> list[Unmapped]:
    """slime's train.py evaluates, before training too, only with --eval-interval: without
    it the sets a script names are never evaluated, and rlpost would evaluate them once
    before training. They are not imported, so the run evaluates nothing, as slime's."""
    if "recipe.eval.interval" in values or values.get("mode") == "eval":
        return []
    if not values.pop("recipe.eval.datasets", None):
        return []
    flag = "--eval-config" if "--eval-config" in together else "--eval-prompt-data"
    why = "slime evaluates only with --eval-interval, which the script leaves unset"
    return [Unmapped(flag, tuple(together[flag]), why, "recipe.eval.interval")]


def _evaluation_only(values: dict[str, Any], load: list[str] | None) -> Unmapped:
    """slime's --num-rollout 0: its train.py evaluates the loaded weights once and trains
    nothing. That is rlpost's mode=eval: the weights --load names (model.load), evaluated in
    a run directory of its own; the recipe still needs a num_rollout, which mode=eval does
    not read."""
    values["mode"] = "eval"
    values["recipe.rollout.num_rollout"] = 1
    values.pop("run.dir", None)
    if load:
        values["model.load"] = load[0]
    why = (
        "slime evaluates the loaded weights once and trains nothing: the launch is mode=eval "
        "(the recipe's num_rollout is 1, which mode=eval does not read)"
    )
    return Unmapped("--num-rollout", ("0",), why, "mode")


def _read_rollout_function(
    together: dict[str, list[str]], launch: Launch, values: dict[str, Any]
) -> list[Unmapped]:
    """slime's fully-async rollout is rlpost's fully_async loop, with two differences said;
    any other whole-rollout function is not imported."""
    function = together.get("--rollout-function-path")
    if not function:
        return []
    flag, given = "--rollout-function-path", tuple(function)
    if function[0] == SLIME_FULLY_ASYNC and launch.entry == "train_async.py":
        values["recipe.loop.mode"] = "fully_async"
        why = (
            "imported as loop.mode fully_async, which differs from slime's in two ways: slime "
            "bounds no policy lag (rlpost trains a token at most max_staleness versions old, "
            "null: 4), and regenerates a group a weight update interrupts, where rlpost pauses "
            "and continues it"
        )
        return [Unmapped(flag, given, why, "recipe.loop.max_staleness")]
    why = (
        "a whole rollout function of slime's (args, rollout_id, data_source): rlpost's loop "
        "generates, and takes a per-sample generate function"
    )
    return [Unmapped(flag, given, why, "recipe.rollout.generate_function")]


def _match(
    launch: Launch, model_flags: dict[str, list[str]], name: str, checkpoint: Any = None
) -> ModelMatch:
    """The model MODEL_ARGS describe; the sourced model script names a drawn one, else the
    --hf-checkpoint folder (/root/Qwen3-32B: qwen3-32b, as an exported script, whose
    MODEL_ARGS are written out, says it), else the script."""
    sourced = [Path(s).stem for s in launch.sourced]
    hint = next((SLIME_MODEL_SCRIPTS[s] for s in sourced if s in SLIME_MODEL_SCRIPTS), None)
    folder = _config_name(Path(checkpoint).name) if isinstance(checkpoint, str) else ""
    drawn_name = next((s.lower() for s in sourced), folder or f"{name}-model")
    if drawn_name in shipped_models():  # a network of its own: never a shipped model's name
        drawn_name = f"{drawn_name}-{name}"
    if not model_flags:
        missing = [c.removeprefix("source ") for c in launch.not_run if c.startswith("source ")]
        raise UserError(
            [
                Issue(
                    "MODEL_ARGS",
                    f"{launch.script} gives train.py no model architecture flags"
                    + (f" (not found: {', '.join(missing)})" if missing else ""),
                    "give --slime-dir <a slime checkout> so that the model script it sources "
                    "is read",
                    str(launch.script),
                )
            ],
            title="import error",
        )
    return match_model(model_flags, hint, drawn_name, str(launch.script))


def _config_name(text: str) -> str:
    """`text` as a config file's name: lower case, letters, digits, '.', '_' and '-' ('' for
    nothing left)."""
    return re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-.")


def _other(flag: str, vals: list[str], sglang: dict[str, Any]) -> list[Unmapped]:
    """A flag of no rlpost key: an SGLang option (into `sglang`), one held at rlpost's fixed
    value, or one not imported (returned, with the reason)."""
    if flag in NOT_IMPORTED:
        reason, nearest = NOT_IMPORTED[flag]
        return [Unmapped(flag, tuple(vals), reason, nearest)]
    if flag in slime_sglang_flags():
        option = slime_sglang_flags()[flag]  # whichever spelling, SGLang's option name
        if option in load_sglang_options().options:
            sglang[option] = True if not vals else (one(vals) if len(vals) == 1 else many(vals))
            return []
        why = (
            f"sglang {load_sglang_options().version}, which rlpost's engines run, has no "
            f"option '{option}' any more"
        )
        return [Unmapped(flag, tuple(vals), why, "layout.rollout.sglang")]
    if flag in FIXED_SETTINGS:
        if vals == FIXED_SETTINGS[flag]:
            return []
        fixed = f"rlpost always runs with {flag} {' '.join(FIXED_SETTINGS[flag])}".strip()
        return [Unmapped(flag, tuple(vals), fixed, "(fixed)")]
    if flag.startswith("--sglang-"):
        why = (
            f"sglang {SGLANG_VERSION}, which slime runs, has no such flag: slime drops it "
            "without a word"
        )
        return [Unmapped(flag, tuple(vals), why, "layout.rollout.sglang")]
    if flag in READ_NOT_DEFINED:
        reason, nearest = READ_NOT_DEFINED[flag]
        return [Unmapped(flag, tuple(vals), reason, nearest)]
    why = "not a slime or Megatron flag rlpost reads"
    return [Unmapped(flag, tuple(vals), why, nearest_key(flag))]


def _cluster_notes(launch: Launch) -> list[str]:
    notes = []
    if launch.head_gpus is not None:
        notes.append(
            f"Ray head started with --num-gpus {launch.head_gpus} (hardware.gpus_per_node)"
        )
    notes += [f"Ray worker: {w}" for w in launch.workers]
    return notes


def _model_file(
    match: ModelMatch, values: dict[str, Any], name: str
) -> tuple[str, dict[str, Any] | None]:
    """The shipped model; a copy of it with the script's checkpoint paths; or the model drawn
    from MODEL_ARGS (with those paths)."""
    shipped = yaml.safe_load((CONF_DIR / "model" / f"{match.base}.yaml").read_text())
    data = match.model.model_dump(exclude_defaults=True) if match.drawn else dict(shipped)
    changed = dict(data)
    for key in [k for k in values if k.startswith("model.")]:
        changed[key.removeprefix("model.")] = values.pop(key)
    if not match.drawn and changed == shipped:
        return match.base, None
    model = match.model.name if match.drawn else f"{match.base}-{name}"
    return model, {**changed, "name": model}


def _read_cluster(
    cluster: dict[str, list[str]], values: dict[str, Any], gpus_per_node: int
) -> tuple[str, dict[str, Any] | None]:
    """GPUs from the cluster flags; GPUs per node from --num-gpus-per-node, else what the
    script gave Ray's head, else the stated default."""
    nodes = int(cluster.get("--actor-num-nodes", ["1"])[0])
    per_node = int(cluster.get("--actor-num-gpus-per-node", ["8"])[0])
    gpus_per_node = int(cluster.get("--num-gpus-per-node", [str(gpus_per_node)])[0])
    train = nodes * per_node
    colocate = "--colocate" in cluster
    values["layout.colocate"] = colocate
    values["layout.train.num_gpus"] = train
    total = train
    if not colocate:
        rollout = int(cluster.get("--rollout-num-gpus", ["0"])[0])
        values["layout.rollout.num_gpus"] = rollout
        total += rollout
    return _hardware(total, gpus_per_node)


def _read_together(
    together: dict[str, list[str]],
    values: dict[str, Any],
    sglang: dict[str, Any],
    unmapped: list[Unmapped],
    origins: dict[str, Origin],
) -> None:
    save, load = together.get("--save"), together.get("--load")
    if save:
        run_dir = save[0].rstrip("/")
        if run_dir.endswith(f"/{SLIME_CKPT_DIR}") or run_dir == SLIME_CKPT_DIR:
            run_dir = run_dir.removesuffix(SLIME_CKPT_DIR).rstrip("/")
        values["run.dir"] = None if run_dir in ("", ".") else run_dir
    if load and (not save or load[0].rstrip("/") != save[0].rstrip("/")):
        values["model.load"] = load[0]
    # each set's keys that a set or an --eval-config default names none of (slime: the
    # --eval-*-key flag, else training's --input-key, --label-key, --tool-key)
    set_keys = {key: together[flag][0] for key, flag in EVAL_KEY_FLAGS if flag in together}
    data, config = together.get("--eval-prompt-data"), together.get("--eval-config")
    if config:
        unmapped += read_eval_config(config[0], values, origins, set_keys)
        if data:
            why = "slime reads the sets from the --eval-config file and ignores this flag"
            nearest = "recipe.eval.datasets"
            unmapped.append(Unmapped("--eval-prompt-data", tuple(data), why, nearest))
    elif data:
        pairs = [{"name": data[i], "path": data[i + 1]} for i in range(0, len(data) - 1, 2)]
        values["recipe.eval.datasets"] = [{**pair, **set_keys} for pair in pairs]
    steps = together.get("--num-steps-per-rollout")
    if steps and "recipe.train.global_batch_size" not in values:
        # slime: rollout_batch_size * n_samples_per_prompt // num_steps_per_rollout
        prompts = int(values.get("recipe.rollout.batch_size", 0))
        samples = int(values.get("recipe.rollout.n_samples_per_prompt", 1))
        values["recipe.train.global_batch_size"] = prompts * samples // int(steps[0])
    concurrency = together.get("--sglang-server-concurrency")
    if concurrency:
        rollout = values.get("layout.rollout.num_gpus") or values["layout.train.num_gpus"]
        engines = max(1, rollout // int(values.get("layout.rollout.gpus_per_engine", 1)))
        values["recipe.rollout.max_concurrency"] = int(concurrency[0]) * engines
    unmapped += _read_offload(together, bool(values.get("layout.colocate")))
    unmapped += _read_health_checks(together, values)
    unmapped += _read_save_hf(together, values)
    context = together.get("--rollout-max-context-len")
    if context and "recipe.data.max_prompt_len" not in values:
        # slime: rollout_max_prompt_len = rollout_max_context_len - 1 when unset, so that
        # at least one token is generated
        values["recipe.data.max_prompt_len"] = int(context[0]) - 1


EVAL_SET_KEYS = {  # slime's eval config -> rlpost's eval dataset
    "name": "name",
    "path": "path",
    "input_key": "input_key",
    "label_key": "label_key",
    "tool_key": "tool_key",
    "rm_type": "reward_type",
    "custom_rm_path": "custom_reward_function",
    "n_samples_per_eval_prompt": "n_samples_per_prompt",
    "max_response_len": "max_response_len",
}
EVAL_DEFAULT_KEYS = {  # slime's eval config defaults -> recipe.eval
    "n_samples_per_eval_prompt": "recipe.eval.n_samples_per_prompt",
    "max_response_len": "recipe.eval.max_response_len",
    "temperature": "recipe.eval.temperature",
    "top_p": "recipe.eval.top_p",
    "top_k": "recipe.eval.top_k",
    "custom_rm_path": "recipe.eval.custom_reward_function",
}
EVAL_SET_KEY_DEFAULTS = ("input_key", "label_key", "tool_key")  # every set's without its own
EVAL_KEY_FLAGS = (
    ("input_key", "--eval-input-key"),
    ("label_key", "--eval-label-key"),
    ("tool_key", "--eval-tool-key"),
)


def read_eval_config(
    path: str,
    values: dict[str, Any],
    origins: dict[str, Origin],
    flag_keys: dict[str, str] | None = None,
) -> list[Unmapped]:
    """slime's --eval-config file (`eval: {defaults: ..., datasets: [...]}`, or the mapping
    itself; datasets a list or a mapping by name) as recipe.eval: each set's keys, reward type,
    reward function, sample count and response length, and the defaults rlpost keeps for
    every set (each default's origin recorded in `origins`). A set's key is its own, else the
    defaults', else the --eval-*-key flag's (`flag_keys`), as slime's eval_config.py resolves
    it; a key null in the file reads nothing (label_key, tool_key: false). What else a set or
    the defaults give is listed, not imported."""
    flag = "--eval-config"
    try:
        loaded = yaml.safe_load(Path(path).expanduser().read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        why = f"the file cannot be read here ({type(exc).__name__}): copy its sets into the recipe"
        return [Unmapped(flag, (path,), why, "recipe.eval.datasets")]
    section = loaded.get("eval", loaded) if isinstance(loaded, dict) else None
    raw = section.get("datasets") if isinstance(section, dict) else None
    if isinstance(raw, dict):
        raw = [{"name": name, **(entry or {})} for name, entry in raw.items()]
    if not isinstance(raw, list) or not raw or not all(isinstance(e, dict) for e in raw):
        why = "the file lists no evaluation sets under eval.datasets"
        return [Unmapped(flag, (path,), why, "recipe.eval.datasets")]
    unmapped: list[Unmapped] = []
    defaults = (section or {}).get("defaults") or {}
    for key, value in defaults.items():
        if key in EVAL_DEFAULT_KEYS:
            target = EVAL_DEFAULT_KEYS[key]
            values[target] = hook_path(str(value)) if key == "custom_rm_path" else value
            where = f"{flag} {path} defaults.{key}"
            origins[target] = _default_origin(where, value, origins.get(target))
        elif key in EVAL_SET_KEY_DEFAULTS:
            continue  # onto each set below
        else:
            why = "rlpost's evaluation has no such setting"
            unmapped.append(Unmapped(f"{flag} defaults.{key}", (str(value),), why, "recipe.eval"))
    datasets = []
    training = values.get("recipe.rollout.reward.custom_function")
    evaluation = values.get("recipe.eval.custom_reward_function")
    for entry in raw:
        keys = {k: defaults[k] for k in EVAL_SET_KEY_DEFAULTS if k in defaults}
        in_set = set(entry)
        entry = {**(flag_keys or {}), **keys, **entry}
        dataset = {ours: entry[theirs] for theirs, ours in EVAL_SET_KEYS.items() if theirs in entry}
        if "input_key" in dataset and dataset["input_key"] is None:
            name = entry.get("name", "?")
            raise UserError([_no_prompt_key(path, name, in_set)], title="import error")
        for key in ("label_key", "tool_key"):
            if key in dataset and dataset[key] is None:
                dataset[key] = False  # slime reads none; rlpost's null inherits the data's
        if dataset.get("custom_reward_function") is not None:
            dataset["custom_reward_function"] = hook_path(str(dataset["custom_reward_function"]))
        reward = dataset.get("reward_type")
        where = f"{flag} {entry.get('name', '?')}"
        # slime scores a set with the first of its own custom_rm_path, the defaults' and
        # --custom-rm-path, before any rm_type
        own = dataset.get("custom_reward_function") or evaluation
        if reward is not None and (own or training):
            # rlpost refuses a set's reward_type beside its own function, and grades a set
            # by it over training's function: either way the scores would change
            del dataset["reward_type"]
            scorer = (
                f"the set's custom_rm_path ({own})"
                if dataset.get("custom_reward_function")
                else f"the defaults' custom_rm_path ({own})"
                if own
                else f"--custom-rm-path ({training})"
            )
            why = (
                f"slime scores the set's every sample with {scorer} before any rm_type, so the "
                "set's rm_type grades nothing there; imported as it runs, the set is scored "
                "by the custom function (give it a reward_type alone to grade it so)"
            )
            unmapped.append(Unmapped(f"{where}.rm_type", (str(reward),), why, "recipe.eval"))
        elif reward is not None:
            dataset["reward_type"] = REWARDS_FROM_SLIME.get(reward, reward)
        for key in sorted(set(entry) - set(EVAL_SET_KEYS)):
            why = "rlpost sets it for every evaluation set, or has no such setting"
            unmapped.append(Unmapped(f"{where}.{key}", (str(entry[key]),), why, "recipe.eval"))
        datasets.append(dataset)
    values["recipe.eval.datasets"] = datasets
    return unmapped


def _no_prompt_key(path: str, name: str, in_set: set[str]) -> Issue:
    """A set whose input_key is null in slime's eval config: a null there is a value (the
    set's own, else the defaults'), so neither --eval-input-key nor --input-key fills it in,
    and slime reads every prompt of the set as the row's None field (data.get(None) in its
    Dataset), which its chat template or tokenizer then stops on at the first evaluation."""
    given = "the set's input_key" if "input_key" in in_set else "the file's defaults.input_key"
    return Issue(
        f"--eval-config {path} datasets.{name}.input_key",
        f"{given} is null, which slime reads as a value: the set's prompts are the rows' "
        "None field (data.get(None)), so slime's evaluation of the set stops on prompts with "
        "no text; rlpost's null would read training's field instead, which slime never does",
        "name the field holding the set's prompts (input_key: prompt), or remove the key so "
        "that the set reads --eval-input-key, else --input-key",
        "null",
        Location(file=path),
    )


def _default_origin(source: str, value: Any, flag: Origin | None) -> Origin:
    """An --eval-config default's origin. slime resolves each set's setting as the set's own
    value, else the file's defaults, else the flag (its eval_config.py), so a default wins
    over the flag that set the same key; the origin names that flag too."""
    if flag is None:
        return Origin(source, str(value))
    beside = (
        f"{flag.source} {flag.value} in the script sets it too: slime takes the "
        "--eval-config file's default over the flag, as the import did, and reads the "
        "flag only where the file sets no default"
    )
    return Origin(source, str(value), beside)


def _read_offload(together: dict[str, list[str]], colocate: bool) -> list[Unmapped]:
    """slime offloads the trainer and the engines of a colocated run unless told not to, and
    a decoupled run's only when told to; rlpost offloads a colocated GPU run's both, always
    (training counts on the engines' memory), and a decoupled run's never."""
    given = [flag for flag in together if flag in OFFLOAD_FLAGS]
    if "--offload" in together:
        train = rollout = True
    else:
        train = _offload_switch(together, "train", colocate)
        rollout = _offload_switch(together, "rollout", colocate)
    if (train, rollout) == (colocate, colocate):
        return []
    if colocate:
        why = (
            "rlpost offloads a colocated run's trainer and engines around every training "
            "step: training counts on the memory the engines release"
        )
        return [Unmapped(flag, tuple(together[flag]), why, "engine.offload") for flag in given]
    why = "the engines have GPUs of their own (no --colocate): rlpost offloads only colocated runs"
    return [Unmapped(flag, tuple(together[flag]), why, "layout.colocate") for flag in given]


def _offload_switch(together: dict[str, list[str]], part: str, default: bool) -> bool:
    if f"--offload-{part}" in together:
        return True
    return False if f"--no-offload-{part}" in together else default


def _read_health_checks(together: dict[str, list[str]], values: dict[str, Any]) -> list[Unmapped]:
    """Health-check settings count only with fault tolerance, in slime as in rlpost; slime
    waits no grace period unless told to, rlpost five minutes."""
    given = {flag: vals for flag, vals in together.items() if flag in HEALTH_CHECK_FLAGS}
    if not values.get("engine.fault_tolerance"):
        why = "slime checks engines' health only with --use-fault-tolerance: it does nothing here"
        return [
            Unmapped(flag, tuple(v), why, "engine.fault_tolerance") for flag, v in given.items()
        ]
    given.setdefault("--rollout-health-check-first-wait", ["0"])
    for flag, vals in given.items():
        values[HEALTH_CHECK_FLAGS[flag]] = float(vals[0])
    return []


def _read_save_hf(together: dict[str, list[str]], values: dict[str, Any]) -> list[Unmapped]:
    """slime writes an HF folder at every checkpoint save when --save-hf names a path."""
    path = together.get("--save-hf")
    if not path:
        return []
    interval = values.get("recipe.save.interval")
    if interval is None:
        why = "slime writes it at each checkpoint save, and --save-interval is unset"
        return [Unmapped("--save-hf", tuple(path), why, "recipe.save.save_hf_interval")]
    values["recipe.save.save_hf_interval"] = interval
    return []


def _layout_defaults(values: dict[str, Any], model: ModelConfig) -> None:
    """What Megatron and slime assume for flags a script leaves out: no parallelism, no
    recompute, engines of one GPU, the allgather dispatcher, SGLang's own memory fraction."""
    for size in ("tp", "pp", "cp", "ep", "etp"):
        values.setdefault(f"layout.train.{size}", 1)
    values.setdefault("layout.train.sequence_parallel", False)
    if values["layout.train.tp"] == 1:
        # Megatron's validate_args turns it off without tensor parallelism (megatron_rules, 912)
        values["layout.train.sequence_parallel"] = False
    values.setdefault("layout.train.recompute.granularity", "none")
    if values["layout.train.recompute.granularity"] != "full":
        values.pop("layout.train.recompute.method", None)
        values.pop("layout.train.recompute.num_layers", None)
    values.setdefault("layout.rollout.gpus_per_engine", 1)
    if model.moe is not None:
        values.setdefault("layout.train.moe_token_dispatcher_type", "allgather")
    if "recipe.eval.interval" not in values:
        values["recipe.eval.interval"] = None
