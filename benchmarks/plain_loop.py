"""The same work as rlpost's train step, written as a plain PyTorch loop: the baseline of
benchmarks/megatron_train.py --baseline.

What a user would write instead of a trainer: transformers' causal LM from the same HF folder,
SDPA attention, float32 parameters (the master weights) and AdamW (fused on CUDA) with float32
states, bf16 compute by torch.autocast on CUDA (float32 throughout on CPU), the same per-token
policy-gradient loss on the response tokens, -(advantage x logprob) summed over the step's
response tokens / their count, and micro-batches of as many whole samples as
`max_tokens_per_gpu` holds. Where rlpost's layout recomputes every layer (recompute full), the
loop checkpoints every layer too (transformers' gradient checkpointing), so both do the same
work. One optimizer step per rollout.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from rlpost.backends.step_perf import StepMeter
from rlpost.types import TrainSample


@dataclass(frozen=True)
class PlainResult:
    elapsed_s: float  # the timed rollouts
    # max_memory_allocated on CUDA, less what was allocated before the loop began (anything
    # the trainer before it left behind: `held_gib`); the process's peak RSS on CPU
    peak_memory_gib: float
    held_gib: float
    micro_batch_samples: int


def micro_batch_samples(seq_len: int, max_tokens_per_gpu: int) -> int:
    """Whole samples per micro-batch within the bound (at least one)."""
    return max(1, max_tokens_per_gpu // seq_len)


class PlainLoop:
    def __init__(
        self, hf_dir: Path, device: torch.device, lr: float, recompute: bool, max_tokens: int
    ) -> None:
        from transformers import AutoModelForCausalLM

        self.device, self.max_tokens = device, max_tokens
        # PreTrainedModel.to is functools.wraps(nn.Module.to), typed as the unbound function
        self.model = AutoModelForCausalLM.from_pretrained(
            hf_dir, dtype=torch.float32, attn_implementation="sdpa"
        ).to(device)  # type: ignore[arg-type]
        if recompute:
            self.model.gradient_checkpointing_enable({"use_reentrant": False})
        self.model.config.use_cache = False
        self.model.train()
        fused = device.type == "cuda"
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, fused=fused)

    def _autocast(self) -> contextlib.AbstractContextManager[object]:
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step(self, batch: Sequence[TrainSample]) -> None:
        """One rollout, one optimizer step; every sample the same length (the benchmark's)."""
        seq_len = len(batch[0].tokens)
        per_micro = micro_batch_samples(seq_len, self.max_tokens)
        response_tokens = sum(s.response_length for s in batch)
        for first in range(0, len(batch), per_micro):
            micro = batch[first : first + per_micro]
            prompt = seq_len - micro[0].response_length
            ids = torch.tensor([s.tokens for s in micro], device=self.device)
            adv = torch.tensor([s.reward for s in micro], device=self.device)
            with self._autocast():
                logits = self.model(input_ids=ids).logits[:, prompt - 1 : -1]
            logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, prompt:, None])
            loss = -(adv[:, None] * logp.squeeze(-1)).sum() / response_tokens
            torch.autograd.backward(loss)
            del logits, logp, loss
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def run_plain_loop(
    hf_dir: Path,
    rollouts: Sequence[Sequence[TrainSample]],
    lr: float,
    recompute: bool,
    max_tokens: int,
) -> PlainResult:
    """One warm-up rollout, then the rest timed; peak memory over the timed ones."""
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda" if on_gpu else "cpu")
    held_gib = torch.cuda.memory_allocated(device) / 1024**3 if on_gpu else 0.0
    loop = PlainLoop(hf_dir, device, lr, recompute, max_tokens)
    loop.step(rollouts[0])
    meter = StepMeter(device, 1, None)
    if on_gpu:
        torch.cuda.synchronize()
    meter.start()
    start = time.perf_counter()
    for batch in rollouts[1:]:
        loop.step(batch)
    if on_gpu:
        torch.cuda.synchronize()
    elapsed_s = time.perf_counter() - start
    seq_len = len(rollouts[0][0].tokens)
    peak_gib = meter.peak_memory_gib() - held_gib
    return PlainResult(elapsed_s, peak_gib, held_gib, micro_batch_samples(seq_len, max_tokens))
