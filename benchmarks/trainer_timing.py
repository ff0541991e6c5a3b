"""What benchmarks/megatron_train.py measures once the plan accepts its run: the random-weight
checkpoint, the synthetic rollouts, the peak of a large matmul, and the trainer's timed
train_steps with their memory. torch, transformers and megatron-core are imported here, and
the script imports this module only after planning: a run the plan refuses stops before any
of them loads or anything is measured."""

from __future__ import annotations

import gc
import math
import random
import resource
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from plain_loop import PlainResult, run_plain_loop
from step_profile import profile_report
from torch.distributed.tensor import DTensor

from rlpost.algo.advantages import needs_reference_kl
from rlpost.backends.megatron.trainer import MegatronTrainer
from rlpost.backends.torch_trainer import TorchTrainer
from rlpost.plan import Plan
from rlpost.runtime.trainers import build_trainer, trainer_spec
from rlpost.schema import ModelConfig, RunConfig
from rlpost.types import TrainSample

GIB = 1024**3
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
MATMUL = {"cuda": (8192, 20, "bf16"), "cpu": (1024, 4, "fp32")}  # size, repeats, dtype
PEAK_TRIALS = 5
Trainer = MegatronTrainer | TorchTrainer


def write_checkpoint(model: ModelConfig, path: Path, device: torch.device) -> None:
    """A random-weight HF Qwen3 with exactly the model YAML's shape."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=model.vocab_size,
        hidden_size=model.hidden_size,
        intermediate_size=model.ffn_hidden_size,
        num_hidden_layers=model.num_layers,
        num_attention_heads=model.num_attention_heads,
        num_key_value_heads=model.num_query_groups,
        head_dim=model.head_dim,
        max_position_embeddings=model.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": model.rotary_base},
        rms_norm_eps=model.norm_epsilon,
        tie_word_embeddings=model.tie_word_embeddings,
    )
    torch.manual_seed(0)
    with device:  # random init on the device: on two host cores 0.6B took 27 s to write
        hf = Qwen3ForCausalLM(config)
    # PreTrainedModel.to is functools.wraps(nn.Module.to), typed as the unbound function
    hf.to(DTYPES[model.params_dtype]).save_pretrained(path)  # type: ignore[arg-type]


def rollout(lengths: list[int], vocab_size: int, seed: int) -> list[TrainSample]:
    """Random tokens, a quarter prompt, rewards of either sign."""
    rng = random.Random(seed)
    return [
        TrainSample(rng.choices(range(vocab_size), k=n), n - n // 4, rng.choice((-1.0, 1.0)))
        for n in lengths
    ]


def synchronize(on_gpu: bool) -> None:
    if on_gpu:
        torch.cuda.synchronize()


def measure_peak_flops(device: torch.device) -> tuple[float, str]:
    size, repeats, dtype = MATMUL[device.type]
    a, b = (torch.randn(size, size, device=device, dtype=DTYPES[dtype]) for _ in range(2))
    out = torch.empty_like(a)
    for _ in range(3):
        torch.mm(a, b, out=out)
    best_s = math.inf
    for _ in range(PEAK_TRIALS):  # the best trial: a shared host slows some
        synchronize(device.type == "cuda")
        start = time.perf_counter()
        for _ in range(repeats):
            torch.mm(a, b, out=out)
        synchronize(device.type == "cuda")
        best_s = min(best_s, time.perf_counter() - start)
    return 2 * size**3 * repeats / best_s, f"{dtype} {size}^3 matmul, best of {PEAK_TRIALS}"


def extra_forwards(trainer: Trainer, optimizer_steps: float) -> list[str]:
    """The no-grad forwards train_step runs besides the training forward (see the docstring)."""
    extra = ["reference model"] if trainer.ref_model is not None else []
    reuse = trainer.reuse_logprobs_single_step and optimizer_steps == 1
    if not (reuse and not needs_reference_kl(trainer.algo)):
        extra.append("old-policy logprobs")
    return extra


def local_gib(params: Sequence[torch.Tensor]) -> float:
    """What this process holds of `params`: a DTensor's local shard, a plain tensor whole."""
    local = [p.to_local() if isinstance(p, DTensor) else p for p in params]
    return sum(t.numel() * t.element_size() for t in local) / GIB


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB  # Linux: KiB


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Measured:
    steps: list[dict[str, float]]  # train_step metrics of the timed rollouts
    elapsed_s: float
    extra_forwards: list[str]
    reference_gib: float
    memory_label: str
    memory_gib: float
    reserved_gib: float  # the CUDA caching allocator's peak reservation (0.0 on CPU)
    profile: str = ""


def build_run_trainer(run: RunConfig, plan: Plan) -> Trainer:
    """The plan's trainer, built as a run's rank 0 builds it (one rank, this process)."""
    spec = trainer_spec(
        run, plan, master_addr="127.0.0.1", master_port=free_port(),
        num_threads=torch.get_num_threads(),
    )  # fmt: skip
    trainer: Trainer = build_trainer(spec, 0)
    return trainer


def time_trainer(
    run: RunConfig, plan: Plan, rollouts: list[list[TrainSample]], profile: bool
) -> Measured:
    on_gpu = torch.cuda.is_available()
    free_memory(on_gpu)
    rss_before_gib = peak_rss_gib()
    trainer = build_run_trainer(run, plan)
    try:
        trainer.train_step(rollouts[0])
        synchronize(on_gpu)
        start = time.perf_counter()
        steps = [trainer.train_step(batch) for batch in rollouts[1:]]
        synchronize(on_gpu)
        elapsed_s = time.perf_counter() - start
        extra = extra_forwards(trainer, steps[0]["train/optimizer_steps"])
        ref = [] if trainer.ref_model is None else list(trainer.ref_model.parameters())
        reference_gib = local_gib(ref)
        memory = measured_memory(on_gpu, rss_before_gib)
        # after the timing and the memory peak: it changes neither
        profiled = profile_report(lambda: trainer.train_step(rollouts[1])) if profile else ""
    finally:
        trainer.close()
    return Measured(steps, elapsed_s, extra, reference_gib, *memory, profiled)


def free_memory(on_gpu: bool) -> None:
    gc.collect()
    if on_gpu:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def measured_memory(on_gpu: bool, rss_before_gib: float) -> tuple[str, float, float]:
    if on_gpu:
        allocated = torch.cuda.max_memory_allocated() / GIB
        return "max_memory_allocated GiB", allocated, torch.cuda.max_memory_reserved() / GIB
    rss_gib = peak_rss_gib()
    return f"peak RSS growth GiB (peak RSS {rss_gib:.3f})", rss_gib - rss_before_gib, 0.0


def time_plain_loop(
    hf_dir: Path,
    rollouts: list[list[TrainSample]],
    lr: float,
    recompute: bool,
    max_tokens_per_gpu: int,
) -> PlainResult | None:
    """benchmarks/plain_loop.py on the same checkpoint and rollouts, after the trainer is gone;
    None where it runs out of memory (said on stdout)."""
    free_memory(torch.cuda.is_available())
    try:
        return run_plain_loop(hf_dir, rollouts, lr, recompute, max_tokens_per_gpu)
    except torch.OutOfMemoryError as error:
        print(f"\nplain loop  out of memory at {max_tokens_per_gpu} tokens a "
              f"micro-batch ({str(error).splitlines()[0]})")  # fmt: skip
        return None
