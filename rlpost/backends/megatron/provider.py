"""Build a megatron-core GPTModel for this process's pipeline stage from the settings.

Layer specs are rlpost's own, assembled from megatron-core's local (non-TransformerEngine)
modules plus `layers.py`: RMSNorm everywhere, packed/context-parallel core attention, GLM-4's
post norms, the MLA latent norms, and experts as `model.moe.grouped_gemm` says: grouped GEMMs
over SequentialMLP's weights (`layers.GroupedExperts`, torch's grouped_mm, which runs on CPU
as well; megatron-core's own grouped experts need TransformerEngine or the grouped_gemm
package), or SequentialMLP's GEMMs one expert at a time.
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state
from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.models.gpt import GPTModel
from megatron.core.post_training.modelopt.layers import Linear as DuplicatedLinear
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.transformer.moe.experts import SequentialMLP
from megatron.core.transformer.moe.moe_layer import MoELayer, MoESubmodules
from megatron.core.transformer.moe.shared_experts import SharedExpertMLP
from megatron.core.transformer.multi_latent_attention import (
    MLASelfAttention,
    MLASelfAttentionSubmodules,
)
from megatron.core.transformer.multi_token_prediction import (
    MultiTokenPredictionBlock,
    MultiTokenPredictionBlockSubmodules,
    MultiTokenPredictionLayerSubmodules,
)
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import (
    TransformerBlockSubmodules,
    get_num_layers_to_build,
)
from megatron.core.transformer.transformer_layer import (
    TransformerLayer,
    TransformerLayerSubmodules,
    get_transformer_layer_offset,
)

from rlpost.backends.megatron.config import MegatronSettings
from rlpost.backends.megatron.kernels import SwiGLU
from rlpost.backends.megatron.layers import (
    GroupedExperts,
    LatentRMSNorm,
    PackedAttention,
    PostNormRowParallelLinear,
    RMSNorm,
)
from rlpost.backends.megatron.mtp import MTPGPTModel, PackedMTPLayer


def _attention_spec(settings: MegatronSettings) -> ModuleSpec:
    config = settings.transformer
    proj = PostNormRowParallelLinear if settings.post_self_attn_layernorm else RowParallelLinear
    if config.multi_latent_attention:
        return ModuleSpec(
            module=MLASelfAttention,
            params={"attn_mask_type": AttnMaskType.causal},
            submodules=MLASelfAttentionSubmodules(
                linear_q_proj=ColumnParallelLinear,
                # duplicated, not column-parallel: megatron-core's column-parallel path
                # gathers the shared rope key without summing its gradient over the heads
                # of the other TP ranks; the duplicated path all-gathers it along the
                # sequence, whose backward does
                linear_q_down_proj=DuplicatedLinear,
                linear_q_up_proj=ColumnParallelLinear,
                linear_kv_down_proj=DuplicatedLinear,
                linear_kv_up_proj=ColumnParallelLinear,
                core_attention=PackedAttention,
                linear_proj=proj,
                q_layernorm=LatentRMSNorm if config.qk_layernorm else IdentityOp,
                kv_layernorm=LatentRMSNorm if config.qk_layernorm else IdentityOp,
            ),
        )
    norm = RMSNorm if config.qk_layernorm else IdentityOp
    return ModuleSpec(
        module=SelfAttention,
        params={"attn_mask_type": AttnMaskType.causal},
        submodules=SelfAttentionSubmodules(
            linear_qkv=ColumnParallelLinear,
            core_attention=PackedAttention,
            linear_proj=proj,
            q_layernorm=norm,
            k_layernorm=norm,
        ),
    )


def _mlp_spec(settings: MegatronSettings, moe: bool) -> ModuleSpec:
    # every MLP (dense, expert, shared expert) hands fc1's whole output to rlpost's SwiGLU
    # (config.use_te_activation_func asks megatron-core's MLP for exactly that call)
    fc2 = PostNormRowParallelLinear if settings.post_mlp_layernorm else RowParallelLinear
    act = SwiGLU if settings.transformer.use_te_activation_func else None
    dense = MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=fc2, activation_func=act)
    if not moe:
        return ModuleSpec(module=MLP, submodules=dense)
    plain = MLPSubmodules(
        linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear, activation_func=act
    )
    experts = GroupedExperts if settings.transformer.moe_grouped_gemm else SequentialMLP
    shared = None
    if settings.transformer.moe_shared_expert_intermediate_size:
        shared = ModuleSpec(module=SharedExpertMLP, submodules=plain)
    return ModuleSpec(
        module=MoELayer,
        submodules=MoESubmodules(
            experts=ModuleSpec(module=experts, submodules=plain), shared_experts=shared
        ),
    )


def layer_spec(settings: MegatronSettings, moe: bool) -> ModuleSpec:
    """One transformer layer: pre-norm attention and MLP (dense or MoE)."""
    return ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=RMSNorm,
            self_attention=_attention_spec(settings),
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=RMSNorm,
            mlp=_mlp_spec(settings, moe),
            mlp_bda=get_bias_dropout_add,
        ),
    )


def stage_layers(settings: MegatronSettings, pp_rank: int | None = None) -> range:
    """Global indices (from 0) of the decoder layers on a pipeline stage (default: this one)."""
    config = settings.transformer
    offset = get_transformer_layer_offset(config, pp_rank=pp_rank)
    count = get_num_layers_to_build(config, pp_rank=pp_rank)
    return range(offset, offset + count)


def block_spec(settings: MegatronSettings) -> TransformerBlockSubmodules:
    pattern = settings.moe_layer_pattern or (0,) * settings.transformer.num_layers
    specs = [layer_spec(settings, bool(pattern[i])) for i in stage_layers(settings)]
    return TransformerBlockSubmodules(layer_specs=specs, layer_norm=RMSNorm)


def mtp_block_spec(settings: MegatronSettings) -> ModuleSpec | None:
    """The MTP layers (all on the last pipeline stage), each around one of rlpost's own
    transformer layers: dense or MoE as the HF layer of the same index, MLA or not."""
    config = settings.transformer
    if not config.mtp_num_layers or not parallel_state.is_pipeline_last_stage():
        return None
    pattern = settings.moe_layer_pattern
    # MTP layers sit after the decoder in HF numbering; in MoE models they are MoE layers
    moe = bool(pattern) and bool(pattern[-1])
    layer = ModuleSpec(
        module=PackedMTPLayer,
        submodules=MultiTokenPredictionLayerSubmodules(
            enorm=RMSNorm,
            hnorm=RMSNorm,
            eh_proj=ColumnParallelLinear,
            transformer_layer=layer_spec(settings, moe),
            layer_norm=RMSNorm,
        ),
    )
    return ModuleSpec(
        module=MultiTokenPredictionBlock,
        submodules=MultiTokenPredictionBlockSubmodules(layer_specs=[layer] * config.mtp_num_layers),
    )


def build_gpt_model(settings: MegatronSettings, with_mtp: bool = True) -> GPTModel:
    """This stage's GPTModel (process groups must be initialised). `with_mtp=False` leaves
    out MTP layers the settings describe (a frozen reference model needs none)."""
    gpt = settings.gpt
    kwargs = {
        "config": settings.transformer,
        "transformer_layer_spec": block_spec(settings),
        "vocab_size": gpt.vocab_size,
        "max_sequence_length": gpt.max_sequence_length,
        "pre_process": parallel_state.is_pipeline_first_stage(),
        "post_process": parallel_state.is_pipeline_last_stage(),
        "share_embeddings_and_output_weights": gpt.share_embeddings_and_output_weights,
        # RoPE is applied in PackedAttention from the micro-batch's table (packed.py); MLA
        # applies its own inside megatron-core's attention
        "position_embedding_type": "none" if settings.own_rope else gpt.position_embedding_type,
        "rotary_percent": gpt.rotary_percent,
        "rotary_base": gpt.rotary_base,
    }
    if not settings.transformer.mtp_num_layers:
        model = GPTModel(**kwargs)
        if model.post_process:
            _hand_out_hidden_states(model)
        return _placed(model, settings)
    spec = mtp_block_spec(settings) if with_mtp else None
    model = MTPGPTModel(**kwargs, mtp_block_spec=spec, true_vocab_size=gpt.true_vocab_size)
    return _placed(model, settings)


def _hand_out_hidden_states(model: GPTModel) -> None:
    """The model's output is its final hidden states: the output projection runs inside the
    log-prob kernel (logits.hidden_logprobs), which never holds the logits whole. The output
    layer keeps its weight, its checkpoint entries and its place in the model. (MTPGPTModel
    returns its hidden states itself.)"""

    def forward(
        hidden: torch.Tensor, weight: torch.Tensor | None = None, **kwargs: object
    ) -> tuple[torch.Tensor, None]:
        return hidden, None

    model.output_layer.forward = forward


def _placed(model: GPTModel, settings: MegatronSettings) -> GPTModel:
    """The model on this rank's GPU unless it is initialised on the host (CPU runs).
    megatron-core leaves placement to its caller (its own training loop calls .cuda()): its
    parallel layers allocate on the GPU, but the norms of layers.py and the duplicated MLA
    projections are plain torch modules built on the host."""
    if not settings.transformer.use_cpu_initialization:
        model.cuda(torch.cuda.current_device())
    return model
