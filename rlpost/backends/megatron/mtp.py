"""Multi-token prediction (MTP) layers trained beside the policy (`recipe.train.mtp_training`).

GLM-4.5, GLM-4.7-Flash and DeepSeek-V3 checkpoints carry MTP layers (HF layer indices from
num_layers on) that the engines' speculative decoder drafts with. As RL moves the policy, drafts
from the original MTP layers are accepted less and less often; training them on each rollout
keeps them in step with the policy.

What the MTP loss is:
- depth k (1..D) at position i reads the hidden state of depth k-1 at i (the main model's final
  hidden state for k = 1) and the embedding of token i+k, and predicts token i+k+1. Its loss is
  the cross-entropy on the tokens under the loss mask: the tokens the policy generated, which
  are the ones a drafter guesses (prompt and tool-output tokens are prefilled, never drafted).
  It is a plain likelihood, not reward-weighted: a drafter should match the policy, good
  samples and bad alike.
- it trains the MTP layers only. The main model's hidden states, the shared embedding and the
  shared output head enter it detached, so the policy's gradient is the RL objective's alone
  (megatron-core's pre-training MTP loss would also pull the policy toward its own samples).
  Gradient clipping still sees both: the global norm includes the MTP layers' gradients.
- loss = factor / D * sum_k CE_k / N_k, N_k the number of loss-mask tokens of the optimizer
  step that depth k can predict (summed over data-parallel ranks), as in the token_mean policy
  loss. `train/mtp_loss` reports the unscaled mean over depths, sum_k CE_k / N_k / D.

Packed samples: megatron-core 0.16.1 rolls tokens, labels and masks within each packed sample
(by cu_seqlens, exchanging chunk boundaries between context-parallel ranks), so no depth reads
or predicts a token of the next sample in the row; the MTP transformer layers attend within
samples like the decoder's.

megatron-core's GPTModel computes its MTP loss only when given labels, and then returns the
language-model loss instead of logits; rlpost's losses need logits. `MTPGPTModel` therefore
replaces the post-processing: logits as before, plus the MTP loss attached to the graph with
megatron-core's MTPLossAutoScaler (its gradient joins the backward of whatever loss the logits
feed). `PackedMTPLayer` recomputes an MTP layer under full activation recomputation, which
megatron-core 0.16.1 cannot do with packed samples.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core import tensor_parallel
from megatron.core.models.gpt import GPTModel
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.multi_token_prediction import (
    MTPLossAutoScaler,
    MultiTokenPredictionLayer,
    roll_tensor,
)
from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group
from torch import Tensor

from rlpost.backends.megatron.batches import MicroBatch, MTPTargets
from rlpost.backends.megatron.logits import hidden_logprobs, output_layer_input
from rlpost.schema import ModelConfig, TrainConfig
from rlpost.types import TrainSample

if TYPE_CHECKING:
    from rlpost.algo.steps import SampleTensors
    from rlpost.backends.megatron.config import MegatronSettings

METRIC = "mtp_loss"


class PackedMTPLayer(MultiTokenPredictionLayer):  # type: ignore[misc]
    """An MTP layer whose full recomputation works with packed samples: megatron-core 0.16.1
    hands every argument, PackedSeqParams included, to its checkpoint function, which saves
    tensors only. Here the checkpoint sees the two activations and the rest rides in a closure;
    every recompute method recomputes each MTP layer whole."""

    def _checkpointed_forward(self, forward_func: Callable[..., Tensor], **kwargs: Any) -> Tensor:
        hidden, embedded = kwargs.pop("hidden_states"), kwargs.pop("decoder_input")

        def run(hidden_states: Tensor, decoder_input: Tensor) -> Tensor:
            return forward_func(hidden_states=hidden_states, decoder_input=decoder_input, **kwargs)

        distribute = self.config.distribute_saved_activations
        return tensor_parallel.checkpoint(run, distribute, hidden, embedded)  # type: ignore[no-any-return]


def mtp_loss_factor(model: ModelConfig, train: TrainConfig) -> float | None:
    """The MTP loss factor when MTP layers are trained, else None (none are built)."""
    if not train.mtp_training:
        return None
    if model.mtp_num_layers == 0:
        raise ValueError(
            f"train.mtp_training is on, but model {model.name!r} has mtp_num_layers=0: "
            "there are no MTP layers to train; turn mtp_training off or set "
            "model.mtp_num_layers to the checkpoint's num_nextn_predict_layers"
        )
    return train.mtp_loss_scaling_factor


class MTPGPTModel(GPTModel):  # type: ignore[misc]
    """GPTModel that returns logits and, when a forward gets `mtp_targets`, also trains its
    MTP block on them (see the module docstring). Without targets the MTP block is skipped."""

    def __init__(self, *args: Any, true_vocab_size: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.true_vocab_size = true_vocab_size
        self._targets: MTPTargets | None = None

    def forward(self, *args: Any, mtp_targets: MTPTargets | None = None, **kwargs: Any) -> Tensor:
        self._targets = mtp_targets
        try:
            return super().forward(*args, **kwargs)  # type: ignore[no-any-return]
        finally:
            self._targets = None

    def _postprocess(
        self,
        hidden_states: Tensor,
        input_ids: Tensor,
        position_ids: Tensor,
        labels: Tensor | None,
        rotary_pos_emb: Tensor | None,
        rotary_pos_cos: Tensor | None,
        rotary_pos_sin: Tensor | None,
        mtp_in_postprocess: bool | None = None,
        packed_seq_params: PackedSeqParams | None = None,
        runtime_gather_output: bool | None = None,
        **unused: Any,
    ) -> Tensor:
        if not self.post_process:
            return hidden_states
        if mtp_in_postprocess and self._targets is not None:
            hidden_states = self._attach_mtp_loss(
                hidden_states,
                input_ids,
                position_ids,
                self._targets,
                packed_seq_params,
                rotary=(rotary_pos_emb, rotary_pos_cos, rotary_pos_sin),
            )
        # the final hidden states: the trainer's log-prob kernel applies the output layer
        return hidden_states.transpose(0, 1).contiguous()

    def sharded_state_dict(
        self, prefix: str = "", sharded_offsets: tuple[Any, ...] = (), metadata: Any = None
    ) -> Any:
        # megatron-core 0.16.1 reads metadata["dp_cp_group"] for the MTP stage's copy of the
        # embedding without filling in the default first (a None metadata fails)
        metadata = ensure_metadata_has_dp_cp_group(metadata)
        return super().sharded_state_dict(prefix, sharded_offsets, metadata)

    def _detached_embedding(self) -> Callable[..., Tensor]:
        def embed(input_ids: Tensor, position_ids: Tensor) -> Tensor:
            embedded: Tensor = self.embedding(input_ids=input_ids, position_ids=position_ids)
            return embedded.detach()

        return embed

    def _attach_mtp_loss(
        self,
        hidden_states: Tensor,
        input_ids: Tensor,
        position_ids: Tensor,
        targets: MTPTargets,
        packed_seq_params: PackedSeqParams | None,
        rotary: tuple[Tensor | None, Tensor | None, Tensor | None],
    ) -> Tensor:
        depths = int(self.config.mtp_num_layers)
        stacked = self.mtp(
            input_ids=input_ids,
            position_ids=position_ids,
            # a leaf that wants a gradient: a recomputed (checkpointed) MTP layer trains only
            # when an input of its checkpoint does
            hidden_states=hidden_states.detach().requires_grad_(),
            attention_mask=None,
            rotary_pos_emb=rotary[0],
            rotary_pos_cos=rotary[1],
            rotary_pos_sin=rotary[2],
            packed_seq_params=packed_seq_params,
            embedding=self._detached_embedding(),
        )
        outputs = torch.chunk(stacked, 1 + depths, dim=0)[1:]
        head = (
            self.shared_embedding_or_output_weight()
            if self.share_embeddings_and_output_weights
            else self.output_layer.weight
        ).detach()
        labels = targets.labels.to(hidden_states.device)
        mask = targets.mask.to(hidden_states.device)
        losses = []
        for depth, hidden in enumerate(outputs):
            labels, _ = roll_tensor(labels, -1, -1, self.cp_group, packed_seq_params)
            mask, _ = roll_tensor(mask, -1, -1, self.cp_group, packed_seq_params)
            inputs = output_layer_input(hidden[:, 0], self.config.sequence_parallel)
            logp = hidden_logprobs(inputs, head, labels[0], self.true_vocab_size).logp
            losses.append(-(logp * mask[0]).sum() / targets.denominators[depth])
        mean = torch.stack(losses).mean()
        _record(mean.detach(), targets.loss_out, self.cp_group)
        scale = float(self.config.mtp_loss_scaling_factor)
        return MTPLossAutoScaler.apply(hidden_states, scale * mean)  # type: ignore[no-any-return]


def _record(value: Tensor, out: Tensor, cp_group: dist.ProcessGroup | None) -> None:
    """Each context-parallel rank holds part of the sum; every one records the whole."""
    total = value.reshape(1).to(out.dtype)
    if cp_group is not None and dist.get_world_size(cp_group) > 1:
        dist.all_reduce(total, group=cp_group)
    out.copy_(total)


# ---- the trainer's side: targets per micro-batch, the step's denominators, the metric -------


def predictable_tokens(sample: TrainSample, mask: Tensor, depths: int) -> list[float]:
    """Per depth k (1..D): loss-mask tokens at index >= k + 1, the ones depth k can predict."""
    prompt = sample.length - sample.response_length
    return [float(mask[max(0, k + 1 - prompt) :].sum()) for k in range(1, depths + 1)]


def _collective_device() -> torch.device:
    """Where a tensor must live for a collective: NCCL reduces CUDA tensors only."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def step_denominators(counts: Sequence[Sequence[float]], depths: int) -> tuple[float, ...]:
    """Per-depth totals over this rank's samples and every data-parallel rank's. Collective."""
    totals = [sum(c[k] for c in counts) for k in range(depths)]
    local = torch.tensor(totals, dtype=torch.float64, device=_collective_device())
    if ps.get_data_parallel_world_size() > 1:
        dist.all_reduce(local, group=ps.get_data_parallel_group())
    return tuple(max(float(n), 1.0) for n in local.tolist())


def local_mask(mb: MicroBatch, masks: Sequence[Tensor], cp_rank: int, cp_size: int) -> Tensor:
    """[1, t_local]: 1.0 at the local positions whose next token is under the loss mask."""
    # on the micro-batch's device: response_index indexes it, and the masks come from there
    gathered = torch.zeros(mb.local_tokens * cp_size, device=mb.response_index.device)
    if mb.samples:
        gathered[mb.response_index] = torch.cat([m.float() for m in masks])
    return gathered.view(cp_size, -1)[cp_rank].unsqueeze(0)


def with_mtp_targets(
    mbs: Sequence[MicroBatch],
    batch: Sequence[TrainSample],
    data: Mapping[int, SampleTensors],
    settings: MegatronSettings,
) -> list[MicroBatch]:
    """The micro-batches of one optimizer step with their MTP targets (unchanged when no MTP
    layers are trained). Collective over the data-parallel group."""
    depths = settings.transformer.mtp_num_layers
    if not depths:
        return list(mbs)
    counts = [predictable_tokens(batch[i], data[i].mask, depths) for mb in mbs for i in mb.samples]
    denominators = step_denominators(counts, depths)
    cp_rank, cp_size = ps.get_context_parallel_rank(), ps.get_context_parallel_world_size()
    return [
        dataclasses.replace(
            mb,
            mtp=MTPTargets(
                labels=mb.targets.unsqueeze(0),
                mask=local_mask(mb, [data[i].mask for i in mb.samples], cp_rank, cp_size),
                denominators=denominators,
                loss_out=torch.zeros(1, dtype=torch.float64),
            ),
        )
        for mb in mbs
    ]


def mtp_step_metrics(mbs: Sequence[MicroBatch], settings: MegatronSettings) -> dict[str, float]:
    """{"mtp_loss": the optimizer step's MTP loss} when MTP layers are trained, else {}.
    Collective over the whole world (the loss lives on the last pipeline stage)."""
    if not settings.transformer.mtp_num_layers:
        return {}
    total = torch.zeros(1, dtype=torch.float64, device=_collective_device())
    counted = (
        ps.is_pipeline_last_stage()
        and ps.get_tensor_model_parallel_rank() == 0
        and ps.get_context_parallel_rank() == 0
    )
    if counted:
        for mb in mbs:
            if mb.mtp is not None:
                total += mb.mtp.loss_out.to(total.device)
    dist.all_reduce(total)
    return {METRIC: float(total)}
