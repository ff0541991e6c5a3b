"""Training tokens/s, MFU and peak memory of the megatron-core trainer on a Qwen3 shape.

    .venv/bin/python benchmarks/megatron_train.py --size tiny --steps 2     # CPU smoke run
    python benchmarks/megatron_train.py --size 0.6b --steps 5               # one GPU
    python benchmarks/megatron_train.py --size 1.7b layout.train.recompute.granularity=selective

Composes conf/ (model qwen3-<size>, recipe grpo_dapo, one device, batch sizes as overrides),
plans it (build_plan), writes a random-weight HF checkpoint of the model YAML's shape (bf16 on
GPU, fp32 on CPU) and times MegatronTrainer.train_step on synthetic rollouts (--samples x
--seq-len tokens, a quarter prompt; dynamic batching): one warm-up rollout, then --steps.

MFU = model FLOP/s / peak FLOP/s measured here (square matmuls: bf16 8192^3 on GPU, fp32
1024^3 on CPU; best trial). Forward FLOPs per token = 2 N + 4 L a s (PaLM, Chowdhery et al.
2022, app. B; Megatron, Narayanan et al. 2021): N the decoder-layer parameters plus the V x h
output projection (a matmul even when tied; the input embedding is a lookup), L layers, a the
attention width heads x head_dim (2048 for Qwen3-0.6B, hidden 1024), s the sample length (full
attention, not halved for causality). Training is 3 forwards: 6 N + 12 L a s. Each no-grad
forward of train_step adds 1: the reference model's whenever it is loaded (grpo_dapo's
use_kl_loss loads it even at kl_loss_coef 0), and the old-policy logprobs unless the rollout is
one optimizer step (--global-batch = --samples, the default) and no advantage needs the
reference KL: then the training forward's own logprobs serve. Recompute is not counted.

Memory: torch.cuda.max_memory_allocated against the plan's per-GPU training estimate
(rlpost.plan.memory.estimate_train) less its context/workspace overhead, which the allocator
does not see; on CPU the growth of peak RSS from trainer construction on.
"""

from __future__ import annotations

import argparse
import gc
import math
import random
import resource
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlpost.algo.advantages import needs_reference_kl  # noqa: E402
from rlpost.backends.megatron.trainer import MegatronTrainer  # noqa: E402
from rlpost.config.loader import compose_run_config  # noqa: E402
from rlpost.plan import Plan, build_plan  # noqa: E402
from rlpost.plan.params import count_params  # noqa: E402
from rlpost.schema import ModelConfig, RunConfig  # noqa: E402
from rlpost.types import TrainSample  # noqa: E402

GIB = 1024**3
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
MATMUL = {"cuda": (8192, 20, "bf16"), "cpu": (1024, 4, "fp32")}  # size, repeats, dtype
PEAK_TRIALS = 5


@dataclass(frozen=True)
class Preset:
    model: str  # conf/model/<model>.yaml
    seq_len: int
    samples: int
    max_tokens_per_gpu: int


PRESETS = {
    "tiny": Preset("qwen3-tiny", 128, 16, 1024),
    "0.6b": Preset("qwen3-0.6b", 4096, 32, 16384),
    "1.7b": Preset("qwen3-1.7b", 4096, 32, 16384),
}


def compose_run(args: argparse.Namespace, hf_dir: Path, dtype: str) -> RunConfig:
    prompt = args.seq_len // 4
    response = args.seq_len - prompt
    group = math.gcd(args.samples, 8)
    overrides = [
        f"model={PRESETS[args.size].model}", "recipe=grpo_dapo", f"hardware={args.hardware}",
        "hardware.gpus_per_node=1", "layout.train.num_gpus=1",
        f"model.hf_checkpoint={hf_dir}", f"model.params_dtype={dtype}",
        "model.load=null", f"model.ref_load={hf_dir}",  # never a torch_dist left on the machine
        f"recipe.data.max_prompt_len={prompt}", f"recipe.rollout.max_response_len={response}",
        f"recipe.eval.max_response_len={response}",
        f"recipe.rollout.batch_size={args.samples // group}",
        f"recipe.rollout.n_samples_per_prompt={group}",
        f"recipe.train.global_batch_size={args.global_batch or args.samples}",
        f"recipe.train.max_tokens_per_gpu={args.max_tokens_per_gpu}", *args.overrides,
    ]  # fmt: skip
    return compose_run_config(overrides)[0]


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
        rope_theta=model.rotary_base,
        rms_norm_eps=model.norm_epsilon,
        tie_word_embeddings=model.tie_word_embeddings,
    )
    torch.manual_seed(0)
    with device:  # random init on the device: on two host cores 0.6B took 27 s to write
        hf = Qwen3ForCausalLM(config)
    hf.to(DTYPES[model.params_dtype]).save_pretrained(path)


def rollout(count: int, seq_len: int, vocab_size: int, seed: int) -> list[TrainSample]:
    rng = random.Random(seed)
    response = seq_len - seq_len // 4
    rewards = [rng.choice((-1.0, 1.0)) for _ in range(count)]
    return [TrainSample(rng.choices(range(vocab_size), k=seq_len), response, r) for r in rewards]


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


def forward_flops_per_token(model: ModelConfig, seq_len: int) -> float:
    matmul_params = count_params(model).layers + model.vocab_size * model.hidden_size
    attention_width = model.num_attention_heads * model.head_dim
    return 2 * matmul_params + 4 * model.num_layers * attention_width * seq_len


def extra_forwards(trainer: MegatronTrainer, optimizer_steps: float) -> list[str]:
    """The no-grad forwards train_step runs besides the training forward (see the docstring)."""
    extra = ["reference model"] if trainer.ref_model is not None else []
    reuse = trainer.reuse_logprobs_single_step and optimizer_steps == 1
    if not (reuse and not needs_reference_kl(trainer.algo)):
        extra.append("old-policy logprobs")
    return extra


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


def time_trainer(run: RunConfig, plan: Plan, args: argparse.Namespace) -> Measured:
    on_gpu = torch.cuda.is_available()
    gc.collect()
    if on_gpu:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    rss_before_gib = peak_rss_gib()
    recipe, vocab = run.recipe, run.model.vocab_size
    trainer = MegatronTrainer(
        run.model, recipe.algo, recipe.optim, recipe.train, plan.parallel,
        rollout_temperature=recipe.rollout.temperature, master_port=free_port(),
    )  # fmt: skip
    try:
        rollouts = [rollout(args.samples, args.seq_len, vocab, s) for s in range(args.steps + 1)]
        trainer.train_step(rollouts[0])
        synchronize(on_gpu)
        start = time.perf_counter()
        steps = [trainer.train_step(batch) for batch in rollouts[1:]]
        synchronize(on_gpu)
        elapsed_s = time.perf_counter() - start
        extra = extra_forwards(trainer, steps[0]["train/optimizer_steps"])
        ref = [] if trainer.ref_model is None else list(trainer.ref_model.parameters())
        reference_gib = sum(p.numel() * p.element_size() for p in ref) / GIB
    finally:
        trainer.close()
    if on_gpu:
        memory = ("max_memory_allocated GiB", torch.cuda.max_memory_allocated() / GIB)
    else:
        rss_gib = peak_rss_gib()
        memory = (f"peak RSS growth GiB (peak RSS {rss_gib:.3f})", rss_gib - rss_before_gib)
    return Measured(steps, elapsed_s, extra, reference_gib, *memory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(PRESETS), default="0.6b")
    parser.add_argument("--steps", type=int, default=5, help="timed rollouts after one warm-up")
    parser.add_argument("--seq-len", type=int, help="tokens per sample (preset by --size)")
    parser.add_argument("--samples", type=int, help="samples per rollout (preset by --size)")
    parser.add_argument("--global-batch", type=int, help="samples per optimizer step (--samples)")
    parser.add_argument("--max-tokens-per-gpu", type=int, help="dynamic batch bound (preset)")
    parser.add_argument("--hardware", help="conf/hardware profile (h200x1 on GPU, cpu on CPU)")
    parser.add_argument("overrides", nargs="*", help="more Hydra overrides, applied last")
    args = parser.parse_args()
    preset = PRESETS[args.size]
    args.seq_len = args.seq_len or preset.seq_len
    args.samples = args.samples or preset.samples
    args.max_tokens_per_gpu = args.max_tokens_per_gpu or preset.max_tokens_per_gpu
    on_gpu = torch.cuda.is_available()
    args.hardware = args.hardware or ("h200x1" if on_gpu else "cpu")

    peak = measure_peak_flops(torch.device("cuda" if on_gpu else "cpu"))
    with tempfile.TemporaryDirectory() as tmp:
        run = compose_run(args, Path(tmp) / "hf", "bf16" if on_gpu else "fp32")
        plan = build_plan(run)
        write_checkpoint(run.model, Path(tmp) / "hf", torch.device("cuda" if on_gpu else "cpu"))
        measured = time_trainer(run, plan, args)
    report(args, plan, run.model, peak, measured)


def report(
    args: argparse.Namespace,
    plan: Plan,
    model: ModelConfig,
    peak: tuple[float, str],
    measured: Measured,
) -> None:
    steps = measured.steps
    tokens_per_s = args.samples * args.seq_len * len(steps) / measured.elapsed_s
    extra = measured.extra_forwards
    forward = forward_flops_per_token(model, args.seq_len)
    flops_per_token = (3 + len(extra)) * forward
    achieved = tokens_per_s * flops_per_token
    mem, par = plan.memory.train, plan.parallel
    mean = {k: sum(s[k] for s in steps) / len(steps) for k in steps[0]}
    rows = [
        ("model", f"{model.name} ({count_params(model).total / 1e6:,.1f}M params, "
                  f"{model.params_dtype}), random weights"),
        ("layout", f"tp {par.tp} pp {par.pp} cp {par.cp} dp {par.dp}, recompute {par.recompute}"),
        ("rollout", f"{args.samples} samples x {args.seq_len} tokens, "
                    f"{mean['train/optimizer_steps']:.0f} optimizer step(s), "
                    f"{mean['train/micro_batches']:.0f} micro-batches"),
        ("packing efficiency", f"{mean.get('train/packing_efficiency', math.nan):.3f}"),
        ("timed rollouts (after 1 warm-up)", f"{len(steps)}"),
        ("step time s (mean; no-grad forwards)",
         f"{measured.elapsed_s / len(steps):.3f} ({mean['train/prepare_time_s']:.3f})"),
        ("train tokens/s", f"{tokens_per_s:,.1f}"),
        ("forwards per token", f"3 (train) + {len(extra)} ({', '.join(extra) or 'none'})"),
        ("model GFLOP per token", f"{flops_per_token / 1e9:.4f} (forward {forward / 1e9:.4f})"),
        ("measured peak TFLOP/s", f"{peak[0] / 1e12:.3f} ({peak[1]})"),
        ("achieved TFLOP/s", f"{achieved / 1e12:.3f}"),
        ("MFU", f"{achieved / peak[0]:.3f}"),
        (measured.memory_label, f"{measured.memory_gib:.3f}"),
        ("plan train estimate GiB/GPU", f"{mem.total_gib:.3f} (weights {mem.weights_gib:.3f}, "
         f"grads {mem.grads_gib:.3f}, optimizer {mem.optimizer_gib:.3f}, activations "
         f"{mem.activations_gib:.3f}, logits {mem.logits_gib:.3f}, overhead "
         f"{mem.overhead_gib:.3f})"),
        ("reference weights GiB (not estimated)", f"{measured.reference_gib:.3f}"),
        ("measured / (estimate - overhead)",
         f"{measured.memory_gib / (mem.total_gib - mem.overhead_gib):.3f}"),
    ]  # fmt: skip
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name.ljust(width)}  {value}")


if __name__ == "__main__":
    main()
