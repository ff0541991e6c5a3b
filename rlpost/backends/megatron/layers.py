"""Modules rlpost's layer specs put into megatron-core's blocks.

- `RMSNorm`: torch's rms_norm (kernels.rms_norm), marked for sequence parallelism so
  megatron-core all-reduces its gradient across the TP group.
- `LatentRMSNorm`: the MLA latent norms, whose epsilon HF fixes at 1e-6 whatever rms_norm_eps.
- `PackedAttention`: RoPE and core attention over packed samples (megatron's THD layout), with
  context parallelism: K and V are gathered across the CP group and each local query attends
  to the keys at or before its position in its own sample. The attention itself is
  `kernels.packed_attention`: torch's varlen flash kernel where it applies, else padded SDPA.
- `PostNormRowParallelLinear`: a row-parallel projection followed by an RMSNorm, i.e. GLM-4's
  extra norms after attention and after the MLP (applied before the residual add).
- `GroupedExperts`: megatron-core's SequentialMLP experts (the same parameters, names and
  checkpoint entries) computed as two grouped GEMMs over all local experts
  (`model.moe.grouped_gemm: true`) instead of two GEMMs per expert.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.tensor_parallel import RowParallelLinear
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.moe.experts import SequentialMLP
from megatron.core.transformer.transformer_config import TransformerConfig
from torch import Tensor, nn

from rlpost.backends.megatron.kernels import apply_rope, packed_attention, rms_norm
from rlpost.backends.megatron.packed import PackedBatchParams

LATENT_NORM_EPS = 1e-6


class RMSNorm(nn.Module):
    def __init__(
        self, config: TransformerConfig, hidden_size: int, eps: float = 1e-6, **kwargs: Any
    ) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        self.weight.sequence_parallel = config.sequence_parallel  # type: ignore[attr-defined]

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


class LatentRMSNorm(RMSNorm):
    """Under sequence parallelism MLA scatters the latents back to sequence shards before
    normalising them, so like the other norms their gradients are summed across TP."""

    def __init__(
        self, config: TransformerConfig, hidden_size: int, eps: float = 1e-6, **kwargs: Any
    ) -> None:
        super().__init__(config, hidden_size, LATENT_NORM_EPS)


class PostNormRowParallelLinear(RowParallelLinear):  # type: ignore[misc]
    def __init__(self, input_size: int, output_size: int, *, config: Any, **kwargs: Any) -> None:
        super().__init__(input_size, output_size, config=config, **kwargs)
        self.post_norm = RMSNorm(config, output_size, config.layernorm_epsilon)

    def forward(self, x: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor | None]:
        out, bias = super().forward(x, *args, **kwargs)
        if bias is not None:
            out, bias = out + bias, None
        return self.post_norm(out), bias


class GroupedExperts(SequentialMLP):  # type: ignore[misc]
    """The local experts of an MoE layer as grouped GEMMs: the tokens arrive sorted by expert
    (`tokens_per_expert` of them each), fc1 is one grouped GEMM over every expert's weight,
    then rlpost's SwiGLU times the routing probabilities, then fc2 likewise. On CUDA in bf16
    torch runs CUTLASS's grouped kernel; elsewhere its own loop, with the same math.

    The weights stay SequentialMLP's, one pair of linear layers per expert (so loading,
    exporting, checkpoints and expert parallelism see no difference); each GEMM stacks them for
    the call and again in backward, so no stacked copy is kept between the two. The expert
    linears never communicate (megatron-core leaves expert parallelism's exchange to the token
    dispatcher), so skipping their forward skips no collective. torch's grouped GEMM wants
    rows every 16 bytes (plan.checks.grouped_gemm_issues refuses other sizes, and biases)."""

    def forward(
        self, hidden: Tensor, tokens_per_expert: Tensor, probs: Tensor
    ) -> tuple[Tensor, None]:
        if self.num_local_experts == 1 or self.config.moe_apply_probs_on_input:
            return super().forward(hidden, tokens_per_expert, probs)  # type: ignore[no-any-return]
        ends = torch.cumsum(tokens_per_expert.to(hidden.device), 0, dtype=torch.int32)
        experts = self.local_experts
        fc1 = grouped_linear(hidden, ends, [e.linear_fc1.weight for e in experts])
        act = experts[0].activation_func(fc1)
        act = (act * probs.unsqueeze(-1)).to(act.dtype)
        return grouped_linear(act, ends, [e.linear_fc2.weight for e in experts]), None


def grouped_linear(x: Tensor, ends: Tensor, weights: list[Tensor]) -> Tensor:
    """`x`'s rows up to ends[0] times weights[0].T, the next up to ends[1] times weights[1].T,
    and so on, as one grouped GEMM; differentiable in `x` and each weight."""
    return _GroupedLinear.apply(x, ends, *weights)  # type: ignore[no-untyped-call,no-any-return]


class _GroupedLinear(torch.autograd.Function):
    """Saves `x` and the weights themselves (parameters, no copy); the stacked weights are made
    for each GEMM and dropped after it. Each weight's gradient is its slice of the grouped
    weight-gradient GEMM (an expert without tokens gets zeros, as its own GEMM would give)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, ends: Tensor, *weights: Tensor) -> Tensor:
        x = x.contiguous()
        ctx.save_for_backward(x, ends, *weights)
        return F.grouped_mm(x, torch.stack(weights).transpose(-2, -1), offs=ends)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, ends, *weights = ctx.saved_tensors
        grad = grad.contiguous()
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = F.grouped_mm(grad, torch.stack(weights), offs=ends)
        if not any(ctx.needs_input_grad[2:]):
            return (grad_x, None, *(None for _ in weights))
        grad_w = F.grouped_mm(grad.transpose(0, 1), x, offs=ends)
        return (grad_x, None, *grad_w.unbind(0))


def gather_along_sequence(x: Tensor, group: dist.ProcessGroup) -> Tensor:
    """All ranks' `x` concatenated along dim 0, rank-major, differentiable."""
    return _GatherSequence.apply(x, group)  # type: ignore[no-untyped-call,no-any-return]


class _GatherSequence(torch.autograd.Function):
    """All-gather along dim 0 over a group; backward sums the gradients and keeps this rank's
    slice (gloo has no reduce-scatter)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: dist.ProcessGroup) -> Tensor:
        ctx.group = group
        ctx.rank, ctx.size = dist.get_rank(group), dist.get_world_size(group)
        parts = [torch.empty_like(x) for _ in range(ctx.size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad.chunk(ctx.size, dim=0)[ctx.rank].contiguous(), None


class PackedAttention(MegatronModule):  # type: ignore[misc]
    """Causal attention within each packed sample, optionally context parallel. RoPE is
    applied here, from the micro-batch's table (packed.PackedBatchParams), and the samples'
    layout comes from the micro-batch's index tensors: nothing is read on the host."""

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: Any,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        k_channels: int | None = None,
        v_channels: int | None = None,
        cp_comm_type: str | None = None,
        pg_collection: Any = None,
    ) -> None:
        super().__init__(config=config)
        head_dim = k_channels or config.kv_channels
        self.softmax_scale = softmax_scale or 1.0 / math.sqrt(head_dim)
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        self.interleaved = config.rotary_interleaved
        self.cp_group = getattr(pg_collection, "cp", None) or (
            parallel_state.get_context_parallel_group()
        )

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: Tensor | None = None,
        packed_seq_params: PackedSeqParams | None = None,
    ) -> Tensor:
        """query [t, np, d], key [t, ng, d], value [t, ng, dv] (THD) -> [t, np * dv]."""
        if not isinstance(packed_seq_params, PackedBatchParams) or (
            packed_seq_params.attention is None
        ):
            raise ValueError(
                "PackedAttention takes packed micro-batches (batches.build_micro_batch), whose "
                "PackedBatchParams carry the samples' index tensors"
            )
        if packed_seq_params.rope is not None:  # MLA applies its own rotary embedding
            query = apply_rope(query, packed_seq_params.rope, self.interleaved)
            key = apply_rope(key, packed_seq_params.rope, self.interleaved)
        index = packed_seq_params.attention
        if index.gathered_keys:  # context parallel: every rank's keys, rank-major
            key = gather_along_sequence(key, self.cp_group)
            value = gather_along_sequence(value, self.cp_group)
        return packed_attention(
            query,
            key,
            value,
            index,
            scale=self.softmax_scale,
            dropout_p=self.dropout if self.training else 0.0,
        )
