"""slime's train.py arguments -> rlpost's model, recipe, hardware and layout YAML.

The inverse of `mode=slime_args` (rlpost.plan.slime_args): every flag is either mapped to the
config key it sets (`FLAGS`, the table the README's "Coming from slime" section prints), read
together with others (the cluster, model architecture, checkpoint, evaluation and SGLang
flags), or listed as not imported with the reason and the nearest rlpost key. A flag absent
from the script takes slime's (or Megatron's) default, as it would in slime.

    result = import_slime(Path("scripts/run-glm4-9B.sh"), slime_dir=None)
    result.write(Path("imported"))   # recipe/, layout/ (and model/, hardware/ when needed)
"""

from __future__ import annotations

import functools
import json
import math
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

from rlpost.config.sglang_options import load_sglang_options
from rlpost.config.sources import CONF_DIR
from rlpost.errors import Issue, UserError
from rlpost.interop.bash_script import Script, read_script
from rlpost.plan.model_args import model_args
from rlpost.plan.slime_args import (
    SGLANG_VERSION,
    SLIME_CKPT_DIR,
    SLIME_HOOKS,
    SLIME_REWARD_TYPES,
    slime_sglang_flags,
)
from rlpost.schema import ModelConfig

# slime's scripts/models/<name>.sh -> rlpost's conf/model/<name>.yaml
SLIME_MODEL_SCRIPTS = {
    "glm4-9B": "glm4-9b",
    "qwen3-4B": "qwen3-4b",
    "qwen3-8B": "qwen3-8b",
    "qwen3-0.6B": "qwen3-0.6b",
    "qwen3-1.7B": "qwen3-1.7b",
    "qwen3-30B-A3B": "qwen3-30b-a3b",
    "glm4.5-355B-A32B": "glm4.5-355b-a32b",
    "glm4.7-30B-A3B": "glm4.7-flash",
    "llama3.1-8B": "llama3.1-8b",
    "deepseek-v3": "deepseek-v3",
}

Values = list[str]


@dataclass(frozen=True)
class FlagRule:
    """One slime flag and the rlpost key it sets; `read` turns its values into the value."""

    flag: str
    key: str
    read: Callable[[Values], Any]
    note: str = ""


def _on(values: Values) -> bool:
    return True


def _off(values: Values) -> bool:
    return False


def _one(values: Values) -> Any:
    return yaml.safe_load(values[0]) if values else None


def _text(values: Values) -> str:
    return values[0]


def _many(values: Values) -> list[Any]:
    return [yaml.safe_load(v) for v in values]


def _texts(values: Values) -> list[str]:
    return list(values)


_HOOKS_BACK = {slime: ours for ours, slime in SLIME_HOOKS.items()} | {
    # older slime scripts name the buffer filter slime applies by default
    "slime.rollout.filter_hub.buffer_filters.pop_first": "rlpost.filters.pop_first",
}
_REWARDS_BACK = {slime: ours for ours, slime in SLIME_REWARD_TYPES.items()}


def _hook(values: Values) -> str:
    return _HOOKS_BACK.get(values[0], values[0])


FLAGS: tuple[FlagRule, ...] = (
    # data and rollout
    FlagRule("--prompt-data", "recipe.data.prompt_data", _text),
    FlagRule("--input-key", "recipe.data.input_key", _text),
    FlagRule("--label-key", "recipe.data.label_key", _text),
    FlagRule("--metadata-key", "recipe.data.metadata_key", _text),
    FlagRule("--apply-chat-template", "recipe.data.apply_chat_template", _on),
    FlagRule(
        "--apply-chat-template-kwargs",
        "recipe.data.apply_chat_template_kwargs",
        lambda v: json.loads(v[0]),
    ),
    FlagRule("--rollout-shuffle", "recipe.data.shuffle", _on),
    FlagRule("--rollout-seed", "recipe.data.seed", _one),
    FlagRule("--rollout-max-prompt-len", "recipe.data.max_prompt_len", _one),
    FlagRule("--rm-type", "recipe.rollout.reward.type", lambda v: _REWARDS_BACK.get(v[0], v[0])),
    FlagRule("--custom-rm-path", "recipe.rollout.reward.custom_function", _hook),
    FlagRule("--rm-url", "recipe.rollout.reward.remote_url", _text),
    FlagRule("--group-rm", "recipe.rollout.reward.group", _on),
    FlagRule("--num-rollout", "recipe.rollout.num_rollout", _one),
    FlagRule("--rollout-batch-size", "recipe.rollout.batch_size", _one),
    FlagRule("--n-samples-per-prompt", "recipe.rollout.n_samples_per_prompt", _one),
    FlagRule("--rollout-max-response-len", "recipe.rollout.max_response_len", _one),
    FlagRule("--rollout-temperature", "recipe.rollout.temperature", lambda v: float(v[0])),
    FlagRule("--rollout-top-p", "recipe.rollout.top_p", lambda v: float(v[0])),
    FlagRule("--rollout-top-k", "recipe.rollout.top_k", _one),
    FlagRule("--rollout-stop", "recipe.rollout.stop", _texts),
    FlagRule("--rollout-stop-token-ids", "recipe.rollout.stop_token_ids", _many),
    FlagRule("--rollout-skip-special-tokens", "recipe.rollout.skip_special_tokens", _on),
    FlagRule("--over-sampling-batch-size", "recipe.rollout.over_sampling_batch_size", _one),
    FlagRule("--dynamic-sampling-filter-path", "recipe.rollout.dynamic_sampling_filter", _hook),
    FlagRule("--partial-rollout", "recipe.rollout.partial_rollout", _on),
    FlagRule(
        "--mask-offpolicy-in-partial-rollout",
        "recipe.rollout.mask_offpolicy_in_partial_rollout",
        _on,
    ),
    FlagRule("--buffer-filter-path", "recipe.rollout.buffer_filter", _hook),
    FlagRule("--update-weights-interval", "recipe.loop.update_weights_interval", _one),
    FlagRule("--global-batch-size", "recipe.train.global_batch_size", _one),
    FlagRule("--balance-data", "recipe.train.balance_data", _on),
    FlagRule("--micro-batch-size", "recipe.train.micro_batch_size", _one),
    FlagRule("--use-dynamic-batch-size", "recipe.train.use_dynamic_batch_size", _on),
    FlagRule("--max-tokens-per-gpu", "recipe.train.max_tokens_per_gpu", _one),
    FlagRule("--enable-mtp-training", "recipe.train.mtp_training", _on),
    FlagRule("--mtp-loss-scaling-factor", "recipe.train.mtp_loss_scaling_factor", _one),
    # evaluation (--eval-prompt-data and the per-dataset keys are read together)
    FlagRule("--eval-interval", "recipe.eval.interval", _one),
    FlagRule("--n-samples-per-eval-prompt", "recipe.eval.n_samples_per_prompt", _one),
    FlagRule("--eval-max-response-len", "recipe.eval.max_response_len", _one),
    FlagRule("--eval-temperature", "recipe.eval.temperature", lambda v: float(v[0])),
    FlagRule("--eval-top-p", "recipe.eval.top_p", lambda v: float(v[0])),
    FlagRule("--eval-top-k", "recipe.eval.top_k", _one),
    FlagRule("--skip-eval-before-train", "recipe.eval.skip_before_train", _on),
    # the algorithm
    FlagRule("--advantage-estimator", "recipe.algo.advantage_estimator", _text),
    FlagRule("--use-kl-loss", "recipe.algo.use_kl_loss", _on),
    FlagRule("--kl-loss-coef", "recipe.algo.kl_loss_coef", lambda v: float(v[0])),
    FlagRule("--kl-loss-type", "recipe.algo.kl_loss_type", _text),
    FlagRule("--kl-coef", "recipe.algo.kl_coef", lambda v: float(v[0])),
    FlagRule("--entropy-coef", "recipe.algo.entropy_coef", lambda v: float(v[0])),
    FlagRule("--eps-clip", "recipe.algo.eps_clip", lambda v: float(v[0])),
    FlagRule("--eps-clip-high", "recipe.algo.eps_clip_high", lambda v: float(v[0])),
    FlagRule("--eps-clip-c", "recipe.algo.eps_clip_c", lambda v: float(v[0])),
    FlagRule("--normalize-advantages", "recipe.algo.normalize_advantages", _on),
    FlagRule("--disable-grpo-std-normalization", "recipe.algo.grpo_std_normalization", _off),
    FlagRule("--gamma", "recipe.algo.gamma", lambda v: float(v[0])),
    FlagRule("--use-tis", "recipe.algo.off_policy_correction", lambda v: "tis", "the value is tis"),
    FlagRule("--tis-clip", "recipe.algo.tis_clip_high", lambda v: float(v[0])),
    FlagRule("--tis-clip-low", "recipe.algo.tis_clip_low", lambda v: float(v[0])),
    FlagRule(
        "--calculate-per-token-loss",
        "recipe.algo.loss_reduction",
        lambda v: "token_mean",
        "the value is token_mean",
    ),
    # the optimizer
    FlagRule("--optimizer", "recipe.optim.optimizer", _text),
    FlagRule("--lr", "recipe.optim.lr", lambda v: float(v[0])),
    FlagRule("--lr-decay-style", "recipe.optim.lr_decay_style", _text),
    FlagRule("--min-lr", "recipe.optim.min_lr", lambda v: float(v[0])),
    FlagRule("--lr-warmup-iters", "recipe.optim.lr_warmup_steps", _one),
    FlagRule("--lr-decay-iters", "recipe.optim.lr_decay_steps", _one),
    FlagRule("--weight-decay", "recipe.optim.weight_decay", lambda v: float(v[0])),
    FlagRule("--adam-beta1", "recipe.optim.adam_beta1", lambda v: float(v[0])),
    FlagRule("--adam-beta2", "recipe.optim.adam_beta2", lambda v: float(v[0])),
    FlagRule("--adam-eps", "recipe.optim.adam_eps", lambda v: float(v[0])),
    FlagRule("--clip-grad", "recipe.optim.clip_grad", lambda v: float(v[0])),
    FlagRule("--optimizer-cpu-offload", "recipe.optim.cpu_offload", _on),
    FlagRule("--overlap-cpu-optimizer-d2h-h2d", "recipe.optim.overlap_cpu_optimizer_d2h_h2d", _on),
    FlagRule("--use-precision-aware-optimizer", "recipe.optim.precision_aware_optimizer", _on),
    # checkpoints
    FlagRule("--hf-checkpoint", "model.hf_checkpoint", _text),
    FlagRule("--ref-load", "model.ref_load", _text),
    FlagRule("--save-interval", "recipe.save.interval", _one),
    FlagRule("--no-save-optim", "recipe.save.save_optimizer", _off),
    # training layout
    FlagRule("--tensor-model-parallel-size", "layout.train.tp", _one),
    FlagRule("--sequence-parallel", "layout.train.sequence_parallel", _on),
    FlagRule("--pipeline-model-parallel-size", "layout.train.pp", _one),
    FlagRule("--context-parallel-size", "layout.train.cp", _one),
    FlagRule("--expert-model-parallel-size", "layout.train.ep", _one),
    FlagRule("--expert-tensor-parallel-size", "layout.train.etp", _one),
    FlagRule(
        "--decoder-first-pipeline-num-layers",
        "layout.train.num_layers_in_first_pipeline_stage",
        _one,
    ),
    FlagRule(
        "--decoder-last-pipeline-num-layers", "layout.train.num_layers_in_last_pipeline_stage", _one
    ),
    FlagRule("--recompute-granularity", "layout.train.recompute.granularity", _text),
    FlagRule("--recompute-method", "layout.train.recompute.method", _text),
    FlagRule("--recompute-num-layers", "layout.train.recompute.num_layers", _one),
    FlagRule("--moe-token-dispatcher-type", "layout.train.moe_token_dispatcher_type", _text),
    FlagRule("--moe-enable-deepep", "layout.train.moe_enable_deepep", _on),
    FlagRule("--rollout-num-gpus-per-engine", "layout.rollout.gpus_per_engine", _one),
    # run and tracking
    FlagRule("--seed", "run.seed", _one),
    FlagRule("--use-wandb", "tracking.wandb.enabled", _on),
    FlagRule("--wandb-mode", "tracking.wandb.mode", _text),
    FlagRule("--wandb-project", "tracking.wandb.project", _text),
    FlagRule("--wandb-group", "tracking.wandb.group", _text),
    FlagRule("--wandb-run-id", "tracking.wandb.run_id", _text),
    FlagRule("--use-tensorboard", "tracking.tensorboard", _on),
)
RULES = {rule.flag: rule for rule in FLAGS}

# Flags read together with others (see the functions that read them), for the README table.
READ_TOGETHER: dict[str, tuple[str, str]] = {
    "--actor-num-nodes": ("layout.train.num_gpus", "x --actor-num-gpus-per-node"),
    "--actor-num-gpus-per-node": ("layout.train.num_gpus", "x --actor-num-nodes"),
    "--rollout-num-gpus": ("layout.rollout.num_gpus", "decoupled (colocate: false)"),
    "--colocate": ("layout.colocate", "true"),
    "--num-gpus-per-node": ("hardware.gpus_per_node", "the hardware profile is picked by GPUs"),
    "--load": ("run.dir", "--load = --save = <run.dir>/slime/ is the run's own; else model.load"),
    "--save": ("run.dir", "<run.dir>/slime/"),
    "--eval-prompt-data": ("recipe.eval.datasets", "NAME PATH pairs"),
    "--eval-input-key": ("recipe.eval.datasets[].input_key", "every dataset"),
    "--eval-label-key": ("recipe.eval.datasets[].label_key", "every dataset"),
    "--sglang-*": ("layout.rollout.sglang.*", "SGLang's own option names"),
    "--sglang-server-concurrency": (
        "recipe.rollout.max_concurrency",
        "x the number of engines",
    ),
    "MODEL_ARGS": ("model", "matched to a shipped model, flag for flag"),
    "train_async.py": ("recipe.loop.mode", "async"),
}

# What rlpost always does, as slime's scripts spell it: accepted at exactly these values.
FIXED_SETTINGS = {
    "--attention-dropout": ["0.0"],
    "--hidden-dropout": ["0.0"],
    "--accumulate-allreduce-grads-in-fp32": [],
    "--attention-softmax-in-fp32": [],
    "--attention-backend": ["flash"],
}

# Flags rlpost has no key for: (reason, nearest rlpost key)
NOT_IMPORTED = {
    "--async-buffer-size": (
        "train_async.py keeps one rollout ahead; rlpost bounds its queue itself",
        "recipe.loop.max_buffered_groups (fully_async)",
    ),
    "--use-fault-tolerance": (
        "rlpost's engine pool always restarts dead engines",
        "engine.max_restarts",
    ),
    "--wandb-key": ("credentials come from the environment (WANDB_API_KEY)", "tracking.wandb"),
    "--sglang-log-level": ("rlpost's engine logs go to the run directory", "run.dir"),
    # slime's own --sglang-* flags (not SGLang server options)
    "--sglang-router-ip": ("rlpost starts the run's router itself", "engine.router_policy"),
    "--sglang-router-port": ("rlpost starts the run's router itself", "engine.router_policy"),
    "--sglang-router-request-timeout-secs": (
        "rlpost's router timeout is its own setting (default 3600 s)",
        "engine.request_timeout_s",
    ),
    "--sglang-config": (
        "SGLang options are part of the layout, not a separate file",
        "layout.rollout.sglang",
    ),
    "--sglang-pp-size": (
        "rlpost's engines are tensor parallel only",
        "layout.rollout.gpus_per_engine",
    ),
    "--sglang-pipeline-parallel-size": (
        "rlpost's engines are tensor parallel only",
        "layout.rollout.gpus_per_engine",
    ),
}


@dataclass(frozen=True)
class Unmapped:
    flag: str
    values: tuple[str, ...]
    reason: str
    nearest: str


@dataclass
class Imported:
    """The configs a slime script imports to, and what could not be imported."""

    name: str
    model: str  # a shipped model name, or the written model file's
    hardware: str
    values: dict[str, Any] = field(default_factory=dict)  # recipe./layout./model./run. keys
    unmapped: list[Unmapped] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    model_file: dict[str, Any] | None = None
    hardware_file: dict[str, Any] | None = None

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
        """Run-level values (run.dir, run.seed, tracking) given on the command line."""
        return [
            f"{key}={_override_text(value)}"
            for key, value in self.values.items()
            if key.startswith(("run.", "tracking."))
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


def split_flags(argv: list[str]) -> list[tuple[str, list[str]]]:
    """`--a 1 2 --b` -> [('--a', ['1', '2']), ('--b', [])]; values never start with '--'."""
    flags: list[tuple[str, list[str]]] = []
    for token in argv:
        if token.startswith("--"):
            name, eq, value = token.partition("=")
            flags.append((name, [value] if eq else []))
        elif flags:
            flags[-1][1].append(token)
    return flags


def _resolver(script: Path, slime_dir: Path | None) -> Callable[[str], str | None]:
    """`source` targets: a slime checkout's file when given, else rlpost's model table (the
    model script becomes MODEL_ARGS as rlpost would export them)."""

    def resolve(target: str) -> str | None:
        if slime_dir is not None:
            for base in (slime_dir, slime_dir / "scripts", script.parent):
                name = target.split("scripts/", 1)[-1] if "scripts/" in target else target
                for path in (base / target, base / name, Path(target)):
                    if path.is_file():
                        return path.read_text()
        stem = Path(target).stem
        ours = SLIME_MODEL_SCRIPTS.get(stem)
        if ours is None:
            return None
        tokens = [t for f in model_args(load_model(ours)) for t in f]
        return "MODEL_ARGS=(\n" + "\n".join(shlex.quote(t) for t in tokens) + "\n)\n"

    return resolve


@functools.cache
def load_model(name: str) -> ModelConfig:
    """A shipped model (read once: an import matches the script against all of them)."""
    data = yaml.safe_load((CONF_DIR / "model" / f"{name}.yaml").read_text())
    return ModelConfig.model_validate(data)


def shipped_models() -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))


# Megatron architecture flags beyond those rlpost's model table writes: a script that sets
# them describes another network than the matched model (listed as differences)
MEGATRON_ARCHITECTURE_FLAGS = frozenset(
    {
        "--mtp-num-layers",
        "--make-vocab-size-divisible-by",
        "--max-position-embeddings",
        "--seq-length",
        "--rotary-interleaved",
        "--no-rope-fusion",
        "--use-rotary-position-embeddings",
        "--no-position-embedding",
        "--moe-router-pre-softmax",
        "--moe-aux-loss-coeff",
        "--moe-router-load-balancing-type",
        "--moe-permute-fusion",
        "--bf16",
        "--fp16",
    }
)


def model_flag_names() -> set[str]:
    """Every flag rlpost's model table can produce, plus Megatron's architecture flags."""
    names = {f[0] for m in shipped_models() for f in model_args(load_model(m))}
    return names | MEGATRON_ARCHITECTURE_FLAGS


def _same(a: list[str], b: list[str]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x == y:
            continue
        try:
            if not math.isclose(float(x), float(y), rel_tol=1e-9):
                return False
        except ValueError:
            return False
    return True


def match_model(given: dict[str, list[str]], hint: str | None) -> tuple[str, list[str]]:
    """The shipped model whose MODEL_ARGS these are (the sourced script's first), and the
    flags that differ from it (empty for an exact match)."""
    candidates = shipped_models()
    if hint in candidates:
        candidates = [hint, *(c for c in candidates if c != hint)]
    best: tuple[int, str, list[str]] | None = None
    for name in candidates:
        expected = {f[0]: list(f[1:]) for f in model_args(load_model(name))}
        expected.pop("--mtp-num-layers", None)
        diffs = [
            flag
            for flag in sorted(set(expected) | set(given))
            if not _same(expected.get(flag, ["<absent>"]), given.get(flag, ["<absent>"]))
        ]
        if best is None or len(diffs) < best[0]:
            best = (len(diffs), name, diffs)
        if not diffs:
            break
    assert best is not None
    return best[1], best[2]


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


def import_slime(path: Path, slime_dir: Path | None = None, name: str | None = None) -> Imported:
    """Read the script and map its train.py arguments; UserError when it has none."""
    script = read_script(path, _resolver(path, slime_dir))
    if script.entry is None:
        raise UserError(
            [
                Issue(
                    "SCRIPT",
                    f"{path} runs neither train.py nor train_async.py (read: "
                    f"{len(script.skipped)} other statements)",
                    "give the slime launch script that runs training (scripts/run-*.sh)",
                    str(path),
                )
            ],
            title="import error",
        )
    flags = split_flags(script.argv)
    stem = re.sub(r"[^a-z0-9_]+", "_", (name or path.stem).lower()).strip("_")
    return _map(script, flags, stem)


def _map(script: Script, flags: list[tuple[str, list[str]]], name: str) -> Imported:
    values: dict[str, Any] = {}
    unmapped: list[Unmapped] = []
    seen: dict[str, list[str]] = {}
    model_flags: dict[str, list[str]] = {}
    model_names = model_flag_names()
    sglang: dict[str, Any] = {}
    cluster: dict[str, list[str]] = {}
    together: dict[str, list[str]] = {}
    for flag, vals in flags:
        if flag in seen and flag not in model_names:
            # argparse keeps the last: so does the import, and says so
            unmapped.append(
                Unmapped(flag, tuple(seen[flag]), "given twice: the later value counts", flag)
            )
        seen[flag] = vals
        if flag in model_names:
            model_flags[flag] = vals
        elif flag in RULES:
            try:
                values[RULES[flag].key] = RULES[flag].read(vals)
            except (ValueError, IndexError, json.JSONDecodeError) as exc:
                unmapped.append(
                    Unmapped(flag, tuple(vals), f"its value does not read: {exc}", RULES[flag].key)
                )
        elif flag in ("--actor-num-nodes", "--actor-num-gpus-per-node", "--rollout-num-gpus",
                      "--colocate", "--num-gpus-per-node"):  # fmt: skip
            cluster[flag] = vals
        elif flag in ("--load", "--save", "--eval-prompt-data", "--eval-input-key",
                      "--eval-label-key", "--sglang-server-concurrency"):  # fmt: skip
            together[flag] = vals
        elif flag in NOT_IMPORTED:
            reason, nearest = NOT_IMPORTED[flag]
            unmapped.append(Unmapped(flag, tuple(vals), reason, nearest))
        elif flag in slime_sglang_flags():
            option = slime_sglang_flags()[flag]  # whichever spelling, SGLang's option name
            if option in load_sglang_options().options:
                sglang[option] = (
                    True if not vals else (_one(vals) if len(vals) == 1 else _many(vals))
                )
            else:
                unmapped.append(
                    Unmapped(
                        flag,
                        tuple(vals),
                        f"sglang {load_sglang_options().version}, which rlpost's engines run, "
                        f"has no option '{option}' any more",
                        "layout.rollout.sglang",
                    )
                )
        elif flag in FIXED_SETTINGS:
            if vals != FIXED_SETTINGS[flag]:
                unmapped.append(
                    Unmapped(
                        flag,
                        tuple(vals),
                        f"rlpost always runs with {flag} {' '.join(FIXED_SETTINGS[flag])}".strip(),
                        "(fixed)",
                    )
                )
        elif flag.startswith("--sglang-"):
            unmapped.append(
                Unmapped(
                    flag,
                    tuple(vals),
                    f"sglang {SGLANG_VERSION}, which slime runs, has no such flag: slime drops "
                    "it without a word",
                    "layout.rollout.sglang",
                )
            )
        else:
            unmapped.append(
                Unmapped(
                    flag, tuple(vals), "not a slime or Megatron flag rlpost reads", _nearest(flag)
                )
            )
    if script.entry == "train_async.py":
        values["recipe.loop.mode"] = "async"
    hint = next((SLIME_MODEL_SCRIPTS.get(Path(s).stem) for s in script.sourced), None)
    model, diffs = match_model(model_flags, hint)
    for flag in diffs:
        unmapped.append(
            Unmapped(
                flag,
                tuple(model_flags.get(flag, [])),
                f"MODEL_ARGS differ from rlpost's {model} here",
                f"model ({model}.yaml)",
            )
        )
    mtp = model_flags.get("--mtp-num-layers")
    if mtp is not None and not values.get("recipe.train.mtp_training"):
        unmapped.append(
            Unmapped(
                "--mtp-num-layers",
                tuple(mtp),
                "rlpost builds MTP layers only to train them",
                "recipe.train.mtp_training",
            )
        )
    hardware, hardware_file = _read_cluster(cluster, values)
    _read_together(together, values, sglang, unmapped)
    if sglang:
        values["layout.rollout.sglang"] = sglang
    _layout_defaults(values, load_model(model))
    model_name, model_file = _model_file(model, values, name)
    return Imported(
        name, model_name, hardware, values, unmapped, script.skipped, model_file, hardware_file
    )


def _model_file(model: str, values: dict[str, Any], name: str) -> tuple[str, dict[str, Any] | None]:
    """The shipped model, or (checkpoint paths differ) a copy of it with the script's paths."""
    data = yaml.safe_load((CONF_DIR / "model" / f"{model}.yaml").read_text())
    changed = dict(data)
    for key in [k for k in values if k.startswith("model.")]:
        changed[key.removeprefix("model.")] = values.pop(key)
    if changed == data:
        return model, None
    return f"{model}-{name}", changed


def _nearest(flag: str) -> str:
    from difflib import get_close_matches

    names = [r.flag for r in FLAGS]
    close = get_close_matches(flag, names, n=1)
    return RULES[close[0]].key if close else "-"


def _read_cluster(
    cluster: dict[str, list[str]], values: dict[str, Any]
) -> tuple[str, dict[str, Any] | None]:
    nodes = int(cluster.get("--actor-num-nodes", ["1"])[0])
    per_node = int(cluster.get("--actor-num-gpus-per-node", ["8"])[0])
    gpus_per_node = int(cluster.get("--num-gpus-per-node", ["8"])[0])
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
) -> None:
    save, load = together.get("--save"), together.get("--load")
    if save:
        run_dir = save[0].rstrip("/")
        if run_dir.endswith(f"/{SLIME_CKPT_DIR}") or run_dir == SLIME_CKPT_DIR:
            run_dir = run_dir.removesuffix(SLIME_CKPT_DIR).rstrip("/")
        values["run.dir"] = None if run_dir in ("", ".") else run_dir
    if load and (not save or load[0].rstrip("/") != save[0].rstrip("/")):
        values["model.load"] = load[0]
    data = together.get("--eval-prompt-data")
    if data:
        pairs = [{"name": data[i], "path": data[i + 1]} for i in range(0, len(data) - 1, 2)]
        for key, flag in (("input_key", "--eval-input-key"), ("label_key", "--eval-label-key")):
            if flag in together:
                for pair in pairs:
                    pair[key] = together[flag][0]
        values["recipe.eval.datasets"] = pairs
    concurrency = together.get("--sglang-server-concurrency")
    if concurrency:
        rollout = values.get("layout.rollout.num_gpus") or values["layout.train.num_gpus"]
        engines = max(1, rollout // int(values.get("layout.rollout.gpus_per_engine", 1)))
        values["recipe.rollout.max_concurrency"] = int(concurrency[0]) * engines


def _layout_defaults(values: dict[str, Any], model: ModelConfig) -> None:
    """What Megatron and slime assume for flags a script leaves out: no parallelism, no
    recompute, engines of one GPU, the allgather dispatcher, SGLang's own memory fraction."""
    for size in ("tp", "pp", "cp", "ep", "etp"):
        values.setdefault(f"layout.train.{size}", 1)
    values.setdefault("layout.train.sequence_parallel", False)
    values.setdefault("layout.train.recompute.granularity", "none")
    if values["layout.train.recompute.granularity"] != "full":
        values.pop("layout.train.recompute.method", None)
        values.pop("layout.train.recompute.num_layers", None)
    values.setdefault("layout.rollout.gpus_per_engine", 1)
    if model.moe is not None:
        values.setdefault("layout.train.moe_token_dispatcher_type", "allgather")
    if "recipe.eval.interval" not in values:
        values["recipe.eval.interval"] = None


def flag_table() -> str:
    """The README's flag -> key table, in markdown: generated here so it cannot drift."""
    rows = [(r.flag, f"`{r.key}`", r.note) for r in FLAGS]
    rows += [(flag, f"`{key}`", note) for flag, (key, note) in READ_TOGETHER.items()]
    rows += [
        (flag, "(always)", f"rlpost runs with {' '.join([flag, *v])}")
        for flag, v in FIXED_SETTINGS.items()
    ]
    rows += [
        (flag, f"not imported: nearest `{near}`", why) for flag, (why, near) in NOT_IMPORTED.items()
    ]
    lines = ["| slime flag | rlpost key | note |", "| --- | --- | --- |"]
    lines += [f"| `{flag}` | {key} | {note} |" for flag, key, note in rows]
    return "\n".join(lines) + "\n"
