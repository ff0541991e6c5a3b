"""A slime script's MODEL_ARGS as an rlpost model: a shipped one, or one drawn from the flags.

The flags are read into a ModelConfig on the nearest shipped model of the same family (the
one whose exported flags differ least); the drawn model's own export is then compared with the
script's flags. What remains differs for one of three reasons: the flag does not change the
network (`SAME_NETWORK`, each with the Megatron-LM source that makes it so), rlpost has no
such architecture feature (the import is refused, naming it), or the flag is one rlpost has no
field for (refused the same way, naming the flag).
"""

from __future__ import annotations

import ast
import functools
import math
from dataclasses import dataclass
from typing import Any

import yaml

from rlpost.config.sources import CONF_DIR
from rlpost.errors import Issue, UserError
from rlpost.plan.model_args import model_args
from rlpost.schema import ModelConfig

SLIME_MODEL_SCRIPTS = {
    "glm4-9B": "glm4-9b",
    "qwen3-4B": "qwen3-4b",
    "qwen3-8B": "qwen3-8b",
    "qwen3-0.6B": "qwen3-0.6b",
    "qwen3-1.7B": "qwen3-1.7b",
    "qwen3-30B-A3B": "qwen3-30b-a3b",
    "glm4.5-355B-A32B": "glm4.5-355b-a32b",
    "glm4.7-30B-A3B": "glm4.7-flash",
    "llama3.1-8B-Instruct": "llama3.1-8b",
    "deepseek-v3": "deepseek-v3",
}
"""slime's scripts/models/<name>.sh -> rlpost's conf/model/<name>.yaml."""

Flags = dict[str, list[str]]

MEGATRON_DEFAULTS: Flags = {
    "--norm-epsilon": ["1e-5"],
    "--rotary-base": ["10000"],
    "--rotary-percent": ["1.0"],
    "--moe-router-num-groups": ["1"],
    "--moe-router-group-topk": ["1"],
    "--moe-router-topk-scaling-factor": ["1.0"],
    "--make-vocab-size-divisible-by": ["128"],
    "--rope-scaling-factor": ["8.0"],
}
"""What Megatron-LM's parse_args gives a flag left out (megatron/training/arguments.py), or
its equal: one router group choosing its one group routes over all experts, as no groups do
(megatron/core/transformer/moe/moe_utils.py, group_limited_topk)."""

SAME_NETWORK: dict[str, str] = {
    "--moe-permute-fusion": "a fused kernel for the token permutation: the same tokens reach "
    "the same experts (moe_utils.py, permute)",
    "--no-rope-fusion": "the unfused RoPE kernel computes the same rotation "
    "(models/common/embeddings/rope_utils.py, apply_rotary_pos_emb)",
    "--moe-router-load-balancing-type": "the kind of auxiliary loss, which "
    "--moe-aux-loss-coeff 0 leaves out (moe/router.py, apply_aux_loss)",
    "--moe-router-bias-update-rate": "the expert-bias update rate, which is 0 in both",
    "--moe-token-drop-policy": "applies only with a capacity factor, which neither sets "
    "(moe/token_dispatcher.py)",
    "--no-masked-softmax-fusion": "a kernel choice for the unfused attention path",
    "--no-position-embedding": "with RoPE no learned absolute position table is built "
    "(models/gpt/gpt_model.py, LanguageModelEmbedding with position_embedding_type rope)",
    "--use-rotary-position-embeddings": "the older spelling of --position-embedding-type rope",
    "--position-embedding-type": "rope, spelled --use-rotary-position-embeddings",
    "--bf16": "slime trains in bf16 unless told --fp16",
    "--max-position-embeddings": "RoPE builds no parameters from the context length",
    "--seq-length": "RoPE builds no parameters from the sequence length",
}
"""Flags that change neither a parameter nor the forward pass, with the reason."""

SAME_NETWORK_WITH_MLA = {
    "--kv-channels": "multi-latent attention sizes its heads by --qk-head-dim and --v-head-dim "
    "and gives TransformerEngine both (multi_latent_attention.py:111, "
    "extensions/transformer_engine.py:1274)",
    "--add-qkv-bias": "multi-latent attention's projections take no q/k/v bias; the flag is "
    "read by SelfAttention's linear_qkv only (transformer/attention.py:1278)",
}
"""Flags that multi-latent attention does not read."""

SAME_NETWORK_WITHOUT_MLA = {
    flag: "read by YaRN RoPE only, which multi-latent attention builds "
    "(models/common/embeddings/yarn_rotary_pos_embedding.py); Llama 3's RoPE scaling reads "
    "--rope-scaling-factor"
    for flag in ("--rotary-scaling-factor", "--mscale", "--mscale-all-dim")
}
"""Flags that only multi-latent attention reads."""

SAME_NETWORK_WITH_SIGMOID = {
    "--moe-router-pre-softmax": "applies only to the softmax score function; this router "
    "scores by sigmoid (moe/moe_utils.py:714, topk_routing_with_score_function)",
}
"""Flags that a sigmoid router does not read."""

FEATURES = {
    "--spec": "a layer spec of slime's own",
    "--attention-output-gate": "gated attention (a sigmoid gate on the attention output)",
    "--use-gated-attention": "gated attention (a sigmoid gate on the attention output)",
    "--apply-layernorm-1p": "zero-centred norm weights (1 + w)",
    "--moe-shared-expert-gate": "a gated shared expert",
    "--enable-experimental": "Megatron-LM's experimental features",
    "--allgather-cp": "slime's all-gather context parallelism",
}
"""Architecture features rlpost's models lack, by the flag that turns them on."""

SPECS = {
    "slime_plugins.models.glm5.glm5": "DeepSeek sparse attention (GLM-5's indexer)",
    "slime_plugins.models.qwen3_next": "gated delta-net linear attention (Qwen3-Next)",
    "slime_plugins.models.qwen3_5": "gated delta-net linear attention (Qwen3.5)",
    "slime_plugins.models.minimax_m2": "MiniMax-M2's blocks",
}

NOT_MODEL = frozenset({"--moe-token-dispatcher-type", "--attention-softmax-in-fp32"})
"""Flags slime's model scripts carry that rlpost reads as layout or always runs with (see
slime_flags)."""


@functools.cache
def load_model(name: str) -> ModelConfig:
    """A shipped model (read once: an import matches the script against all of them)."""
    data = yaml.safe_load((CONF_DIR / "model" / f"{name}.yaml").read_text())
    return ModelConfig.model_validate(data)


def shipped_models() -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))


def exported(model: ModelConfig) -> Flags:
    return {f[0]: list(f[1:]) for f in model_args(model)}


def model_flag_names() -> set[str]:
    """Every flag a model script may carry: what rlpost's model table writes, the flags that
    leave the network as it is, and the features rlpost lacks."""
    names = {flag for m in shipped_models() for flag in exported(load_model(m))}
    names |= set(SAME_NETWORK) | set(SAME_NETWORK_WITH_MLA) | set(SAME_NETWORK_WITH_SIGMOID)
    names |= set(SAME_NETWORK_WITHOUT_MLA)
    return (
        names
        | set(MEGATRON_DEFAULTS)
        | {
            *FEATURES,
            "--num-query-groups",
            "--mtp-num-layers",
            "--group-query-attention",
            "--q-lora-rank",
            "--use-rope-scaling",
            "--rope-scaling-factor",
            "--fp16",
        }
    )


def model_scripts() -> dict[str, str]:
    """scripts/models/<name>.sh as rlpost would export each shipped model, for a script that
    sources one without a slime checkout at hand."""
    import shlex

    return {
        f"{slime}.sh": "MODEL_ARGS=(\n"
        + "\n".join(f"   {shlex.join(f)}" for f in model_args(load_model(ours)))
        + "\n)\n"
        for slime, ours in SLIME_MODEL_SCRIPTS.items()
    }


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


def normalized(flags: Flags) -> Flags:
    """Defaults written out, older spellings in their current form."""
    out = {**MEGATRON_DEFAULTS, **flags}
    if "--use-rotary-position-embeddings" in out:
        out.pop("--use-rotary-position-embeddings")
        out.setdefault("--position-embedding-type", ["rope"])
    if "--num-query-groups" not in out and "--num-attention-heads" in out:
        out["--num-query-groups"] = out["--num-attention-heads"]
    out.pop("--group-query-attention", None)
    mla = "--multi-latent-attention" in out
    if not mla and "--kv-channels" not in out and "--num-attention-heads" in out:
        # Megatron's validate_args: hidden_size // num_attention_heads
        heads = int(out["--num-attention-heads"][0])
        out["--kv-channels"] = [str(int(out.get("--hidden-size", ["0"])[0]) // heads)]
    out.pop("--mtp-num-layers", None)  # the model's MTP layers are read on their own
    if "--moe-layer-freq" in out and "--num-layers" in out:
        pattern = _layer_pattern(out["--moe-layer-freq"][0], int(out["--num-layers"][0]))
        out["--moe-layer-freq"] = [str(pattern)]
    for flag in NOT_MODEL:
        out.pop(flag, None)
    return out


def differences(given: Flags, expected: Flags) -> list[str]:
    a, b = normalized(given), normalized(expected)
    return [f for f in sorted(set(a) | set(b)) if not _same(a.get(f, ["-"]), b.get(f, ["-"]))]


@dataclass(frozen=True)
class Difference:
    flag: str
    given: tuple[str, ...] | None  # None: absent from the script
    ours: tuple[str, ...] | None  # None: absent from rlpost's export
    reason: str


@dataclass(frozen=True)
class ModelMatch:
    """The model the script's MODEL_ARGS describe: `model` is shipped (`drawn` False) or
    drawn from the flags on the shipped `base`; `differences` hold only flags that leave the
    network as it is."""

    model: ModelConfig
    base: str
    drawn: bool
    differences: tuple[Difference, ...]


def _layer_pattern(text: str, num_layers: int) -> list[int]:
    """--moe-layer-freq: `1` (every layer), `[0]*3+[1]*58`, or a list."""
    if text.isdigit():
        return [1 if i % int(text) == 0 else 0 for i in range(num_layers)]
    pattern: list[int] = []
    for part in text.split("+"):
        items, _, times = part.partition("*")
        pattern += list(ast.literal_eval(items.strip())) * int(times or 1)
    return pattern


def _num(flags: Flags, flag: str, default: Any = None) -> Any:
    if flag not in flags:
        return default
    value = float(flags[flag][0])
    return int(value) if value.is_integer() and "." not in flags[flag][0] else value


def draw_model(flags: Flags, base: ModelConfig, name: str) -> ModelConfig:
    """`base` with every architecture field the flags state (Megatron's default for one left
    out); validation of the result is ModelConfig's."""
    f = normalized(flags)
    data = base.model_dump()
    for field, flag in (
        ("num_layers", "--num-layers"),
        ("hidden_size", "--hidden-size"),
        ("ffn_hidden_size", "--ffn-hidden-size"),
        ("num_attention_heads", "--num-attention-heads"),
        ("num_query_groups", "--num-query-groups"),
        ("vocab_size", "--vocab-size"),
        ("rotary_base", "--rotary-base"),
        ("rotary_percent", "--rotary-percent"),
        ("norm_epsilon", "--norm-epsilon"),
        ("max_position_embeddings", "--max-position-embeddings"),
        ("mtp_num_layers", "--mtp-num-layers"),
        ("make_vocab_size_divisible_by", "--make-vocab-size-divisible-by"),
    ):
        if flag in f:
            data[field] = _num(f, flag)
    for field, flag in (
        ("qk_layernorm", "--qk-layernorm"),
        ("add_qkv_bias", "--add-qkv-bias"),
        ("post_self_attn_layernorm", "--post-self-attn-layernorm"),
        ("post_mlp_layernorm", "--post-mlp-layernorm"),
        ("rotary_interleaved", "--rotary-interleaved"),
    ):
        data[field] = flag in f
    data["add_bias_linear"] = "--disable-bias-linear" not in f
    data["tie_word_embeddings"] = "--untie-embeddings-and-output-weights" not in f
    data["activation"] = "swiglu" if "--swiglu" in f else "gelu"
    data["params_dtype"] = "fp16" if "--fp16" in f else "bf16"
    mla = "--multi-latent-attention" in f
    # multi-latent attention reads neither (SAME_NETWORK_WITH_MLA)
    data["kv_channels"] = None if mla else _num(f, "--kv-channels")
    if data["kv_channels"] == data["hidden_size"] // data["num_attention_heads"]:
        data["kv_channels"] = base.kv_channels  # Megatron's own hidden / heads, as left out
    data["add_qkv_bias"] = data["add_qkv_bias"] and not mla
    if mla:
        _draw_mla(f, data)
    if "--use-rope-scaling" in f and data.get("rope_scaling"):
        data["rope_scaling"]["factor"] = _num(f, "--rope-scaling-factor")
    if "--num-experts" in f and data.get("moe") is not None:
        _draw_moe(f, data, base)
    data.update(name=name, description=f"drawn from a slime model script on {base.name}")
    return ModelConfig.model_validate(data)


def _draw_mla(f: Flags, data: dict[str, Any]) -> None:
    data["mla"] = {
        "q_lora_rank": _num(f, "--q-lora-rank"),
        "kv_lora_rank": _num(f, "--kv-lora-rank"),
        "qk_head_dim": _num(f, "--qk-head-dim"),
        "qk_pos_emb_head_dim": _num(f, "--qk-pos-emb-head-dim"),
        "v_head_dim": _num(f, "--v-head-dim"),
    }
    if data.get("rope_scaling") and data["rope_scaling"]["type"] == "yarn":
        yarn = data["rope_scaling"]
        yarn["factor"] = _num(f, "--rotary-scaling-factor", yarn["factor"])
        yarn["mscale"] = _num(f, "--mscale", yarn["mscale"])
        yarn["mscale_all_dim"] = _num(f, "--mscale-all-dim", yarn["mscale_all_dim"])


def _draw_moe(f: Flags, data: dict[str, Any], base: ModelConfig) -> None:
    pattern = _layer_pattern(f.get("--moe-layer-freq", ["1"])[0], data["num_layers"])
    dense = len(pattern) - len("".join(map(str, pattern)).lstrip("0"))
    if pattern != [0] * dense + [1] * (len(pattern) - dense):
        raise ValueError(f"--moe-layer-freq {pattern}: dense layers only before the MoE ones")
    shared = _num(f, "--moe-shared-expert-intermediate-size", 0)
    expert = _num(f, "--moe-ffn-hidden-size")
    data["moe"].update(
        num_experts=_num(f, "--num-experts"),
        top_k=_num(f, "--moe-router-topk"),
        expert_ffn_hidden_size=expert,
        num_shared_experts=shared // expert if shared else 0,
        shared_expert_ffn_hidden_size=shared,
        first_k_dense_layers=dense,
        router_score=f.get("--moe-router-score-function", ["softmax"])[0],
        router_expert_bias="--moe-router-enable-expert-bias" in f,
        router_topk_scaling_factor=_num(f, "--moe-router-topk-scaling-factor"),
        router_dtype=f.get("--moe-router-dtype", [data["moe"]["router_dtype"]])[0],
        grouped_gemm="--moe-grouped-gemm" in f,
    )
    groups = (_num(f, "--moe-router-num-groups"), _num(f, "--moe-router-group-topk"))
    keep = base.moe is not None and base.moe.router_num_groups is not None
    if groups != (1, 1) or keep:
        data["moe"].update(router_num_groups=groups[0], router_group_topk=groups[1])


def _traits(m: ModelConfig) -> dict[str, bool]:
    """What tells rlpost's families apart: a model drawn on a base must share them."""
    return {
        "multi-latent attention": m.mla is not None,
        "mixture of experts": m.moe is not None,
        "QK norm": m.qk_layernorm,
        "q/k/v bias": m.add_qkv_bias and m.mla is None,
        "GLM-4's extra norms": m.post_mlp_layernorm,
    }


def _refuse(script: str, what: str, fix: str) -> UserError:
    return UserError([Issue("MODEL_ARGS", f"{script}: {what}", fix, script)], title="import error")


def _feature_name(flag: str, values: list[str]) -> str:
    if flag == "--spec" and values:
        return SPECS.get(values[0], f"the layer spec {'.'.join(values)}")
    return FEATURES.get(flag, f"what {flag} sets")


def match_model(flags: Flags, hint: str | None, name: str, script: str) -> ModelMatch:
    """The shipped model the flags describe, else one drawn from them; UserError naming the
    feature when rlpost's models cannot describe the network."""
    spec = flags.get("--spec")
    if spec and not (spec[0] == "slime_plugins.models.glm4"):
        raise _refuse(
            script,
            f"the model is built by --spec {' '.join(spec)}: {_feature_name('--spec', spec)}, "
            "which rlpost's models lack",
            "train this model with slime, or pick a shipped model (rlpost new model)",
        )
    for flag in FEATURES:
        if flag in flags and flag != "--spec":
            raise _refuse(
                script,
                f"{flag} turns on {FEATURES[flag]}, which rlpost's models lack",
                "train this model with slime, or pick a shipped model (rlpost new model)",
            )
    ranked = sorted(
        shipped_models(),
        key=lambda m: (m != hint, len(differences(flags, exported(load_model(m))))),
    )
    refusals: list[str] = []
    for candidate in ranked:
        base = load_model(candidate)
        try:
            drawn = draw_model(flags, base, name)
        except (ValueError, TypeError, KeyError) as exc:
            refusals.append(f"{candidate}: {str(exc).splitlines()[0]}")
            continue
        if _traits(drawn) != _traits(base):
            continue
        unexplained, same = _compare(flags, drawn)
        if unexplained:
            raise _refuse(
                script,
                "MODEL_ARGS set what rlpost's models cannot: "
                + "; ".join(f"{f} {' '.join(flags.get(f, []))}".strip() for f in unexplained),
                "train this model with slime, or give MODEL_ARGS of a shipped model",
            )
        exact = _same_network(drawn, base)
        return ModelMatch(base if exact else drawn, candidate, not exact, tuple(same))
    nearest = load_model(ranked[0])
    try:
        drawn_traits = _traits(draw_model(flags, nearest, name))
    except (ValueError, TypeError, KeyError):
        drawn_traits = {}
    near_traits = _traits(nearest)
    has = [k if v else f"no {k}" for k, v in drawn_traits.items() if v != near_traits[k]]
    qwen2 = drawn_traits.get("q/k/v bias") and not drawn_traits.get("QK norm")
    described = (
        f"{', '.join(has)}, which no rlpost family has"
        + (" (Qwen2-style attention)" if qwen2 else "")
        + f" (the nearest, {nearest.family}, has "
        + ", ".join(k if near_traits[k] else f"no {k}" for k, v in drawn_traits.items()
                    if v != near_traits[k])
        + ")"
        if has
        else "; ".join(refusals)
    )  # fmt: skip
    raise _refuse(
        script,
        f"the model has {described}",
        "train this model with slime; rlpost's families are qwen3, qwen3_moe, glm4, glm4_moe, "
        "glm4_moe_lite, llama and deepseek_v3",
    )


def _same_network(a: ModelConfig, b: ModelConfig) -> bool:
    skip = {"name", "description", "hf_checkpoint", "ref_load", "load", "save"}
    return a.model_dump(exclude=skip) == b.model_dump(exclude=skip)


def why_same_network(flag: str, model: ModelConfig) -> str | None:
    """Why this flag, given or left out, builds the same network for this model; None when
    it does not."""
    if flag in SAME_NETWORK:
        return SAME_NETWORK[flag]
    if model.mla is not None and flag in SAME_NETWORK_WITH_MLA:
        return SAME_NETWORK_WITH_MLA[flag]
    if model.mla is None and flag in SAME_NETWORK_WITHOUT_MLA:
        return SAME_NETWORK_WITHOUT_MLA[flag]
    if model.moe is not None and model.moe.router_score == "sigmoid":
        return SAME_NETWORK_WITH_SIGMOID.get(flag)
    return None


def _compare(flags: Flags, drawn: ModelConfig) -> tuple[list[str], list[Difference]]:
    """Flags whose difference from the drawn model's export changes the network, and those
    that do not (with the reason)."""
    ours = exported(drawn)
    given_n, ours_n = normalized(flags), normalized(ours)
    unexplained: list[str] = []
    same: list[Difference] = []
    for flag in differences(flags, ours):
        reason = why_same_network(flag, drawn)
        if reason is None:
            unexplained.append(flag)
            continue
        g, o = given_n.get(flag), ours_n.get(flag)
        same.append(
            Difference(flag, tuple(g) if g is not None else None, tuple(o) if o else None, reason)
        )
    return unexplained, same
