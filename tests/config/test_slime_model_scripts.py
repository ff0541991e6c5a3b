"""rlpost's exported MODEL_ARGS against slime's own scripts/models/*.sh (tests/fixtures/slime, at
624b824a): equal, or each difference explained (slime_model.why_same_network), and the
parameters both argument sets build have the same shapes, the padded vocabulary included."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from rlpost.interop.shell import evaluate_script
from rlpost.interop.slime_flags import split_flags
from rlpost.interop.slime_model import (
    MEGATRON_DEFAULTS,
    SLIME_MODEL_SCRIPTS,
    differences,
    exported,
    load_model,
    normalized,
    why_same_network,
)

MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "slime" / "scripts" / "models"
Flags = dict[str, list[str]]
Shapes = dict[str, tuple[int, ...]]


def slime_model_args(name: str, tmp_path: Path) -> Flags:
    script = tmp_path / "run.sh"
    script.write_text(f'source {MODELS / name}.sh\npython3 train.py "${{MODEL_ARGS[@]}}"\n')
    [train] = [c.words for c in evaluate_script(script).commands if "train.py" in c.words]
    return dict(split_flags(list(train[2:])))


def _int(flags: Flags, flag: str, default: int = 0) -> int:
    return int(float(flags[flag][0])) if flag in flags else default


def _attention(f: Flags, hidden: int) -> Shapes:
    heads = _int(f, "--num-attention-heads")
    if "--multi-latent-attention" in f:
        qk, pos, v = (
            _int(f, x) for x in ("--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim")
        )
        kv_rank, q_rank = _int(f, "--kv-lora-rank"), _int(f, "--q-lora-rank")
        shapes: Shapes = {
            "linear_kv_down_proj": (kv_rank + pos, hidden),
            "linear_kv_up_proj": (heads * (qk + v), kv_rank),
            "kv_layernorm": (kv_rank,),
            "linear_proj": (hidden, heads * v),
        }
        if q_rank:
            shapes |= {
                "linear_q_down_proj": (q_rank, hidden),
                "linear_q_up_proj": (heads * (qk + pos), q_rank),
                "q_layernorm": (q_rank,),
            }
        else:
            shapes["linear_q_proj"] = (heads * (qk + pos), hidden)
        return shapes
    groups = _int(f, "--num-query-groups", heads)
    head = _int(f, "--kv-channels", hidden // heads)
    bias = "--add-qkv-bias" in f or "--disable-bias-linear" not in f
    shapes = {
        "linear_qkv": ((heads + 2 * groups) * head, hidden),
        "linear_proj": (hidden, heads * head),
    }
    shapes |= {"linear_qkv.bias": ((heads + 2 * groups) * head,)} if bias else {}
    shapes |= {"q_layernorm": (head,), "k_layernorm": (head,)} if "--qk-layernorm" in f else {}
    return shapes


def megatron_shapes(f: Flags, tp: int) -> Shapes:
    """The global parameter shapes Megatron-LM's GPT model builds from these flags (one dense
    and one MoE layer stand for their kind)."""
    f = normalized(f)
    hidden, vocab = _int(f, "--hidden-size"), _int(f, "--vocab-size")
    multiple = _int(f, "--make-vocab-size-divisible-by") * tp
    padded = math.ceil(vocab / multiple) * multiple
    gate = 2 if "--swiglu" in f else 1
    shapes: Shapes = {"embedding": (padded, hidden), "final_layernorm": (hidden,)}
    if "--untie-embeddings-and-output-weights" in f:
        shapes["output_layer"] = (padded, hidden)
    attention = {f"attn.{k}": v for k, v in _attention(f, hidden).items()}
    pattern = ast.literal_eval(f["--moe-layer-freq"][0]) if "--moe-layer-freq" in f else []
    dense = {"mlp.fc1": (gate * _int(f, "--ffn-hidden-size"), hidden),
             "mlp.fc2": (hidden, _int(f, "--ffn-hidden-size"))}  # fmt: skip
    for kind in sorted(set(pattern) or {0}):
        layer: Shapes = {**attention, "input_layernorm": (hidden,), "pre_mlp_layernorm": (hidden,)}
        if kind == 0:
            layer |= dense
        else:
            experts, expert = _int(f, "--num-experts"), _int(f, "--moe-ffn-hidden-size")
            shared = _int(f, "--moe-shared-expert-intermediate-size")
            layer |= {"router": (experts, hidden),
                      "experts.fc1": (experts, gate * expert, hidden),
                      "experts.fc2": (experts, hidden, expert)}  # fmt: skip
            layer |= (
                {"router.expert_bias": (experts,)} if "--moe-router-enable-expert-bias" in f else {}
            )
            layer |= (
                {"shared.fc1": (gate * shared, hidden), "shared.fc2": (hidden, shared)}
                if shared
                else {}
            )
        for extra in ("--post-self-attn-layernorm", "--post-mlp-layernorm"):
            layer |= {extra.strip("-"): (hidden,)} if extra in f else {}
        shapes |= {f"{'moe' if kind else 'dense'}.{k}": v for k, v in layer.items()}
    count = {0: pattern.count(0), 1: pattern.count(1)} if pattern else {0: _int(f, "--num-layers")}
    shapes |= {f"layers.{kind}": (n,) for kind, n in count.items()}
    return shapes


@pytest.mark.parametrize("slime", sorted(SLIME_MODEL_SCRIPTS))
def test_model_args_equal_slimes_or_each_difference_is_explained(
    slime: str, tmp_path: Path
) -> None:
    model = load_model(SLIME_MODEL_SCRIPTS[slime])
    given = slime_model_args(slime, tmp_path)
    unexplained = [
        f for f in differences(given, exported(model)) if why_same_network(f, model) is None
    ]
    assert not unexplained, f"{slime}: {unexplained}"


@pytest.mark.parametrize("slime", sorted(SLIME_MODEL_SCRIPTS))
def test_both_argument_sets_build_the_same_parameters(slime: str, tmp_path: Path) -> None:
    model = load_model(SLIME_MODEL_SCRIPTS[slime])
    given = slime_model_args(slime, tmp_path)
    for tp in (1, 2, 4, 8):
        assert megatron_shapes(exported(model), tp) == megatron_shapes(given, tp), (slime, tp)


def test_the_padded_vocabulary_is_what_tells_glm47_flash_apart(tmp_path: Path) -> None:
    """Before make_vocab_size_divisible_by, GLM-4.7-Flash's rows padded to 128 x TP."""
    given = slime_model_args("glm4.7-30B-A3B", tmp_path)
    as_before = {k: v for k, v in given.items() if k != "--make-vocab-size-divisible-by"}
    assert megatron_shapes(as_before, 4)["embedding"] != megatron_shapes(given, 4)["embedding"]


DEFAULTED = {
    "--kv-channels": "Megatron-LM's validate_args sets hidden / heads when it is left out "
    "(training/arguments.py:814)",
    "--group-query-attention": "a switch for --num-query-groups, which both give",
    "--use-rotary-position-embeddings": "the older spelling of --position-embedding-type rope",
    "--position-embedding-type": "rope, spelled --use-rotary-position-embeddings",
}


def same(a: list[str] | None, b: list[str] | None) -> bool:
    if a is None or b is None:
        return a is b
    try:
        return len(a) == len(b) and all(float(x) == float(y) for x, y in zip(a, b, strict=True))
    except ValueError:
        return a == b


def shown(values: list[str] | None) -> str:
    text = " ".join(values) if values else "(on)"
    return text if len(text) <= 24 else text[:20] + " ..."


def difference_table(tmp_path: Path) -> str:
    """Every flag where slime's model script and rlpost's export differ, and why the network
    is the same (the README's table)."""
    lines = ["| model | flag | slime | rlpost | why the network is the same |",
             "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for slime, ours in sorted(SLIME_MODEL_SCRIPTS.items()):
        model = load_model(ours)
        given, mine = slime_model_args(slime, tmp_path), exported(model)
        raw = {f for f in set(given) | set(mine) if not same(given.get(f), mine.get(f))}
        for flag in sorted(raw - {"--attention-softmax-in-fp32", "--moe-token-dispatcher-type"}):
            a, b = (shown(v) for v in (given.get(flag), mine.get(flag)))
            a, b = (a if flag in given else "-"), (b if flag in mine else "-")
            why = why_same_network(flag, model) or DEFAULTED.get(flag)
            if why is None and flag in MEGATRON_DEFAULTS:
                why = f"Megatron-LM's default is {MEGATRON_DEFAULTS[flag][0]}"
            if why is None and flag == "--moe-layer-freq":
                why = "the same per-layer list, written otherwise"
            lines.append(f"| {ours} | `{flag}` | {a} | {b} | {why} |")
    return "\n".join(lines) + "\n"


def test_the_readme_lists_every_difference(tmp_path: Path) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert difference_table(tmp_path) in readme
