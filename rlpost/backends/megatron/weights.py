"""HF <-> megatron-core parameter names and tensor layouts.

A megatron-core parameter (named globally: layer and expert indices as in the whole model) maps
to one or more HF checkpoint tensors through a `Rule`: the HF names and a layout that says how
the HF tensors combine into the full Megatron tensor and how that is split across a
tensor-parallel group:

- replicated: identical on every rank (norms, the router);
- column / row: split along dim 0 / dim 1 (the output / input features of a linear);
- vocab: dim 0 padded to the padded vocabulary, then split (embedding, output layer);
- qkv: q, k and v interleaved per query group ([q heads of group g, k_g, v_g] for each g), so
  a dim-0 split hands each rank whole groups;
- gate_up: each rank holds [its slice of gate; its slice of up] (SwiGLU's fc1); `gate_up_fused`
  reads both from one HF tensor (GLM-4 stores gate_up_proj).

Multi-token-prediction layers (`mtp.layers.{k}`, on the last pipeline stage) map to HF layer
`num_layers + k`: their own norms and projection (enorm, hnorm, eh_proj, shared_head.norm) plus
an ordinary transformer layer's tensors. Their embedding and output head are the main model's;
an HF checkpoint may repeat them per MTP layer (`embed_tokens`, `shared_head.head`), which
`mtp_shared_source` names.

Local names (this pipeline stage's layers, this expert-parallel rank's experts) convert to
global ones with `Placement`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rlpost.schema import ModelConfig


@dataclass(frozen=True)
class Shapes:
    """What the layouts need to know about the model."""

    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    vocab_size: int
    padded_vocab_size: int

    @classmethod
    def of(cls, model: ModelConfig, padded_vocab_size: int) -> Shapes:
        return cls(
            model.num_attention_heads,
            model.num_query_groups,
            model.head_dim,
            model.vocab_size,
            padded_vocab_size,
        )


@dataclass(frozen=True)
class Layout:
    """to_full: HF tensors -> full Megatron tensor; from_full: the inverse.
    split_dim: the dim a tensor-parallel group splits (None: replicated)."""

    to_full: Callable[[Sequence[Tensor], Shapes], Tensor]
    from_full: Callable[[Tensor, Shapes], list[Tensor]]
    split_dim: int | None
    interleave: bool = False  # gate_up: each rank's shard is [gate slice; up slice]


def _single(tensors: Sequence[Tensor], shapes: Shapes) -> Tensor:
    return tensors[0]


def _as_list(full: Tensor, shapes: Shapes) -> list[Tensor]:
    return [full]


def _pad_vocab(tensors: Sequence[Tensor], shapes: Shapes) -> Tensor:
    weight = tensors[0]
    extra = shapes.padded_vocab_size - weight.shape[0]
    return torch.cat([weight, weight.new_zeros(extra, *weight.shape[1:])]) if extra else weight


def _unpad_vocab(full: Tensor, shapes: Shapes) -> list[Tensor]:
    return [full[: shapes.vocab_size]]


def _merge_qkv(tensors: Sequence[Tensor], shapes: Shapes) -> Tensor:
    groups, d = shapes.num_query_groups, shapes.head_dim
    per_group = shapes.num_attention_heads // groups
    q, k, v = (t.reshape(groups, -1, *t.shape[1:]) for t in tensors)
    assert q.shape[1] == per_group * d and k.shape[1] == d
    return torch.cat([q, k, v], dim=1).reshape(-1, *tensors[0].shape[1:])


def _split_qkv(full: Tensor, shapes: Shapes) -> list[Tensor]:
    groups, d = shapes.num_query_groups, shapes.head_dim
    q_rows = shapes.num_attention_heads // groups * d
    grouped = full.reshape(groups, q_rows + 2 * d, *full.shape[1:])
    q, k, v = torch.split(grouped, [q_rows, d, d], dim=1)
    return [x.reshape(-1, *full.shape[1:]).contiguous() for x in (q, k, v)]


def _cat_gate_up(tensors: Sequence[Tensor], shapes: Shapes) -> Tensor:
    return torch.cat(list(tensors))


def _split_gate_up(full: Tensor, shapes: Shapes) -> list[Tensor]:
    return [x.contiguous() for x in full.chunk(2)]


LAYOUTS: dict[str, Layout] = {
    "replicated": Layout(_single, _as_list, None),
    "column": Layout(_single, _as_list, 0),
    "row": Layout(_single, _as_list, 1),
    "vocab": Layout(_pad_vocab, _unpad_vocab, 0),
    "qkv": Layout(_merge_qkv, _split_qkv, 0),
    "gate_up": Layout(_cat_gate_up, _split_gate_up, 0, interleave=True),
    "gate_up_fused": Layout(_single, _as_list, 0, interleave=True),
}


def shard(full: Tensor, layout: Layout, rank: int, size: int) -> Tensor:
    """This rank's part of the full Megatron tensor."""
    if layout.split_dim is None or size == 1:
        return full
    if layout.interleave:
        gate, up = full.chunk(2)
        return torch.cat([gate.chunk(size)[rank], up.chunk(size)[rank]])
    return full.chunk(size, dim=layout.split_dim)[rank]


def unshard(parts: Sequence[Tensor], layout: Layout) -> Tensor:
    """The full Megatron tensor from every rank's part (rank order)."""
    if layout.split_dim is None or len(parts) == 1:
        return parts[0]
    if layout.interleave:
        halves = [p.chunk(2) for p in parts]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    return torch.cat(list(parts), dim=layout.split_dim)


@dataclass(frozen=True)
class Rule:
    hf_names: tuple[str, ...]
    layout: Layout
    expert: bool = False  # split over the expert tensor-parallel group


# (megatron suffix within a layer, HF suffix(es) within `model.layers.{i}.`, layout)
LayerTable = list[tuple[str, tuple[str, ...], str]]

ATTENTION: LayerTable = [
    ("input_layernorm.weight", ("input_layernorm.weight",), "replicated"),
    ("pre_mlp_layernorm.weight", ("post_attention_layernorm.weight",), "replicated"),
    (
        "self_attention.linear_qkv.weight",
        ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
        "qkv",
    ),
    (
        "self_attention.linear_qkv.bias",
        ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
        "qkv",
    ),
    ("self_attention.q_layernorm.weight", ("self_attn.q_norm.weight",), "replicated"),
    ("self_attention.k_layernorm.weight", ("self_attn.k_norm.weight",), "replicated"),
    ("self_attention.linear_proj.weight", ("self_attn.o_proj.weight",), "row"),
    (
        "self_attention.linear_proj.post_norm.weight",
        ("post_self_attn_layernorm.weight",),
        "replicated",
    ),
]
MLA_ATTENTION: LayerTable = [
    ("input_layernorm.weight", ("input_layernorm.weight",), "replicated"),
    ("pre_mlp_layernorm.weight", ("post_attention_layernorm.weight",), "replicated"),
    ("self_attention.linear_q_proj.weight", ("self_attn.q_proj.weight",), "column"),
    ("self_attention.linear_q_down_proj.weight", ("self_attn.q_a_proj.weight",), "replicated"),
    ("self_attention.q_layernorm.weight", ("self_attn.q_a_layernorm.weight",), "replicated"),
    ("self_attention.linear_q_up_proj.weight", ("self_attn.q_b_proj.weight",), "column"),
    (
        "self_attention.linear_kv_down_proj.weight",
        ("self_attn.kv_a_proj_with_mqa.weight",),
        "replicated",
    ),
    ("self_attention.kv_layernorm.weight", ("self_attn.kv_a_layernorm.weight",), "replicated"),
    ("self_attention.linear_kv_up_proj.weight", ("self_attn.kv_b_proj.weight",), "column"),
    ("self_attention.linear_proj.weight", ("self_attn.o_proj.weight",), "row"),
]
MLP: LayerTable = [
    ("mlp.linear_fc1.weight", ("mlp.gate_proj.weight", "mlp.up_proj.weight"), "gate_up"),
    ("mlp.linear_fc2.weight", ("mlp.down_proj.weight",), "row"),
]
FUSED_MLP: LayerTable = [
    ("mlp.linear_fc1.weight", ("mlp.gate_up_proj.weight",), "gate_up_fused"),
    ("mlp.linear_fc2.weight", ("mlp.down_proj.weight",), "row"),
    ("mlp.linear_fc2.post_norm.weight", ("post_mlp_layernorm.weight",), "replicated"),
]
MOE: LayerTable = [
    ("mlp.router.weight", ("mlp.gate.weight",), "replicated"),
    ("mlp.router.expert_bias", ("mlp.gate.e_score_correction_bias",), "replicated"),
    (
        "mlp.shared_experts.linear_fc1.weight",
        ("mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight"),
        "gate_up",
    ),
    ("mlp.shared_experts.linear_fc2.weight", ("mlp.shared_experts.down_proj.weight",), "row"),
]
EXPERTS: LayerTable = [
    (
        "linear_fc1.weight",
        ("mlp.experts.{e}.gate_proj.weight", "mlp.experts.{e}.up_proj.weight"),
        "gate_up",
    ),
    ("linear_fc2.weight", ("mlp.experts.{e}.down_proj.weight",), "row"),
]
TOP_LEVEL = {
    "embedding.word_embeddings.weight": Rule(("model.embed_tokens.weight",), LAYOUTS["vocab"]),
    "output_layer.weight": Rule(("lm_head.weight",), LAYOUTS["vocab"]),
    "decoder.final_layernorm.weight": Rule(("model.norm.weight",), LAYOUTS["replicated"]),
}
MTP_LAYER: LayerTable = [
    ("enorm.weight", ("enorm.weight",), "replicated"),
    ("hnorm.weight", ("hnorm.weight",), "replicated"),
    ("eh_proj.weight", ("eh_proj.weight",), "column"),
    ("final_layernorm.weight", ("shared_head.norm.weight",), "replicated"),
]
MTP_SHARED = {
    "embed_tokens.weight": "embedding.word_embeddings.weight",
    "shared_head.head.weight": "output_layer.weight",
}
"""HF suffixes of an MTP layer that repeat a main-model tensor, and that tensor."""
DENSE_MLP_BY_FAMILY = {"glm4": FUSED_MLP}
"""Families whose HF checkpoint fuses gate and up (the rest store gate_proj and up_proj)."""

IGNORED = re.compile(r"(_extra_state|local_tokens_per_expert|global_tokens_per_expert)$")
LAYER_NAME = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
MTP_NAME = re.compile(r"^mtp\.layers\.(\d+)\.(.+)$")
MTP_TRANSFORMER = "transformer_layer."
HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
EXPERT_NAME = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(.+)$")


def is_mapped(name: str) -> bool:
    return IGNORED.search(name) is None


class WeightMap:
    """Global Megatron name -> Rule, for one model."""

    def __init__(self, model: ModelConfig) -> None:
        self.tied = model.tie_word_embeddings
        self.num_layers = model.num_layers
        layer = MLA_ATTENTION if model.mla is not None else ATTENTION
        dense_mlp = DENSE_MLP_BY_FAMILY.get(model.family, MLP)
        self.dense = {m: (hf, lay) for m, hf, lay in layer + dense_mlp}
        self.moe = {m: (hf, lay) for m, hf, lay in layer + MOE}
        self.experts = {m: (hf, lay) for m, hf, lay in EXPERTS}
        self.mtp = {m: (hf, lay) for m, hf, lay in MTP_LAYER}
        first_dense = model.moe.first_k_dense_layers if model.moe else model.num_layers
        self.is_moe_layer = [
            model.moe is not None and i >= first_dense
            for i in range(model.num_layers + model.mtp_num_layers)
        ]

    def rule(self, name: str) -> Rule:
        """The rule of a global Megatron parameter name."""
        if name == "output_layer.weight" and self.tied:
            return TOP_LEVEL["embedding.word_embeddings.weight"]
        if name in TOP_LEVEL:
            return TOP_LEVEL[name]
        mtp = MTP_NAME.match(name)
        if mtp is not None:
            index, rest = self.num_layers + int(mtp.group(1)), mtp.group(2)
            if not rest.startswith(MTP_TRANSFORMER):
                if rest not in self.mtp:
                    raise KeyError(f"no HF name for Megatron parameter {name!r}")
                hf, layout = self.mtp[rest]
                return Rule(tuple(f"model.layers.{index}.{h}" for h in hf), LAYOUTS[layout])
            return self._layer_rule(name, index, rest.removeprefix(MTP_TRANSFORMER))
        match = LAYER_NAME.match(name)
        if match is None:
            raise KeyError(f"no HF name for Megatron parameter {name!r}")
        return self._layer_rule(name, int(match.group(1)), match.group(2))

    def _layer_rule(self, name: str, index: int, rest: str) -> Rule:
        """A transformer layer's tensor: `rest` within HF layer `index`."""
        prefix = f"model.layers.{index}."
        expert = EXPERT_NAME.match(rest)
        if expert is not None:
            hf, layout = self.experts[expert.group(2)]
            names = tuple(prefix + h.format(e=expert.group(1)) for h in hf)
            return Rule(names, LAYOUTS[layout], expert=True)
        table = self.moe if self.is_moe_layer[index] else self.dense
        if rest not in table:
            raise KeyError(f"no HF name for Megatron parameter {name!r}")
        hf, layout = table[rest]
        return Rule(tuple(prefix + h for h in hf), LAYOUTS[layout])

    def exported(self, name: str) -> bool:
        """Whether this global name is the one HF copy of its weights (a tied output layer
        duplicates the embedding)."""
        return is_mapped(name) and not (name == "output_layer.weight" and self.tied)

    def mtp_shared_source(self, hf_name: str) -> str | None:
        """For an MTP layer's repeat of a shared tensor (`model.layers.{N}.embed_tokens.weight`,
        `...shared_head.head.weight`, N >= num_layers), the HF name of the shared tensor."""
        match = HF_LAYER.match(hf_name)
        if match is None or int(match.group(1)) < self.num_layers:
            return None
        shared = MTP_SHARED.get(match.group(2))
        return None if shared is None else self.rule(shared).hf_names[0]


@dataclass(frozen=True)
class Placement:
    """Where this process's parameters sit in the whole model."""

    layer_offset: int = 0
    expert_offset: int = 0
    tp_rank: int = 0
    tp_size: int = 1
    etp_rank: int = 0
    etp_size: int = 1

    def global_name(self, local: str) -> str:
        mtp = MTP_NAME.match(local)
        if mtp is not None:  # all MTP layers live on one stage: no layer offset
            rest = mtp.group(2).removeprefix(MTP_TRANSFORMER)
            if rest == mtp.group(2):
                return local
            return f"mtp.layers.{mtp.group(1)}.{MTP_TRANSFORMER}{self._global_expert(rest)}"
        match = LAYER_NAME.match(local)
        if match is None:
            return local
        index = int(match.group(1)) + self.layer_offset
        return f"decoder.layers.{index}.{self._global_expert(match.group(2))}"

    def _global_expert(self, rest: str) -> str:
        expert = EXPERT_NAME.match(rest)
        if expert is None:
            return rest
        index = int(expert.group(1)) + self.expert_offset
        return f"mlp.experts.local_experts.{index}.{expert.group(2)}"

    def group(self, rule: Rule) -> tuple[int, int]:
        """(rank, size) of the tensor-parallel group that splits this parameter."""
        return (self.etp_rank, self.etp_size) if rule.expert else (self.tp_rank, self.tp_size)
